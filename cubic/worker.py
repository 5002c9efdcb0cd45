"""The pull loop every runner uses: lease, run, heartbeat, report.

A worker keeps up to ``parallel`` trials of one study in flight. It leases only what it has
room for (leasing is idempotent, so after a restart it gets its own running trials back),
extends every lease from a background thread, and reports each outcome once. On SIGTERM or
SIGINT it stops leasing, lets running jobs finish within a grace period, and cancels and
releases the rest so that another worker picks them up at once instead of after the lease
expires.

It rides through outages of the service: every call is retried within the client's outage
budget (:mod:`cubic.retry`), and each outcome is written to a local :class:`~cubic.outbox.
Outbox` before it is reported, so a result computed while the service was away, or before
the worker was killed, is reported when it (or a new run of it) reaches the service again.
Only once the budget is spent does it give up, keeping what it could not report.

In a study that stops slow trials early (its ``pruning`` section), it sends each running
job's progress (what the runner sees of it: steps and step times) on a heartbeat at most
every ``progress_s`` seconds; when the service's pruner answers that the trial can no longer
matter, it cancels the job through its runner and reports the trial ``pruned``, with the
evidence and what the job had measured (its partial throughput is data for the search).
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cubic.client import CubicClient
from cubic.errors import Conflict, CubicError, InvalidInput, NotFound, StorageError
from cubic.outbox import Outbox, default_outbox
from cubic.outcome import Outcome
from cubic.pruning import PROGRESS_REPORT_S, Verdict
from cubic.retry import lease_wait
from cubic.runners.base import Runner, TrialJob

log = logging.getLogger("cubic.worker")

FINAL_STUDY_STATES = frozenset({"completed", "stopped", "archived"})


@dataclass(slots=True)
class _Active:
    lease: dict[str, Any]
    handle: Any
    poll_errors: int = 0
    sent_steps: int = -1  # the steps of the last progress the service has seen
    next_progress: float = 0.0  # monotonic time before which no progress is sent


MAX_POLL_ERRORS = 20  # consecutive failures to ask a scheduler about a job before giving up


class Worker:
    """Runs trials of one study through a runner until the study has nothing left."""

    def __init__(
        self,
        client: CubicClient,
        study_id: int,
        runner: Runner,
        *,
        worker_id: str | None = None,
        parallel: int = 1,
        lease_seconds: float = 300.0,
        poll_s: float = 0.05,
        idle_s: float = 0.5,
        grace_s: float = 30.0,
        on_report: Callable[[dict[str, Any], Outcome], None] | None = None,
        outbox: Outbox | Path | str | None = None,
        handle_signals: bool = True,
        leave_states: frozenset[str] = FINAL_STUDY_STATES,
        progress_s: float = PROGRESS_REPORT_S,
        cancel_wait_s: float = 30.0,
    ) -> None:
        """``handle_signals``: SIGTERM/SIGINT wind this worker down (off when a caller owns
        them); ``leave_states``: study states in which an idle worker returns;
        ``progress_s``: least seconds between two progress reports of a trial (a study with
        pruning on); ``cancel_wait_s``: how long a pruned trial's cancelled job may take to
        end before the trial is reported without what it measured last."""
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.client = client
        self.study_id = study_id
        self.runner = runner
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.parallel = parallel
        self.lease_seconds = lease_seconds
        self.poll_s = poll_s
        self.idle_s = idle_s
        self.grace_s = grace_s
        self.on_report = on_report
        self.handle_signals = handle_signals
        self.leave_states = leave_states
        self.progress_s = progress_s
        self.cancel_wait_s = cancel_wait_s
        self._pruning = False  # the study stops slow trials early
        if outbox is None:  # one folder per service: study and trial ids are its own
            outbox = default_outbox() / re.sub(r"[^A-Za-z0-9.-]+", "_", client.url)
        self.outbox = outbox if isinstance(outbox, Outbox) else Outbox(outbox)
        self._gone = False  # the service stayed away beyond the client's outage budget
        self.stopping = threading.Event()
        self._active: dict[int, _Active] = {}
        self._lock = threading.Lock()
        self.reported = 0
        self._job_spec: dict[str, Any] = {}
        self._objectives: tuple[str, ...] = ()
        self._study_state: str | None = None  # as the last lease answered
        self._next_lease = 0.0  # monotonic time before which asking again is pointless
        self._short_leases = 0  # leases in a row that came back short
        self._rng = random.Random()

    def stop(self) -> None:
        """Ask the loop to wind down (what SIGTERM does)."""
        self.stopping.set()

    def _install_signals(self) -> dict[int, Any]:
        """Make SIGTERM/SIGINT wind the loop down; returns the handlers to restore."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, lambda *_: self.stop())
        return old

    def run(self, max_trials: int | None = None) -> int:
        """Work until the study is finished, ``max_trials`` are reported, or a stop."""
        previous = self._install_signals() if self.handle_signals else {}
        try:
            return self._run(max_trials)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self, max_trials: int | None) -> int:
        study = self.client.get_study(self.study_id)
        spec = study["spec"]
        self.runner.check(spec)
        workload, timeout = spec["workload"], float(spec.get("trial_timeout_s", 3600.0))
        self._job_spec = spec.get("job") or {}
        self._objectives = tuple(o["metric"] for o in spec.get("objectives", []))
        self._pruning = bool((spec.get("pruning") or {}).get("enabled"))
        beat = threading.Thread(target=self._heartbeats, daemon=True, name="cubic-heartbeat")
        beat.start()
        try:
            for lease, outcome in self.outbox.pending(self.study_id):  # an earlier run's
                log.info("trial %s: reporting the outcome an earlier run kept", lease["id"])
                self._report(lease, outcome)
                self._give_up_if_gone()
            while not self.stopping.is_set():
                if max_trials is not None and self.reported >= max_trials:
                    break
                leased = self._lease_more(workload, timeout, max_trials)
                finished = self._collect()
                self._give_up_if_gone()
                if not self._active and not leased and not finished:
                    state = self._study_state or self.client.get_study(self.study_id)["state"]
                    if state in self.leave_states:
                        break
                    wait = max(self._next_lease - time.monotonic(), 0.0) or self.idle_s
                    self.stopping.wait(min(wait, self.idle_s))
                elif not finished:
                    self.stopping.wait(self.poll_s)
        except StorageError:
            self._gone = True
            log.error(
                "the service stayed unreachable beyond the outage budget; outcomes not yet "
                "reported are kept in %s",
                self.outbox.path,
            )
            raise
        finally:
            self._shutdown()
            self.stopping.set()
            beat.join(timeout=5)
        return self.reported

    def _give_up_if_gone(self) -> None:
        if self._gone:
            raise StorageError(f"cannot report to cubic at {self.client.url}")

    def _lease_more(self, workload: dict[str, Any], timeout: float, max_trials: int | None) -> int:
        room = self.parallel - len(self._active)
        if max_trials is not None:
            room = min(room, max_trials - self.reported - len(self._active))
        self._study_state = None
        if room <= 0 or time.monotonic() < self._next_lease:
            return 0
        answer = self.client.lease_batch(
            self.study_id, self.worker_id, len(self._active) + room, self.lease_seconds
        )
        self._study_state = answer.get("study_state")
        hint = answer.get("retry_after_s")
        # Fewer than asked were waiting: the service is proposing the next ones.
        self._short_leases = self._short_leases + 1 if hint else 0
        self._next_lease = 0.0
        if hint:
            self._next_lease = time.monotonic() + lease_wait(
                float(hint), self._short_leases, self._rng
            )
        new = 0
        for t in answer["trials"]:
            if t["id"] in self._active:
                continue  # our own running trial, handed back by the idempotent lease
            job = TrialJob(
                trial_id=t["id"],
                study_id=self.study_id,
                number=t["number"],
                attempt=t["attempt"],
                params=t["params"],
                workload=workload,
                timeout_s=timeout,
                job=self._job_spec,
                objectives=self._objectives,
            )
            try:
                handle = self.runner.submit(job)
            except Exception as exc:  # the scheduler refused it: retried like a failed job
                log.warning("trial %s: submit failed: %s", t["id"], exc)
                self._report(t, Outcome("failed", error=f"submit failed: {exc}"[:4000]))
                continue
            log.info("trial %s: started %s", t["id"], self.runner.describe(handle))
            with self._lock:
                self._active[t["id"]] = _Active(t, handle)
            new += 1
        return new

    def _collect(self) -> int:
        done = 0
        for tid, a in list(self._active.items()):
            try:
                outcome = self.runner.poll(a.handle)
                a.poll_errors = 0
            except Exception as exc:  # the scheduler is briefly unreachable: ask again later
                a.poll_errors += 1
                log.warning("trial %s: poll failed (%d): %s", tid, a.poll_errors, exc)
                if a.poll_errors < MAX_POLL_ERRORS:
                    continue
                self._cancel_quietly(a)
                outcome = Outcome("failed", error=f"lost track of the job: {exc}"[:4000])
            if outcome is None and self._pruning:
                outcome = self._judged(tid, a)
            if outcome is None:
                continue
            self._report(a.lease, outcome)
            with self._lock:
                self._active.pop(tid, None)
            done += 1
        return done

    def _judged(self, tid: int, a: _Active) -> Outcome | None:
        """Send the job's progress when it has moved on (at most every ``progress_s``); if
        the pruner stops the trial, cancel the job and return its ``pruned`` outcome."""
        now = time.monotonic()
        if now < a.next_progress:
            return None
        a.next_progress = now + self.progress_s  # a file on a shared file system, say
        try:
            progress = self.runner.progress(a.handle)
        except Exception as exc:  # progress is advice: the job goes on
            log.warning("trial %s: cannot read its progress: %s", tid, exc)
            return None
        if progress is None or progress.steps <= a.sent_steps:
            return None
        try:
            answer = self.client.heartbeat(
                tid, a.lease["lease_token"], self.lease_seconds, progress=progress.to_dict()
            )
        except CubicError as exc:  # a lost lease is the heartbeat thread's to handle
            log.warning("trial %s: progress not sent: %s", tid, exc)
            return None
        a.sent_steps = progress.steps
        prune = answer.get("prune") if isinstance(answer, dict) else None
        if not prune:
            return None
        fields = {k: prune[k] for k in Verdict.__dataclass_fields__ if k in prune}
        verdict = Verdict(**{**fields, "prune": True})
        log.info("trial %s: %s", tid, verdict.reason)
        return self._prune(a, verdict)

    def _prune(self, a: _Active, verdict: Verdict) -> Outcome:
        """Cancel a pruned trial's job, wait (at most ``cancel_wait_s``) for it to end, and
        make its outcome: ``pruned`` with the evidence and what the job measured."""
        self._cancel_quietly(a)
        ended: Outcome | None = None
        deadline = time.monotonic() + self.cancel_wait_s
        while ended is None and time.monotonic() < deadline:
            try:
                ended = self.runner.poll(a.handle)
            except Exception as exc:
                log.warning("trial %s: poll after cancel failed: %s", a.lease["id"], exc)
            if ended is None:
                time.sleep(self.poll_s)
        if ended is not None and ended.state in ("complete", "infeasible"):
            return ended  # it ended on its own before the cancel took: that is its outcome
        metrics: dict[str, Any] = {"throughput": verdict.throughput}
        for name in self._objectives:
            metrics[name] = verdict.throughput
        metrics["timed_steps"] = verdict.timed_steps
        metrics.update((ended.metrics if ended is not None else None) or {})
        metrics.update(verdict.metrics())
        return Outcome(
            "pruned",
            metrics=metrics,
            error=verdict.reason[:4000],
            log_tail=ended.log_tail if ended is not None else None,
        )

    def _report(self, lease: dict[str, Any], outcome: Outcome) -> None:
        """Keep the outcome on disk, report it, and forget it once the service answered
        (a :class:`StorageError` leaves it kept: the service is away)."""
        self.outbox.put(self.study_id, lease, outcome)
        if self._gone:
            return
        try:
            self.client.report(
                lease["id"],
                lease["lease_token"],
                outcome.state,
                metrics=outcome.metrics,
                error=outcome.error,
                log_tail=outcome.log_tail,
            )
        except (Conflict, NotFound) as exc:
            log.warning("trial %s: report refused (%s); the lease was lost", lease["id"], exc)
            self.outbox.done(self.study_id, lease["id"])
            return
        except StorageError:  # kept on disk; the loop gives up (see ``_run``)
            self._gone = True
            return
        self.outbox.done(self.study_id, lease["id"])
        log.info("trial %s: reported %s", lease["id"], outcome.state)
        self.reported += 1
        if self.on_report is not None:
            self.on_report(lease, outcome)

    def _cancel_quietly(self, a: _Active) -> None:
        try:
            self.runner.cancel(a.handle)
        except Exception as exc:
            log.warning("trial %s: cancel failed: %s", a.lease["id"], exc)

    def _heartbeats(self) -> None:
        period = max(0.05, self.lease_seconds / 3.0)
        while not self.stopping.wait(period):
            with self._lock:
                active = list(self._active.items())
            for tid, a in active:
                try:
                    self.client.heartbeat(tid, a.lease["lease_token"], self.lease_seconds)
                except Conflict:
                    log.warning("trial %s: lease lost; cancelling its job", tid)
                    self.runner.cancel(a.handle)
                    with self._lock:
                        self._active.pop(tid, None)
                except CubicError as exc:  # the service is briefly unreachable: retry later
                    log.warning("trial %s: heartbeat failed: %s", tid, exc)

    def _shutdown(self) -> None:
        """Let running jobs finish within the grace period, then cancel and release."""
        deadline = time.monotonic() + self.grace_s
        while self._active and time.monotonic() < deadline:
            if not self._collect():
                time.sleep(self.poll_s)
        for tid, a in list(self._active.items()):
            self.runner.cancel(a.handle)
            if not self._gone:
                try:
                    self.client.release(tid, a.lease["lease_token"])
                except CubicError as exc:
                    log.warning("trial %s: release failed: %s", tid, exc)
            self._active.pop(tid, None)


class StudyLoop:
    """Works on every running study of a service in turn, oldest first, waiting while none
    runs, until stopped: a worker of a shared pool (a container scaled by its engine) needs
    no study id. A paused study is left for the next running one; a study the runner
    refuses (a job it cannot run) is skipped with a warning."""

    def __init__(
        self,
        client: CubicClient,
        runner: Runner,
        *,
        idle_s: float = 2.0,
        **worker_options: Any,
    ) -> None:
        self.client = client
        self.runner = runner
        self.idle_s = idle_s
        self.worker_options = worker_options
        self.stopping = threading.Event()
        self.reported = 0
        self._current: Worker | None = None
        self._refused: set[int] = set()

    def stop(self) -> None:
        """Wind down: the current study's worker finishes or releases its trials."""
        self.stopping.set()
        current = self._current
        if current is not None:
            current.stop()

    def run(self, max_trials: int | None = None) -> int:
        """Work until stopped (SIGTERM, SIGINT) or ``max_trials`` are reported."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop())
        try:
            while not self.stopping.is_set():
                if max_trials is not None and self.reported >= max_trials:
                    break
                study_id = self._next_study()
                if study_id is None:
                    self.stopping.wait(self.idle_s)
                    continue
                self._work_on(study_id, None if max_trials is None else max_trials - self.reported)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.reported

    def _next_study(self) -> int | None:
        page = self.client.list_studies(state="running", limit=100)
        for study in page["items"]:
            if study["id"] not in self._refused:
                return int(study["id"])
        return None

    def _work_on(self, study_id: int, max_trials: int | None) -> None:
        worker = Worker(
            self.client,
            study_id,
            self.runner,
            handle_signals=False,
            leave_states=FINAL_STUDY_STATES | {"paused"},
            **self.worker_options,
        )
        self._current = worker
        if self.stopping.is_set():  # a stop that came before the worker existed
            worker.stop()
        log.info("study %d: working on it", study_id)
        try:
            self.reported += worker.run(max_trials=max_trials)
        except (InvalidInput, NotFound) as exc:  # the runner refused it, or it went away
            log.warning("study %d: skipped: %s", study_id, exc)
            self._refused.add(study_id)
        finally:
            self._current = None
        log.info("study %d: left it (%d trials reported in all)", study_id, self.reported)

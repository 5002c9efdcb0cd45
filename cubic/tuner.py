"""The study lifecycle: create, ask (propose and lease), heartbeat, tell (report), reap.

The tuner is the only place where the store and the strategies meet. It is a black box to the
jobs and they are black boxes to it: it never runs the simulator, it only reads the metrics a
job reports.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cubic.errors import Conflict, CubicError, InvalidInput
from cubic.objectives import (
    better,
    check_metrics,
    job_gpus,
    missing_objectives,
    objective_values,
    violations,
)
from cubic.outcome import Outcome
from cubic.pruning import Progress, Verdict
from cubic.space import SpaceError
from cubic.store import Store
from cubic.store.objects import Study, StudyCounts, StudyState, Trial, TrialState
from cubic.strategies import Strategy, config_key, make_strategy, strategy_class
from cubic.study import ResolvedStudy, StudySpec
from cubic.workload import Workload

DEFAULT_LEASE_S = 300.0
#: The most finished trials of other studies a transfer history holds (the newest).
PRIOR_ROWS = 10_000
MAX_CACHED_STRATEGIES = 32
EVENT_LAG = 1000
"""How far back (in event ids) a history refresh re-reads: a transaction may commit after a
later one, so the newest event seen is not a safe place to start from."""
MAX_READ_HISTORIES = 4
"""Histories kept for studies this process only reads (best, history: the dashboard), the
most recently read, beside those of the strategies it keeps."""
FULL_REREAD_S = 300.0
"""A kept history is read in full again at this interval, whatever the refreshes missed."""
RETRY_AFTER_S = 0.25
"""What a lease that found no waiting trial tells the worker to wait, before this process
has timed a proposal round."""
RETRY_AFTER_RANGE_S = (0.1, 2.0)
"""Bounds of that hint once rounds are timed: it is a typical round's duration, since the
lease has just woken the proposer and a round is what the worker waits for."""
ROUND_EWMA = 0.2
"""Weight of the newest round in the running average of proposal rounds' durations."""
RETRY_AT_CAP_S = 1.0
"""... and when the study already runs its ``max_parallel`` trials."""
PACE_WINDOW_S = 30.0
"""How far back a study's pace (slots freed per second) is measured."""
AHEAD_ROUNDS = 2.0
"""A learning strategy's background proposer keeps waiting, beyond the parallel room, the
trials that free up during this many of its rounds (see :class:`_Pace`)."""

STUDY_TRANSITIONS: dict[StudyState, frozenset[StudyState]] = {
    StudyState.PAUSED: frozenset({StudyState.RUNNING}),
    StudyState.RUNNING: frozenset({StudyState.PAUSED}),
    StudyState.STOPPED: frozenset({StudyState.RUNNING, StudyState.PAUSED}),
    StudyState.ARCHIVED: frozenset(set(StudyState) - {StudyState.ARCHIVED}),
}
"""For each state a study can be asked to take, the states it may come from (archived is
final; only a paused study resumes)."""
_IMPORT_STATES = ("complete", "infeasible", "failed")


@dataclass(slots=True)
class _History:
    """A study's trials as this process last read them, in number order."""

    trials: dict[int, Trial]
    mark: int  # the newest event id read
    read_at: float  # when it was last read in full (monotonic)
    #: Objective values of finished trials by trial id (a finished trial never changes), so
    #: that the best and the front of a large study are not scored again at every request.
    values: dict[int, list[float] | None] = field(default_factory=dict)


@dataclass(slots=True)
class _Pace:
    """How fast a study's running slots free up, and how long a proposal round for it takes,
    as this process's background proposer measures them.

    A learning strategy proposes for the free slots only, so that each proposal sees every
    result in so far; but a worker that reports and leases at once then finds nothing
    waiting until the next round has run, and waits (its GPU idle) for a round each trial.
    The trials that free up during a round or two are therefore proposed ahead: none when
    trials run for minutes or hours (a round's worth of slots rounds down to none), a few
    when they end every few milliseconds."""

    active_after: int | None = None  # the study's active trials after the latest round
    freed: deque[tuple[float, int]] = field(default_factory=deque)  # (when, slots freed)
    round_s: float | None = None  # running average of its rounds' durations
    clock: Callable[[], float] = time.monotonic

    def observe(self, active: int) -> None:
        """A round starts with ``active`` trials waiting or running."""
        now = self.clock()
        if self.active_after is not None:
            self.freed.append((now, max(0, self.active_after - active)))
        self.active_after = active
        while len(self.freed) > 1 and self.freed[1][0] < now - PACE_WINDOW_S:
            self.freed.popleft()  # the oldest kept marks where the window starts

    def ahead(self, limit: int) -> int:
        """The slots expected to free up during :data:`AHEAD_ROUNDS` rounds, at most
        ``limit``."""
        if self.round_s is None or len(self.freed) < 2:
            return 0
        span = self.clock() - self.freed[0][0]
        rate = sum(f for _, f in list(self.freed)[1:]) / max(span, 1e-3)
        return min(limit, math.floor(AHEAD_ROUNDS * rate * self.round_s))

    def done(self, active: int, seconds: float) -> None:
        """A round left ``active`` trials active and took ``seconds``."""
        self.active_after = active
        r = self.round_s
        self.round_s = seconds if r is None else (1 - ROUND_EWMA) * r + ROUND_EWMA * seconds


@dataclass(frozen=True, slots=True)
class Lease:
    """What a lease hands a worker: its trials, the study's state, and, when it found no
    waiting trial to hand out, how long to wait before asking again."""

    trials: list[Trial]
    study_state: StudyState
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Best:
    """The best complete trial of a study, and how it compares with the baseline."""

    trial: Trial
    value: float
    baseline: Trial | None
    baseline_value: float | None

    minimize: bool = False

    @property
    def speedup(self) -> float | None:
        """How many times better than the baseline (a ratio above 1 is an improvement)."""
        if not self.baseline_value or not self.value:
            return None
        if self.minimize:
            return self.baseline_value / self.value
        return self.value / self.baseline_value


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """A trial on a study's Pareto front and its objective values (in the spec's order)."""

    trial: Trial
    values: list[float]


@dataclass(frozen=True, slots=True)
class ParetoFront:
    """A study's non-dominated trials, best first by the first objective, out of
    ``n_measured`` distinct configs measured within the constraints."""

    points: list[ParetoPoint]
    metrics: list[str]
    directions: list[str]
    n_measured: int


class Tuner:
    """Study operations over one store. Safe to use from many threads and processes."""

    def __init__(
        self,
        store: Store,
        *,
        background_fit: bool = False,
        background_propose: bool = False,
    ) -> None:
        """``background_fit``: a background thread (the service's) calls :meth:`prefit` as
        trials finish, so that a lease usually finds the study's model already fitted. Either
        way a strategy proposes with its own per-study model, fitted as in the benchmark: a
        round that finds it stale fits it first rather than propose without it.

        ``background_propose``: a background thread calls :meth:`fill` (the service's), so
        a lease only pops waiting trials and never runs a strategy; without it a lease that
        finds none proposes them itself. Study creation then only wakes the proposer, which
        prepares the first batch: the request stays milliseconds whatever the space."""
        self.store = store
        self.background_fit = background_fit
        self.background_propose = background_propose
        self.wake = threading.Event()  # set when a study may need proposals
        self._histories: dict[int, _History] = {}
        self._history_guard = threading.Lock()
        self._resolved: dict[int, ResolvedStudy] = {}
        self._strategies: dict[int, Strategy] = {}
        self._priors: dict[str, tuple[float, list[tuple[Workload, Trial]]]] = {}
        self._local_locks: dict[int, threading.Lock] = {}
        # Study -> its count of proposals right after this process's latest round.
        self._proposed_to: dict[int, int] = {}
        self._pace: dict[int, _Pace] = {}  # studies this process proposes for in background
        self._local_guard = threading.Lock()
        self.round_s: float | None = None  # running average of background rounds' time
        self.claims = store.claims()  # the studies this process proposes for (to_fill)

    def observe_round(self, seconds: float) -> None:
        """Time one background proposal round: leases that come back short then tell the
        worker to wait about one round, not a fixed time, so that workers of a study whose
        rounds take seconds do not poll many times in each, nor wait long for quick ones."""
        r = self.round_s
        self.round_s = seconds if r is None else (1 - ROUND_EWMA) * r + ROUND_EWMA * seconds

    def retry_after(self) -> float:
        """How long a worker whose lease came back short should wait (see :meth:`lease`)."""
        if self.round_s is None:
            return RETRY_AFTER_S
        lo, hi = RETRY_AFTER_RANGE_S
        return min(hi, max(lo, self.round_s))

    @contextlib.contextmanager
    def _proposing(self, study_id: int) -> Iterator[None]:
        """Hold the study's proposal lock: first this process's, then the store's.

        Threads of one process queue on a plain lock before the store's lock, which on
        PostgreSQL holds a connection while it waits: without the first, a burst of leases
        for one study could take every pooled connection and starve the lock's holder.
        """
        with self._proposing_if(study_id, wait=True) as held:
            assert held
            yield

    @contextlib.contextmanager
    def _proposing_if(self, study_id: int, *, wait: bool) -> Iterator[bool]:
        """The study's proposal lock (see :meth:`_proposing`) if free now, or after waiting
        when ``wait``; yields whether it is held."""
        with self._local_guard:
            local = self._local_locks.setdefault(study_id, threading.Lock())
        if not local.acquire(blocking=wait):
            yield False
            return
        try:
            with self.store.try_study_lock(study_id, wait=wait) as held:
                yield held
        finally:
            local.release()

    # studies --------------------------------------------------------------------------
    def create_study(
        self, spec: StudySpec, base: Path | None = None, owner_token_id: int | None = None
    ) -> Study:
        """Store a study (workload and space inlined) and enqueue its baseline first;
        ``owner_token_id`` is the API token that submitted it."""
        resolved = spec.resolve(base)
        if resolved.spec.strategy.name == "grid":
            if not resolved.space.is_finite:
                raise InvalidInput("strategy 'grid' needs a finite space", field="strategy.name")
            from cubic.strategies.grid import grid_points

            grid_points(resolved.space, resolved.context)  # refused here, not at the first lease
        if not spec.allow_unfit:
            _refuse_unfit(resolved)
        stored = resolved.spec.model_dump(mode="json")
        study = self.store.create_study(
            spec.name,
            stored,
            resolved.workload.kind,
            max_attempts=spec.max_attempts,
            owner_token_id=owner_token_id,
        )
        self._resolved[study.id] = resolved
        # The baseline goes in under the proposal lock, so that a background proposer that
        # sees the new study does not propose a whole batch beside it.
        with self._proposing(study.id):
            if spec.baseline is not None:
                params = {
                    k: v for k, v in spec.baseline.items() if k not in resolved.space.derived_names
                }
                self.store.add_trials(
                    study.id, [resolved.space.complete(params, resolved.context)], source="baseline"
                )
        if self.background_propose:  # the proposer prepares its first batch now, off the
            self.wake.set()  # request path: a lease before it is ready is told to come back
        return study

    def resolved(self, study_id: int) -> ResolvedStudy:
        """The study's spec with its workload and space loaded (cached per process)."""
        if study_id not in self._resolved:
            study = self.store.get_study(study_id)
            self._resolved[study_id] = ResolvedStudy.from_stored(study.spec)
        return self._resolved[study_id]

    def enqueue(self, study_id: int, configs: list[dict[str, Any]]) -> list[Trial]:
        """Add user-given configs (today's production config, say), validated against the space."""
        r = self.resolved(study_id)
        done = [self._checked_config(r, cfg, f"configs.{i}") for i, cfg in enumerate(configs)]
        return self.store.add_trials(study_id, done, source="enqueued")

    @staticmethod
    def _checked_config(r: ResolvedStudy, cfg: dict[str, Any], field: str) -> dict[str, Any]:
        """``cfg`` completed (inactive knobs at their default, derived values) and validated.

        A key that is not a knob of the space is refused with the nearest knob's name: a
        misspelt knob silently dropped would run another config than the one meant.
        """
        if not isinstance(cfg, dict):
            raise InvalidInput(f"{field}: a config must be a mapping", field=field)
        try:
            params = r.space.complete(
                {k: v for k, v in cfg.items() if k not in r.space.derived_names}, r.context
            )
        except SpaceError as exc:
            raise InvalidInput(f"{field}: {exc}", field=field) from exc
        problems = r.space.validate(params, r.context)
        if problems:
            raise InvalidInput(f"{field}: {'; '.join(problems)}", field=field)
        return params

    def import_history(
        self, study_id: int, records: Sequence[tuple[dict[str, Any], str, dict[str, Any] | None]]
    ) -> list[Trial]:
        """Add past runs (an earlier campaign, hand-run benchmarks) as finished trials.

        Each record is ``(params, state, metrics)`` with state ``complete``, ``infeasible`` or
        ``failed``. Configs are checked against the space like enqueued ones, and a complete
        run must carry the objective metric(s). A complete run that breaks the study's
        constraints is stored as ``infeasible`` with its metrics, so that, as with a reported
        trial, it informs the search but never counts as the best. Imported runs cost no GPU
        time now, so they do not use the study's budget. All or nothing: one bad record
        rejects the import.
        """
        study = self.store.get_study(study_id)
        if study.state == StudyState.ARCHIVED:
            raise Conflict(f"study {study_id} is archived; no trials can be added")
        r = self.resolved(study_id)
        prepared: list[tuple[dict[str, Any], str, dict[str, Any] | None]] = []
        for i, (cfg, state, metrics) in enumerate(records):
            field = f"trials.{i}"
            if state not in _IMPORT_STATES:
                raise InvalidInput(
                    f"{field}.state: expected one of {list(_IMPORT_STATES)}, got {state!r}",
                    field=f"{field}.state",
                )
            params = self._checked_config(r, cfg, f"{field}.params")
            if metrics:
                check_metrics(r.spec, metrics, f"{field}.metrics")
            if state == "complete":
                gpus = job_gpus(r.workload, params)
                if objective_values(r.spec, metrics or {}, gpus) is None:
                    missing = missing_objectives(r.spec, metrics or {}, gpus)
                    raise InvalidInput(
                        f"{field}.metrics: missing objective metric(s) {missing}",
                        field=f"{field}.metrics",
                    )
                if violations(r.spec, r.workload, metrics or {}, params):
                    state = "infeasible"
            prepared.append((params, state, metrics or None))
        return self.store.add_finished_trials(study_id, prepared, source="imported")

    # the trial loop ---------------------------------------------------------------------
    def ask(
        self, study_id: int, worker_id: str, n: int = 1, lease_seconds: float = DEFAULT_LEASE_S
    ) -> list[Trial]:
        """Lease up to ``n`` trials to ``worker_id`` (see :meth:`lease`)."""
        return self.lease(study_id, worker_id, n, lease_seconds).trials

    def lease(
        self, study_id: int, worker_id: str, n: int = 1, lease_seconds: float = DEFAULT_LEASE_S
    ) -> Lease:
        """Lease up to ``n`` waiting trials to ``worker_id``.

        Idempotent per worker: a worker that asks again gets its own running trials back
        first. The work is a few rows whatever the study's size. With a background proposer
        a lease never proposes: one that comes back short wakes the proposer and says how
        long to wait; without one, it proposes (serialised per study by ``study_lock``, so
        that two processes never propose on the same history at once) and leases again.
        """
        if n < 1:
            raise InvalidInput("count must be at least 1", field="count")
        cap = self.resolved(study_id).spec.budget.max_parallel
        # One transaction: a study that is not running hands back only what the worker holds.
        leased, counts = self.store.lease(study_id, worker_id, n, lease_seconds, max_running=cap)
        if len(leased) >= n or counts.state != StudyState.RUNNING:
            return Lease(leased, counts.state)
        if self.background_propose:
            if counts.running >= cap:  # nothing more may run until a trial ends
                return Lease(leased, counts.state, retry_after_s=RETRY_AT_CAP_S)
            self.wake.set()
            return Lease(leased, counts.state, retry_after_s=self.retry_after())
        self.fill(study_id, wait=True, want=n - len(leased))
        leased, counts = self.store.lease(study_id, worker_id, n, lease_seconds, max_running=cap)
        return Lease(leased, counts.state)

    def fill(self, study_id: int, *, wait: bool = False, want: int | None = None) -> int:
        """Propose the study's next batch if it has room; returns how many were added.

        ``wait=False`` (a background proposer): skip the study if another thread or process
        holds its proposal lock. ``want``: propose only if fewer than that many wait.
        """
        with self._proposing_if(study_id, wait=wait) as held:
            return self._fill_held(study_id, want) if held else 0

    def _fill_held(self, study_id: int, want: int | None) -> int:
        """:meth:`fill`, the study's proposal lock held."""
        pace = self._pace.setdefault(study_id, _Pace()) if self.background_propose else None
        t0 = pace.clock() if pace is not None else 0.0
        counts = self.store.study_counts(study_id)
        if counts.state != StudyState.RUNNING:
            return 0
        if pace is not None:
            pace.observe(counts.active)
        k = self._room(study_id, counts, want)
        if k <= 0:
            return 0
        history = self._history(study_id)
        proposals = self._strategy(study_id).suggest(history, k)
        if not proposals:
            return 0
        added = self.store.add_trials(
            study_id,
            [p.params for p in proposals],
            source="strategy",
            predicted=[p.predicted for p in proposals],
        )
        self._remember(study_id, added)
        self._proposed_to[study_id] = counts.proposed + len(added)
        if pace is not None:
            pace.done(counts.active + len(added), pace.clock() - t0)
        return len(added)

    def to_fill(self) -> list[int]:
        """Running studies with room for proposals now that this process proposes for
        (one query, and one claim attempt per study that it does not propose for).

        A background proposer claims the studies it proposes for and keeps them while they
        run (see :class:`~cubic.store.repository.StudyClaims`), so that one process keeps
        and fits each study's model, not every process a copy. It takes at most one new
        study per call, so that the processes of a service share the studies created at
        once between them rather than the first to wake taking them all.
        """
        running = self.store.running_studies()
        self.claims.keep_only(running)
        for sid in self._pace.keys() - running.keys():
            del self._pace[sid]
        out, claimed = [], False
        for sid, counts in running.items():
            try:
                if self._room(sid, counts) <= 0:
                    continue
            except CubicError:
                continue  # a study whose spec no longer loads: its leases will say why
            if sid not in self.claims.held:
                if claimed or not self.claims.claim(sid):
                    continue  # another process proposes for it (or takes it next time)
                claimed = True
            out.append(sid)
        return out

    def _history(self, study_id: int) -> list[Trial]:
        """The study's trials in number order: read in full once, then only what changed."""
        with self._history_guard:
            h = self._histories.get(study_id)
            now = time.monotonic()
            if h is None or now - h.read_at > FULL_REREAD_S:
                mark = self.store.last_event_id(study_id)  # before the read: nothing is lost
                trials = self.store.list_trials(study_id)
                h = _History({t.id: t for t in trials}, mark, now)
                self._histories.pop(study_id, None)
                self._histories[study_id] = h  # most recently read last
                self._forget_read_histories()
            else:
                done = {tid for tid, t in h.trials.items() if t.state.is_finished}
                changed, mark = self.store.trials_changed(
                    study_id, max(0, h.mark - EVENT_LAG), known=done
                )
                last = next(reversed(h.trials)) if h.trials else 0
                late = False  # a trial older than the newest kept (another process's)
                for t in changed:
                    late |= t.id not in h.trials and t.id < last
                    h.trials[t.id] = t
                h.mark = max(h.mark, mark)
                if late:
                    h.trials = dict(sorted(h.trials.items(), key=lambda kv: kv[1].number))
            return list(h.trials.values())

    def _forget_read_histories(self) -> None:
        """Drop the oldest histories of studies without a kept strategy beyond
        :data:`MAX_READ_HISTORIES` (the caller holds the history guard)."""
        read_only = [sid for sid in self._histories if sid not in self._strategies]
        for sid in read_only[: max(0, len(read_only) - MAX_READ_HISTORIES)]:
            del self._histories[sid]

    def _remember(self, study_id: int, added: list[Trial]) -> None:
        with self._history_guard:
            h = self._histories.get(study_id)
            if h is not None:
                for t in added:
                    h.trials.setdefault(t.id, t)

    def _strategy(self, study_id: int) -> Strategy:
        """The study's strategy, kept per process so that its caches (candidate pool, fitted
        proxy) last across rounds; a strategy that learns across studies gets the finished
        trials of other studies of the same workload kind and the newest stored proxy."""
        strategy = self._strategies.pop(study_id, None) or make_strategy(self.resolved(study_id))
        self._strategies[study_id] = strategy  # most recently used last
        while len(self._strategies) > MAX_CACHED_STRATEGIES:  # bound the candidate pools kept
            gone = next(iter(self._strategies))
            del self._strategies[gone]
            with self._history_guard:
                self._histories.pop(gone, None)
        if getattr(strategy, "accepts_prior", False):
            kind = self.resolved(study_id).workload.kind
            strategy.set_prior(self._prior(kind, study_id))
        return strategy

    def prefit(self, study_ids: Sequence[int] | None = None) -> list[int]:
        """Fit ahead of demand the models of running studies whose strategy fits its own
        and for which this process made the latest proposals; returns the ids of those
        refitted.

        Of several API processes, the one that proposed last is the likeliest to propose
        next (its model is the freshest): the others leave the study alone rather than each
        fit the same model; one that proposes later fits in its round."""
        fitted = []
        for sid in list(self._strategies) if study_ids is None else study_ids:
            strategy = self._strategies.get(sid)
            if strategy is None or not hasattr(strategy, "prefit"):
                continue
            try:
                counts = self.store.study_counts(sid)
                if counts.state != StudyState.RUNNING:
                    continue
                if counts.proposed != self._proposed_to.get(sid):
                    continue  # another process proposed since
                kind = self.resolved(sid).workload.kind
                strategy.set_prior(self._prior(kind, sid))
                if strategy.prefit(self._history(sid)):
                    fitted.append(sid)
            except CubicError:
                continue  # a study gone or unreadable: the next lease will say why
        return fitted

    def _prior(self, kind: str, study_id: int, ttl_s: float = 60.0) -> list[tuple[Workload, Trial]]:
        """Finished trials of the other studies of ``kind``, with their workloads.

        One read per kind and ``ttl_s``, shared by every study of that kind (each gets the
        others' trials by reference), of the newest ``PRIOR_ROWS`` finished trials, so memory
        is bounded however long the history grows, and held once, not once per study.
        """
        cached = self._priors.get(kind)
        if cached is None or time.monotonic() - cached[0] >= ttl_s:
            rows = []
            for t in self.store.history_for_kind(
                kind,
                states=[TrialState.COMPLETE, TrialState.PRUNED, TrialState.INFEASIBLE],
                limit=PRIOR_ROWS,
            ):
                try:
                    rows.append((self.resolved(t.study_id).workload, t))
                except CubicError:
                    continue  # a study whose spec no longer loads teaches nothing
            cached = (time.monotonic(), rows)
            self._priors[kind] = cached
        return [(wl, t) for wl, t in cached[1] if t.study_id != study_id]

    def _room(self, study_id: int, counts: StudyCounts, want: int | None = None) -> int:
        """How many trials to propose now: all the room the budget and the parallel limit
        leave (retries and imports do not count as new), or none while ``want`` wait."""
        b = self.resolved(study_id).spec.budget
        if b.max_gpu_hours is not None and counts.gpu_hours >= b.max_gpu_hours:
            return 0
        if want is not None and want - counts.waiting <= 0:
            return 0
        # Propose for all the parallel room at once, as one diverse batch. For a strategy
        # blind to results a background proposer also keeps a few trials ahead of demand, so
        # that a worker that finishes finds the next one waiting (leases still run at most
        # max_parallel at once); a learning strategy's trial proposed early would be
        # proposed without the results that come in meanwhile, so it keeps ahead only the
        # slots that free up while its rounds run (see _Pace).
        ahead = 0
        if self.background_propose:
            most = -(-b.max_parallel // 8)
            if strategy_class(self.resolved(study_id).spec.strategy.name).blind:
                ahead = most
            elif (pace := self._pace.get(study_id)) is not None:
                ahead = pace.ahead(most)
        room = b.max_parallel + ahead - counts.active
        return max(0, min(b.max_trials - counts.proposed, room))

    def heartbeat(
        self, trial_id: int, lease_token: str, lease_seconds: float = DEFAULT_LEASE_S
    ) -> Trial:
        return self.store.heartbeat(trial_id, lease_token, lease_seconds)

    def judge(self, trial: Trial, progress: Progress) -> Verdict | None:
        """Whether a running trial should be stopped early, by the study's pruning rule, from
        how far its job has got (None: pruning is off, the trial is the baseline, or it is
        too early to say). The worker that holds it cancels the job and reports ``pruned``."""
        from cubic.pruning import judge

        r = self.resolved(trial.study_id)
        rule = r.spec.pruning
        if not rule.enabled or trial.state != TrialState.RUNNING or self._is_baseline(trial):
            return None
        values = [v for t, v in self._scored(trial.study_id) if v is not None and t.id != trial.id]
        return judge(rule, progress, values)

    def _is_baseline(self, trial: Trial) -> bool:
        """Whether a trial runs the study's baseline config (its first attempt or a retry)."""
        if trial.source == "baseline":
            return True
        r = self.resolved(trial.study_id)
        if r.spec.baseline is None or trial.retry_of is None:
            return False
        params = {k: v for k, v in r.spec.baseline.items() if k not in r.space.derived_names}
        return config_key(trial.params) == config_key(r.space.complete(params, r.context))

    def tell(
        self,
        trial_id: int,
        lease_token: str,
        outcome: Outcome,
        *,
        holder: Callable[[Trial], None] | None = None,
    ) -> Trial:
        """Record how a trial ended; a repeated report with the same token changes nothing.

        A complete trial that breaks the study's constraints (memory headroom, error bound)
        stays complete, with the reason in its error text, and never counts as the best.
        ``holder(trial)`` may refuse the caller (raise). One transaction: the checks run on
        the locked trial, and the study's counts come back with the change, so a report
        costs the same few statements whatever the study's size.
        """

        def check(t: Trial) -> str | None:
            if holder is not None:
                holder(t)
            error = outcome.error
            if not (outcome.metrics or outcome.state == "complete"):
                return error
            r = self.resolved(t.study_id)
            check_metrics(r.spec, outcome.metrics)
            if outcome.state == "complete":
                gpus = job_gpus(r.workload, t.params)
                if objective_values(r.spec, outcome.metrics, gpus) is None:
                    missing = missing_objectives(r.spec, outcome.metrics, gpus)
                    raise InvalidInput(
                        f"metrics: missing objective metric(s) {missing}", field="metrics"
                    )
                bad = violations(r.spec, r.workload, outcome.metrics, t.params)
                if bad:
                    error = "constraint violated: " + "; ".join(bad)
            return error

        trial, _retry, counts = self.store.finish_trial_counted(
            trial_id,
            lease_token,
            TrialState(outcome.state),
            metrics=outcome.metrics or None,
            error=outcome.error,
            log_tail=outcome.log_tail,
            check=check,
        )
        if counts is None:  # a repeated report: nothing changed, but not for another caller
            if holder is not None:
                holder(trial)
            return trial
        self._maybe_complete(trial.study_id, counts)
        self.wake.set()  # a slot is free: the proposer refills it
        return trial

    def release(self, trial_id: int, lease_token: str) -> Trial:
        return self.store.release_trial(trial_id, lease_token)

    def reap(self) -> list[Trial]:
        """Turn expired leases into failed trials (retried per the study's cap)."""
        reaped = self.store.reap_expired()
        for sid in {t.study_id for t in reaped}:
            self._maybe_complete(sid)
        if reaped:
            self.wake.set()
        return reaped

    def _maybe_complete(self, study_id: int, counts: StudyCounts | None = None) -> None:
        """Complete a running study with nothing left to run or to propose (``counts``:
        as the caller's transaction left them, else read)."""
        if counts is None:
            counts = self.store.study_counts(study_id)
        if counts.state != StudyState.RUNNING or counts.active:
            return
        if self._room(study_id, counts) == 0:
            with contextlib.suppress(Conflict):  # another process finished it first
                self.store.set_study_state(study_id, StudyState.COMPLETED)

    # study states ----------------------------------------------------------------------------
    def set_state(self, study_id: int, target: StudyState | str) -> Study:
        """Pause, resume, stop or archive a study, by the rules in :data:`STUDY_TRANSITIONS`.

        Asking for the state the study is already in changes nothing, so a client can repeat
        the request after a lost answer. A transition the rules forbid (resuming a stopped
        study, anything but archiving an archived one...) raises :class:`Conflict`.
        ``completed`` is reached only by running out of budget, never on request.
        """
        try:
            target = StudyState(target)
        except ValueError:
            raise InvalidInput(f"unknown study state {target!r}", field="state") from None
        if target not in STUDY_TRANSITIONS:
            raise InvalidInput(f"a study cannot be set to {target}", field="state")
        # Serialised with proposals: a pause never lands in the middle of a batch.
        with self._proposing(study_id):
            study = self.store.get_study(study_id)
            if study.state == target:
                return study
            if study.state not in STUDY_TRANSITIONS[target]:
                allowed = ", ".join(sorted(STUDY_TRANSITIONS[target]))
                raise Conflict(
                    f"study {study_id} is {study.state} and cannot become "
                    f"{target} (only from: {allowed})"
                )
            study = self.store.set_study_state(study_id, target)
        if target == StudyState.RUNNING:
            # Its last trials may have finished while it was paused: it may be done already.
            self._maybe_complete(study_id)
            study = self.store.get_study(study_id)
        return study

    # results ------------------------------------------------------------------------------
    def progress(self, study_id: int) -> dict[str, Any]:
        counts = self.store.count_trials(study_id)
        spec = self.resolved(study_id).spec
        return {
            "counts": {str(k): v for k, v in counts.items()},
            "max_trials": spec.budget.max_trials,
        }

    def best(self, study_id: int) -> Best | None:
        """The best complete trial that respects the constraints, with the baseline's value."""
        spec = self.resolved(study_id).spec
        scored = list(self._scored(study_id))
        best: tuple[Trial, float] | None = None
        for t, v in scored:
            if v is not None and (best is None or better(spec, v, best[1])):
                best = (t, v)
        if best is None:
            return None
        # The baseline's value is that of its last attempt (a failed one is retried).
        bases = [t.params for t, _ in scored if t.source == "baseline"]
        base_keys = {config_key(p) for p in bases}
        baseline = [  # equal dicts first: far cheaper than a key per trial
            (t, v) for t, v in scored if t.params in bases and config_key(t.params) in base_keys
        ]
        bt, bv = baseline[-1] if baseline else (None, None)
        return Best(best[0], best[1], bt, bv, minimize=spec.objectives[0].direction == "minimize")

    def trials(self, study_id: int) -> list[Trial]:
        """The study's trials in number order, from the history this process keeps (read in
        full once, then only what changed: a finished trial never changes), so that a study
        of 10,000 trials is not read again at every request about it."""
        return self._history(study_id)

    def finished(self, study_id: int) -> list[Trial]:
        """The study's finished trials in number order (see :meth:`trials`)."""
        return [t for t in self._history(study_id) if t.state.is_finished]

    def pareto(self, study_id: int) -> ParetoFront:
        """The study's Pareto front: the complete trials within the constraints that no other
        such trial beats in every objective (each config once: its newest measurement).

        A single-objective study's front is its best trial (and any that tie with it)."""
        from cubic.pareto import non_dominated, oriented

        spec = self.resolved(study_id).spec
        directions = [str(o.direction) for o in spec.objectives]
        latest: dict[str, tuple[Trial, list[float]]] = {}
        for t, vals in self._scored_all(study_id):
            if vals is not None:
                latest[config_key(t.params)] = (t, vals)  # a retry replaces its earlier try
        rows = sorted(latest.values(), key=lambda tv: tv[0].number)
        if not rows:
            return ParetoFront([], [o.metric for o in spec.objectives], directions, 0)
        on = non_dominated(oriented([v for _, v in rows], directions))
        front = [ParetoPoint(t, v) for (t, v), keep in zip(rows, on, strict=True) if keep]
        front.sort(key=lambda p: -p.values[0] if directions[0] == "maximize" else p.values[0])
        return ParetoFront(front, [o.metric for o in spec.objectives], directions, len(rows))

    def _scored(self, study_id: int) -> Iterator[tuple[Trial, float | None]]:
        for t, vals in self._scored_all(study_id):
            yield t, vals[0] if vals else None

    def _scored_all(self, study_id: int) -> Iterator[tuple[Trial, list[float] | None]]:
        """Finished trials with their objective values (None unless complete and within the
        constraints)."""
        r = self.resolved(study_id)
        scored = (TrialState.COMPLETE, TrialState.INFEASIBLE, TrialState.FAILED)
        finished = self.finished(study_id)
        with self._history_guard:
            h = self._histories.get(study_id)
            known = h.values if h is not None else {}
        for t in finished:
            if t.state not in scored:
                continue
            if t.id in known:
                yield t, known[t.id]
                continue
            vals = None
            if t.state == TrialState.COMPLETE and t.metrics and not (t.error or ""):
                vals = objective_values(r.spec, t.metrics, job_gpus(r.workload, t.params))
            known[t.id] = vals
            yield t, vals


def _refuse_unfit(resolved: ResolvedStudy) -> None:
    """Refuse a study whose space holds no config that the memory estimate says fits: it
    would spend its whole budget finding that out."""
    from cubic.strategies.candidates import check_fit

    limit = 1.0 - resolved.spec.constraints.memory_headroom
    try:
        reason = check_fit(resolved.workload, resolved.space, limit=limit)
    except SpaceError as exc:  # sampling found (almost) no valid configuration
        raise InvalidInput(f"space: {exc}", field="space") from exc
    if reason is not None:
        raise InvalidInput(reason, field="space")

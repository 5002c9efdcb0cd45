"""The ``ray`` runner: each trial's job is a Ray job, submitted through the Ray Jobs API.

The job's entrypoint runs on a Ray node that shares no files with the worker, so the config
travels inline (``CUBIC_CONFIG_JSON``, written to ``CUBIC_CONFIG`` under ``remote_dir`` by the
entrypoint's wrapper) and the metrics come back as the ``CUBIC_METRICS {...}`` line of the
job's log. How the job ended comes from Ray's job info: the driver's exit code, Ray's own
failure (a supervisor actor or node that died: ``failed`` and retried), and Ray's memory
monitor killing it (``infeasible``). The trial's timeout is enforced here: Ray has none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ray.job_submission import JobDetails, JobSubmissionClient

from cubic.errors import InvalidInput
from cubic.outcome import Outcome
from cubic.runners.base import Runner, TrialJob
from cubic.runners.contract import classify, parse_metrics, prepare, remote_command

log = logging.getLogger("cubic.runners.ray")

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Ray's own address variables, in the order Ray reads them.
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
ENTRYPOINT_ERROR = "JOB_ENTRYPOINT_COMMAND_ERROR"

# What Ray writes when its memory monitor kills a worker (the raylet's "N worker(s) were
# killed due to the node running low on memory", ``ray.exceptions.OutOfMemoryError`` in the
# driver, the ``NODE_OUT_OF_MEMORY`` exit type of a dead actor, the hint about
# ``RAY_memory_usage_threshold``). Ray's generic "killed by the OOM killer" hint for any dead
# worker is deliberately absent: it is printed for every SIGKILL too.
RAY_OOM_RE = re.compile(
    r"running low on memory|ray\.exceptions\.OutOfMemoryError|NODE_OUT_OF_MEMORY"
    r"|killed due to memory pressure|RAY_memory_usage_threshold"
)
# What Ray writes when the job's node or its supervisor went away: infrastructure, retried.
LOST_RE = re.compile(
    r"Job supervisor actor died|its node has died|NodeDiedError|has been marked dead"
    r"|node was (?:forcibly )?preempted|LocalRayletDiedError|local raylet died",
    re.IGNORECASE,
)


@dataclass(slots=True)
class RayHandle:
    job: TrialJob
    submission_id: str
    entrypoint: str
    deadline: float
    checked_at: float = float("-inf")
    stop_at: float | None = None
    timed_out: bool = False
    cancelled: bool = False
    unreachable_since: float | None = None
    outcome: Outcome | None = None


class RayRunner(Runner):
    """Runs each trial's job as a Ray job on the cluster at ``address``.

    ``address`` is the dashboard URL (default: ``RAY_API_SERVER_ADDRESS``, ``RAY_ADDRESS``,
    then ``http://127.0.0.1:8265``). ``runtime_env`` is merged into every job's runtime
    environment (``working_dir``, ``pip``, ``env_vars``, ...; cubic's own variables win over
    its ``env_vars``); ``entrypoint_*`` reserve resources for the entrypoint on its node;
    ``metadata`` labels every job (next to ``cubic_study``/``cubic_trial``). The job's files go
    to ``remote_dir/<submission id>`` on the node; its command runs in ``shell`` (None: Ray's
    ``/bin/sh``). Ray is asked at most every ``poll_interval_s``; a stop that Ray has not
    confirmed after ``stop_grace_s``, or a cluster unreachable for ``unreachable_grace_s``,
    ends the trial as ``failed`` (retried).
    """

    name = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: Mapping[str, float] | None = None,
        metadata: Mapping[str, str] | None = None,
        remote_dir: str = "/tmp/cubic-jobs",
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        shell: str | None = "bash",
        poll_interval_s: float = 1.0,
        stop_grace_s: float = 30.0,
        unreachable_grace_s: float = 300.0,
    ) -> None:
        self.address = resolve_address(address)
        self.runtime_env = _mapping(runtime_env, "runtime_env")
        if not isinstance(self.runtime_env.get("env_vars", {}), Mapping):
            raise InvalidInput(
                "runtime_env.env_vars: expected a mapping of names to values",
                field="runtime_env.env_vars",
            )
        for key, value in (
            ("entrypoint_num_cpus", entrypoint_num_cpus),
            ("entrypoint_num_gpus", entrypoint_num_gpus),
            ("entrypoint_memory", entrypoint_memory),
            ("poll_interval_s", poll_interval_s),
            ("stop_grace_s", stop_grace_s),
            ("unreachable_grace_s", unreachable_grace_s),
        ):
            if value is not None and not _non_negative(value):
                raise InvalidInput(f"{key}: expected a number >= 0, got {value!r}", field=key)
        resources = _mapping(entrypoint_resources, "entrypoint_resources")
        for key, value in resources.items():
            if not _non_negative(value):
                raise InvalidInput(
                    f"entrypoint_resources.{key}: expected a number >= 0, got {value!r}",
                    field=f"entrypoint_resources.{key}",
                )
        if not remote_dir or not isinstance(remote_dir, str):
            raise InvalidInput("remote_dir: expected a directory path", field="remote_dir")
        self.entrypoint_num_cpus = entrypoint_num_cpus
        self.entrypoint_num_gpus = entrypoint_num_gpus
        self.entrypoint_memory = entrypoint_memory
        self.entrypoint_resources = {k: float(v) for k, v in resources.items()}
        self.metadata = {str(k): str(v) for k, v in _mapping(metadata, "metadata").items()}
        self.remote_dir = remote_dir.rstrip("/") or "/"
        self.shell = shell
        self.poll_interval_s = poll_interval_s
        self.stop_grace_s = stop_grace_s
        self.unreachable_grace_s = unreachable_grace_s
        self.client = connect(
            self.address,
            headers=dict(_mapping(headers, "headers")),
            verify=verify,
        )

    # -- submit ------------------------------------------------------------------------------

    def submission_id(self, job: TrialJob) -> str:
        """Unique per submit: Ray refuses a reused id, and a retried attempt is a new job."""
        return f"cubic-s{job.study_id}-t{job.trial_id}-a{job.attempt}-{uuid.uuid4().hex[:8]}"

    def entrypoint(self, job: TrialJob, command: str) -> str:
        """The shell command Ray runs: cd to ``job.workdir``, then the command in ``shell``."""
        workdir = job.job.get("workdir")
        if workdir:
            command = f"{_cd(str(workdir))} && {command}"
        if self.shell:
            command = f"{self.shell} -c {shlex.quote(command)}"
        return command

    def runtime_env_for(self, env: Mapping[str, str]) -> dict[str, Any]:
        user = dict(self.runtime_env)
        env_vars = {str(k): str(v) for k, v in (user.pop("env_vars", None) or {}).items()}
        return {**user, "env_vars": {**env_vars, **env}}

    def submit(self, job: TrialJob) -> RayHandle:
        sid = self.submission_id(job)
        prepared = prepare(job, None, remote_dir=f"{self.remote_dir}/{sid}")
        entrypoint = self.entrypoint(job, remote_command(prepared))
        self.client.submit_job(
            entrypoint=entrypoint,
            submission_id=sid,
            runtime_env=self.runtime_env_for(prepared.env),
            metadata={
                **self.metadata,
                "cubic_study": str(job.study_id),
                "cubic_trial": str(job.trial_id),
                "cubic_trial_number": str(job.number),
                "cubic_attempt": str(job.attempt),
            },
            entrypoint_num_cpus=self.entrypoint_num_cpus,
            entrypoint_num_gpus=self.entrypoint_num_gpus,
            entrypoint_memory=self.entrypoint_memory,
            entrypoint_resources=self.entrypoint_resources or None,
        )
        return RayHandle(job, sid, entrypoint, time.monotonic() + job.timeout_s)

    # -- poll --------------------------------------------------------------------------------

    def poll(self, handle: RayHandle) -> Outcome | None:
        h = handle
        if h.outcome is not None:
            return h.outcome
        now = time.monotonic()
        due = h.stop_at is None and now >= h.deadline
        if not due and now - h.checked_at < self.poll_interval_s:
            return None  # the worker polls often; Ray's dashboard need not answer each time
        h.checked_at = now
        try:
            info = self.client.get_job_info(h.submission_id)
        except Exception as exc:  # any transport error means "ask again later"
            return self._unreachable(h, exc, now)
        h.unreachable_since = None
        if _text(info.status) not in TERMINAL:
            if due:
                h.timed_out = self._stop(h)
            elif h.stop_at is not None and now - h.stop_at >= self.stop_grace_s:
                return self._finish(h, info)  # Ray never confirmed the stop: end it here
            return None
        return self._finish(h, info)

    def _finish(self, h: RayHandle, info: JobDetails) -> Outcome:
        try:
            logs = job_log(self.client.get_job_logs(h.submission_id), h.submission_id, h.entrypoint)
        except Exception as exc:  # the outcome matters more than the log
            logs = f"(could not read the job's log from Ray: {exc})"
        h.outcome = job_outcome(
            _text(info.status),
            exit_code=info.driver_exit_code,
            error_type=_text(info.error_type) or None,
            message=info.message or "",
            log=logs,
            objectives=h.job.objectives,
            timed_out=h.timed_out,
            timeout_s=h.job.timeout_s,
            cancelled=h.cancelled,
        )
        return h.outcome

    def _unreachable(self, h: RayHandle, exc: Exception, now: float) -> Outcome | None:
        if "does not exist" in str(exc):
            h.outcome = classify(
                None,
                "",
                None,
                lost=f"ray job {h.submission_id} no longer exists on {self.address} "
                "(was the cluster restarted?)",
            )
            return h.outcome
        if h.unreachable_since is None:
            h.unreachable_since = now
            log.warning("ray job %s: cannot reach %s: %s", h.submission_id, self.address, exc)
        if now - h.unreachable_since >= self.unreachable_grace_s:
            h.outcome = classify(
                None,
                "",
                None,
                lost=f"Ray cluster at {self.address} unreachable for "
                f"{now - h.unreachable_since:.0f} s: {exc}",
            )
            return h.outcome
        return None

    # -- cancel ------------------------------------------------------------------------------

    def _stop(self, h: RayHandle) -> bool:
        """Ask Ray to stop the job; True when it was still running."""
        h.stop_at = time.monotonic()
        try:
            return bool(self.client.stop_job(h.submission_id))
        except Exception as exc:  # unreachable now; the grace period ends it
            log.warning("ray job %s: stop failed: %s", h.submission_id, exc)
            return True

    def cancel(self, handle: RayHandle) -> None:
        """Stop the job and wait until Ray says it stopped (idempotent)."""
        h = handle
        if h.outcome is not None or h.cancelled:
            return
        h.cancelled = self._stop(h)
        if not h.cancelled:
            return  # it had already ended by itself; poll reports how
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline:
            try:
                if _text(self.client.get_job_status(h.submission_id)) in TERMINAL:
                    return
            except Exception:  # unreachable: the stop was asked for
                return
            time.sleep(0.2)

    def describe(self, handle: RayHandle) -> dict[str, Any]:
        return {"submission_id": handle.submission_id, "address": self.address}


def job_log(raw: str | None, submission_id: str, entrypoint: str) -> str:
    """The job's output without Ray's echo of the entrypoint, whose text is the command's and
    could otherwise read as an out-of-memory message or a metrics line."""
    echo = f"Running entrypoint for job {submission_id}: {entrypoint}\n"
    return (raw or "").replace(echo, "", 1)


def job_outcome(
    status: str,
    *,
    exit_code: int | None,
    error_type: str | None,
    message: str,
    log: str,
    objectives: tuple[str, ...] | list[str] = (),
    timed_out: bool = False,
    timeout_s: float | None = None,
    cancelled: bool = False,
) -> Outcome:
    """How a Ray job ended, as an outcome (through :func:`classify`, like every runner).

    ``STOPPED`` by cubic is a cancel or a timeout, by anyone else a lost job; ``FAILED`` by
    Ray itself (no driver exit: supervisor or node died, runtime env or scheduling failed) is
    lost, unless Ray's memory monitor did it, which is out of memory.
    """
    if status == "SUCCEEDED":
        code = 0 if exit_code is None else exit_code
        return classify(code, log, parse_metrics(log), objectives=objectives)
    if status == "STOPPED" or timed_out or cancelled:
        outside = None if timed_out or cancelled else "ray job was stopped outside cubic"
        return classify(
            exit_code,
            log,
            None,
            timed_out=timed_out,
            timeout_s=timeout_s,
            cancelled=cancelled,
            lost=outside,
        )
    ray_failed = error_type not in (None, ENTRYPOINT_ERROR)  # Ray's failure, not the job's
    if ray_failed and message and message not in log:
        log = f"{log.rstrip()}\n{message}" if log else message
    oom = RAY_OOM_RE.search(log) is not None
    lost = None
    if not oom:
        match = LOST_RE.search(log)
        if ray_failed:
            lost = f"ray job failed ({error_type}): {_first_line(message) or 'no message'}"
        elif match is not None:
            lost = f"ray node lost: {_line_at(log, match)}"
    return classify(
        exit_code,
        log,
        parse_metrics(log),
        objectives=objectives,
        oom_killed=oom,
        lost=lost,
    )


def resolve_address(address: str | None) -> str:
    """``address``, else Ray's own variables, else a head on this machine."""
    if address is not None and not isinstance(address, str):
        raise InvalidInput(f"address: expected a string, got {address!r}", field="address")
    if address:
        return address
    for name in ADDRESS_ENV:
        if os.environ.get(name):
            return os.environ[name]
    return DEFAULT_ADDRESS


def connect(
    address: str, *, headers: dict[str, str] | None = None, verify: bool | str = True
) -> JobSubmissionClient:
    """A Jobs API client for exactly ``address``; InvalidInput naming it when unreachable.

    Ray lets its address variables override an explicit address; here the explicit one wins
    (the variables only supply the default, in :func:`resolve_address`).
    """
    try:
        with _without_env(ADDRESS_ENV):
            return JobSubmissionClient(address, headers=headers or None, verify=verify)
    except Exception as exc:  # ConnectionError, RuntimeError, ValueError...
        raise InvalidInput(
            f"address: cannot reach the Ray Jobs API at {address!r} ({exc}); start the cluster "
            "with the dashboard (ray start --head --include-dashboard=true) or set the runner's "
            "address (or RAY_ADDRESS) to its dashboard URL, e.g. http://HEAD:8265",
            field="address",
        ) from exc


@contextlib.contextmanager
def _without_env(names: tuple[str, ...]) -> Iterator[None]:
    saved = {n: os.environ.pop(n) for n in names if n in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{name}: expected a mapping, got {type(value).__name__}", field=name)
    return dict(value)


def _non_negative(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _cd(workdir: str) -> str:
    """``cd`` to a directory on the node; ``~`` is the node's home, not the worker's."""
    if workdir == "~":
        return 'cd "$HOME"'
    if workdir.startswith("~/"):
        return f'cd "$HOME"/{shlex.quote(workdir[2:])}'
    return f"cd {shlex.quote(workdir)}"


def _text(value: Any) -> str:
    """A Ray enum (``JobStatus.FAILED``) or the plain string that some versions send."""
    if value is None:
        return ""
    return str(getattr(value, "value", value))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:500] if text.strip() else ""


def _line_at(text: str, match: re.Match[str]) -> str:
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start : end if end >= 0 else len(text)].strip()[:500]

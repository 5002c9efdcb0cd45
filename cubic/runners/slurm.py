"""The ``slurm`` runner: each trial's job is a Slurm batch job.

Each trial attempt gets a folder under ``root`` (which must be shared between the worker and
the compute nodes) holding ``config.json``, the rendered ``job.sbatch``, the job's output
``job.log`` and its ``metrics.json``. The batch script comes from a Jinja2 template (the
built-in ``templates/slurm.sbatch.j2`` or the operator's own), which gets:

``partition``, ``account``, ``qos`` (None when unset), ``job_name`` (``cubic-<study>-<trial>``),
``nodes``, ``gpus_per_node`` (0 on a CPU cluster), ``ntasks_per_node``, ``cpus_per_task``,
``mem`` (None when unset), ``time`` (Slurm's ``[D-]HH:MM:SS``), ``output``, ``workdir``,
``exports`` (``export K=V`` lines, values shell-quoted), ``env`` (the same as a mapping),
``command``, ``extra_args`` (extra ``#SBATCH`` options), ``trial``, ``params``, ``workload``
and ``job_dir``; the filter ``shell_quote`` quotes a value for the shell.

Nodes and GPUs come from the study's workload cluster (``num_gpus``, ``gpus_per_node``)
unless the study's ``job.resources`` sets them (``{gpus_per_node: 0, nodes: 1}`` for a CPU
cluster). The time limit is the study's trial timeout rounded up to whole minutes. The job
runs in the study's ``job.workdir``, else in the worker's working directory (as ``sbatch``
and the local runner do), so relative paths in ``job.command`` mean the same everywhere.

Watching many jobs must not hammer slurmctld: one ``squeue`` call per ``poll_interval_s``
serves every handle. A job that has left the queue is read back from ``sacct`` when
accounting works, else from ``scontrol show job`` (which knows a finished job for
``MinJobAge`` seconds). The job is never requeued by Slurm (``--no-requeue``): a lost node or
preemption is reported as ``failed`` and the service decides about retries.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

from cubic.errors import CubicError, InvalidInput
from cubic.outcome import Outcome
from cubic.pruning import Progress
from cubic.runners.base import Runner, TrialJob
from cubic.runners.contract import PreparedJob, classify, parse_metrics, prepare, read_progress
from cubic.runners.local import read_log

log = logging.getLogger("cubic.runners.slurm")

BUILTIN_TEMPLATE = "slurm.sbatch.j2"

# Slurm job states after which the job will not run again.
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "OUT_OF_MEMORY",
        "TIMEOUT",
        "CANCELLED",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
# The infrastructure, not the config, ended these jobs: failed and retried by the service.
LOST_STATES = frozenset({"NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VANISHED_GRACE_S = 30.0  # how long a job may be unknown to every command before it is lost


class SlurmError(CubicError):
    """A Slurm command failed (sbatch refused the job, slurmctld unreachable)."""


def base_state(raw: str) -> str:
    """``CANCELLED by 1000`` and sacct's ``CANCELLED+`` are both ``CANCELLED``."""
    word = raw.strip().split()[0] if raw.strip() else ""
    return word.rstrip("+").upper()


def parse_exit_code(text: str | None) -> int | None:
    """Slurm's ``code:signal`` as one return code (a signal ``s`` as ``128 + s``)."""
    if not text:
        return None
    code, _, sig = text.strip().partition(":")
    try:
        rc, signum = int(code), int(sig or 0)
    except ValueError:
        return None
    if rc == 0 and signum:
        return 128 + signum
    return rc


def slurm_outcome(
    state: str | None,
    returncode: int | None,
    log_text: str,
    metrics: dict[str, Any] | None,
    *,
    objectives: tuple[str, ...] | list[str] = (),
    timeout_s: float | None = None,
    cancelled_by_runner: bool = False,
    timed_out_by_runner: bool = False,
) -> Outcome:
    """Map how a Slurm job ended onto an outcome, through :func:`classify`.

    ``state`` is the final Slurm state (None when Slurm no longer knows the job). What the
    runner itself did (cancel, deadline) explains a ``CANCELLED`` or unknown end; a job that
    finished on its own before the runner's scancel landed keeps its own state.
    """
    s = base_state(state) if state else None
    common: dict[str, Any] = {"objectives": objectives, "timeout_s": timeout_s}
    if s in (None, "CANCELLED") and timed_out_by_runner:
        return classify(returncode, log_text, metrics, timed_out=True, **common)
    if s in (None, "CANCELLED") and cancelled_by_runner:
        out = classify(returncode, log_text, metrics, cancelled=True, **common)
        return replace(out, error="cancelled by cubic (scancel)")
    if s is None:
        lost = "slurm lost track of the job: no record of how it ended in sacct or scontrol"
        return classify(returncode, log_text, metrics, lost=lost, **common)
    if s == "COMPLETED":
        return classify(returncode or 0, log_text, metrics, **common)
    if s == "FAILED":
        rc = returncode if returncode else 1  # FAILED is a non-zero exit by definition
        return classify(rc, log_text, metrics, **common)
    if s == "OUT_OF_MEMORY":
        return classify(returncode or 1, log_text, metrics, oom_killed=True, **common)
    if s == "TIMEOUT":
        return classify(returncode, log_text, metrics, timed_out=True, **common)
    if s == "CANCELLED":
        out = classify(returncode, log_text, metrics, cancelled=True, **common)
        return replace(out, error=f"cancelled outside cubic (Slurm state {state})")
    if s in LOST_STATES:
        return classify(returncode, log_text, metrics, lost=f"slurm job state {s}", **common)
    return classify(returncode, log_text, metrics, lost=f"slurm job ended in state {s}", **common)


def slurm_time(seconds: float) -> str:
    """A time limit in Slurm's ``[D-]HH:MM:SS``, rounded up to whole minutes (at least one)."""
    minutes = max(1, math.ceil(seconds / 60.0))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    clock = f"{hours:02d}:{mins:02d}:00"
    return f"{days}-{clock}" if days else clock


def _count(resources: dict[str, Any], key: str, minimum: int) -> int | None:
    value = resources.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(
            f"job.resources.{key}: expected an integer >= {minimum}, got {value!r}",
            field=f"job.resources.{key}",
        )
    return value


def slurm_resources(workload: dict[str, Any], resources: dict[str, Any]) -> dict[str, Any]:
    """Nodes, GPUs, tasks, CPUs and memory for the batch script.

    The workload's cluster gives the shape (``num_gpus`` over ``gpus_per_node``);
    ``job.resources`` overrides any of ``nodes``, ``gpus_per_node``, ``ntasks_per_node``,
    ``cpus_per_task``, ``mem`` (Slurm's syntax, e.g. ``64G``) or ``memory_gb``.
    """
    cluster = (workload or {}).get("cluster") or {}
    num_gpus = int(cluster.get("num_gpus") or 0)
    gpn = int(cluster.get("gpus_per_node") or num_gpus)
    gpn = min(gpn, num_gpus) if num_gpus else 0
    over_gpn = _count(resources, "gpus_per_node", 0)
    if over_gpn is not None:
        gpn = over_gpn
    nodes = _count(resources, "nodes", 1)
    if nodes is None:
        nodes = math.ceil(num_gpus / gpn) if num_gpus and gpn else 1
    mem = resources.get("mem")
    if mem is not None and not (isinstance(mem, str) and mem.strip()):
        if isinstance(mem, int) and not isinstance(mem, bool) and mem > 0:
            mem = f"{mem}M"
        else:
            raise InvalidInput(
                f"job.resources.mem: expected Slurm memory such as '64G', got {mem!r}",
                field="job.resources.mem",
            )
    gb = resources.get("memory_gb")
    if mem is None and gb is not None:
        if isinstance(gb, bool) or not isinstance(gb, int | float) or gb <= 0:
            raise InvalidInput(
                f"job.resources.memory_gb: expected a positive number, got {gb!r}",
                field="job.resources.memory_gb",
            )
        mem = f"{math.ceil(gb * 1024)}M"
    return {
        "nodes": nodes,
        "gpus_per_node": gpn,
        "ntasks_per_node": _count(resources, "ntasks_per_node", 1) or 1,
        "cpus_per_task": _count(resources, "cpus_per_task", 1),
        "mem": mem,
    }


def export_lines(env: dict[str, str]) -> list[str]:
    """``export K=V`` lines, the values quoted so that the shell passes them verbatim."""
    lines = []
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise InvalidInput(
                f"job.env.{key}: not a valid environment variable name", field=f"job.env.{key}"
            )
        lines.append(f"export {key}={shlex.quote(str(value))}")
    return lines


@dataclass(slots=True)
class SlurmHandle:
    """A submitted trial: the Slurm job id and where its files are."""

    job: TrialJob
    prepared: PreparedJob
    job_id: str
    job_dir: Path
    script_path: Path
    log_path: Path
    submitted: float
    deadline: float
    cancelled: bool = False
    timed_out: bool = False
    term_at: float | None = None
    gone_since: float | None = None
    looked_at: float = -math.inf  # when sacct/scontrol were last asked about the job
    outcome: Outcome | None = None


@dataclass(slots=True)
class _Queue:
    """One ``squeue`` answer shared by every handle: job id -> state."""

    taken: float = -math.inf
    states: dict[str, str] | None = None


class SlurmRunner(Runner):
    name = "slurm"

    def __init__(
        self,
        *,
        root: str | Path | None = None,
        template: str | Path | None = None,
        partition: str | None = None,
        account: str | None = None,
        qos: str | None = None,
        extra_args: list[str] | None = None,
        poll_interval_s: float = 5.0,
        deadline_slack_s: float = 300.0,
        kill_grace_s: float = 60.0,
        command_timeout_s: float = 60.0,
        sbatch: str = "sbatch",
        squeue: str = "squeue",
        scontrol: str = "scontrol",
        sacct: str = "sacct",
        scancel: str = "scancel",
    ) -> None:
        """``deadline_slack_s``: how long past the trial timeout (counted from submission,
        queue time included) a job may go before the runner cancels it and reports a
        timeout; ``kill_grace_s``: how long a cancelled job may take to leave the queue."""
        self.root = Path(root).expanduser() if root else Path(tempfile.mkdtemp(prefix="cubic-"))
        self.partition, self.account, self.qos = partition, account, qos
        if extra_args is None:
            extra_args = []
        if not isinstance(extra_args, list) or not all(isinstance(a, str) for a in extra_args):
            raise InvalidInput("extra_args: expected a list of strings", field="extra_args")
        self.extra_args = [re.sub(r"^#SBATCH\s+", "", a.strip()) for a in extra_args if a.strip()]
        if poll_interval_s < 0 or deadline_slack_s < 0 or kill_grace_s < 0:
            raise InvalidInput(
                "poll_interval_s, deadline_slack_s and kill_grace_s must be >= 0",
                field="poll_interval_s",
            )
        self.poll_interval_s = poll_interval_s
        self.deadline_slack_s = deadline_slack_s
        self.kill_grace_s = kill_grace_s
        self.command_timeout_s = command_timeout_s
        self.bins = {
            "sbatch": sbatch,
            "squeue": squeue,
            "scontrol": scontrol,
            "sacct": sacct,
            "scancel": scancel,
        }
        self.template_name, self._template = _load_template(template)
        self._queue = _Queue()
        self._lock = threading.Lock()
        self._accounting = True  # sacct answers; False once it says accounting is disabled
        self._user = str(os.getuid())

    # -- Slurm commands -------------------------------------------------------------------

    def _run(self, tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        binary = self.bins[tool]
        try:
            return subprocess.run(
                [binary, *args],
                capture_output=True,
                text=True,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                timeout=self.command_timeout_s,
            )
        except FileNotFoundError as exc:
            raise SlurmError(
                f"{tool}: '{binary}' not found; is Slurm installed? (runner option '{tool}')"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{tool} did not answer in {self.command_timeout_s:.0f} s") from exc

    # -- the script -----------------------------------------------------------------------

    def job_dir(self, job: TrialJob) -> Path:
        return self.root / f"study-{job.study_id}" / f"trial-{job.trial_id}-attempt-{job.attempt}"

    def script_variables(
        self, job: TrialJob, prepared: PreparedJob, job_dir: Path
    ) -> dict[str, Any]:
        """What the sbatch template sees (see the module docstring)."""
        workdir = prepared.workdir or Path.cwd()  # as the local runner and sbatch do
        return {
            "partition": self.partition,
            "account": self.account,
            "qos": self.qos,
            "job_name": f"cubic-{job.study_id}-{job.trial_id}",
            **slurm_resources(job.workload, dict(job.job.get("resources") or {})),
            "time": slurm_time(job.timeout_s),
            "output": str(job_dir / "job.log"),
            "workdir": str(workdir),
            "env": dict(prepared.env),
            "exports": export_lines(prepared.env),
            "command": prepared.command,
            "extra_args": list(self.extra_args),
            "trial": {
                "id": job.trial_id,
                "study_id": job.study_id,
                "number": job.number,
                "attempt": job.attempt,
            },
            "params": dict(job.params),
            "workload": job.workload,
            "job_dir": str(job_dir),
        }

    def render_script(self, variables: dict[str, Any]) -> str:
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as exc:
            raise InvalidInput(
                f"slurm template {self.template_name}: cannot render: {exc}", field="template"
            ) from exc

    def check(self, spec: dict[str, Any]) -> None:
        """Refuse a study whose resources or this runner's template cannot make a script."""
        super().check(spec)
        sample = TrialJob.sample(spec)
        prepared = PreparedJob(
            command="true", env={}, workdir=None, config_path="", metrics_path="", config_json=""
        )
        self.render_script(self.script_variables(sample, prepared, self.root))
        if shutil.which(self.bins["sbatch"]) is None:
            raise InvalidInput(
                f"sbatch ('{self.bins['sbatch']}') not found on this machine; the slurm "
                "runner submits with it (runner option 'sbatch')",
                field="sbatch",
            )

    # -- the runner interface ----------------------------------------------------------------

    def submit(self, job: TrialJob) -> SlurmHandle:
        files = self.job_dir(job)
        prepared = prepare(job, files)
        prepared.log_path = files / "job.log"
        prepared.log_path.unlink(missing_ok=True)
        script = files / "job.sbatch"
        script.write_text(self.render_script(self.script_variables(job, prepared, files)))
        submitted = time.monotonic()
        res = self._run("sbatch", "--parsable", str(script), cwd=files)
        if res.returncode != 0:
            raise SlurmError(
                f"sbatch exited with {res.returncode}: {(res.stderr or res.stdout).strip()}"
            )
        job_id = res.stdout.strip().splitlines()[-1].split(";")[0].strip() if res.stdout else ""
        if not job_id:
            raise SlurmError(f"sbatch printed no job id: {res.stderr.strip()}")
        with self._lock:
            self._queue.taken = -math.inf  # the next poll asks squeue afresh
        return SlurmHandle(
            job=job,
            prepared=prepared,
            job_id=job_id,
            job_dir=files,
            script_path=script,
            log_path=prepared.log_path,
            submitted=submitted,
            deadline=submitted + job.timeout_s + self.deadline_slack_s,
        )

    def poll(self, handle: SlurmHandle) -> Outcome | None:
        h = handle
        if h.outcome is not None:
            return h.outcome
        now = time.monotonic()
        if h.term_at is None and now >= h.deadline:
            log.info("slurm job %s passed the runner's deadline; cancelling it", h.job_id)
            h.timed_out = True
            h.term_at = now
            self._scancel(h)
        states = self._states(h.submitted)
        if states is None:  # squeue did not answer; the deadline still holds
            if h.term_at is not None and now - h.term_at >= self.kill_grace_s:
                return self._finish(h, None, None)
            return None
        if h.job_id in states:
            if h.term_at is not None and now - h.term_at >= self.kill_grace_s:
                return self._finish(h, None, None)  # cancelled, but it will not go away
            return None
        if now - h.looked_at < self.poll_interval_s:
            return None  # asked sacct/scontrol a moment ago: no new answer yet
        h.looked_at = now
        final = self._final_state(h.job_id)
        if final is None:
            if h.gone_since is None:
                h.gone_since = now
            if h.term_at is None and now - h.gone_since < _VANISHED_GRACE_S:
                return None
            return self._finish(h, None, None)
        return self._finish(h, *final)

    def cancel(self, handle: SlurmHandle) -> None:
        """``scancel`` the job (idempotent); the next poll reports it once it has gone."""
        h = handle
        if h.outcome is not None or h.cancelled:
            return
        h.cancelled = True
        if h.term_at is None:
            h.term_at = time.monotonic()
        self._scancel(h)

    def progress(self, handle: SlurmHandle) -> Progress | None:
        """What the job's :class:`~cubic.job.StepTimer` last wrote to ``progress.json`` (the
        job folder is on a file system the nodes share with the worker)."""
        return read_progress(handle.prepared.progress_path)

    def describe(self, handle: SlurmHandle) -> dict[str, Any]:
        return {"job_id": handle.job_id, "dir": str(handle.job_dir)}

    # -- internals --------------------------------------------------------------------------

    def _finish(self, h: SlurmHandle, state: str | None, returncode: int | None) -> Outcome:
        text = read_log(h.log_path)
        h.outcome = slurm_outcome(
            state,
            returncode,
            text,
            parse_metrics(text, h.prepared.metrics_path),
            objectives=h.job.objectives,
            timeout_s=h.job.timeout_s,
            cancelled_by_runner=h.cancelled,
            timed_out_by_runner=h.timed_out,
        )
        return h.outcome

    def _scancel(self, h: SlurmHandle) -> None:
        try:
            res = self._run("scancel", h.job_id)
        except SlurmError as exc:
            log.warning("slurm job %s: %s", h.job_id, exc)
            return
        if res.returncode != 0:
            log.warning("scancel %s exited with %s: %s", h.job_id, res.returncode, res.stderr)

    def _states(self, since: float) -> dict[str, str] | None:
        """Every queued or running job of this user, from one ``squeue`` per interval."""
        with self._lock:
            q = self._queue
            now = time.monotonic()
            if now - q.taken >= self.poll_interval_s or q.taken < since:
                q.taken = now
                q.states = self._squeue()
            return q.states

    def _squeue(self) -> dict[str, str] | None:
        try:
            res = self._run("squeue", "--noheader", f"--user={self._user}", "--format=%i|%T")
        except SlurmError as exc:
            log.warning("%s", exc)
            return None
        if res.returncode != 0:
            log.warning("squeue exited with %s: %s", res.returncode, res.stderr.strip())
            return None
        states = {}
        for line in res.stdout.splitlines():
            job_id, _, state = line.strip().partition("|")
            if job_id:
                states[job_id] = state
        return states

    def _final_state(self, job_id: str) -> tuple[str, int | None] | None:
        """How a job that has left the queue ended: sacct, else ``scontrol show job``."""
        if self._accounting:
            found = self._sacct(job_id)
            if found is not None:
                return found
        return self._scontrol(job_id)

    def _sacct(self, job_id: str) -> tuple[str, int | None] | None:
        try:
            res = self._run(
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                f"--jobs={job_id}",
                "--format=JobID,State,ExitCode",
            )
        except SlurmError:
            self._accounting = False
            return None
        if res.returncode != 0:
            if "disabled" in res.stderr.lower() or "not running" in res.stderr.lower():
                self._accounting = False
            return None
        for line in res.stdout.splitlines():
            fields = line.split("|")
            if len(fields) >= 3 and fields[0] == job_id and base_state(fields[1]) in FINAL_STATES:
                return fields[1], parse_exit_code(fields[2])
        return None

    def _scontrol(self, job_id: str) -> tuple[str, int | None] | None:
        try:
            res = self._run("scontrol", "show", "job", "--oneliner", job_id)
        except SlurmError as exc:
            log.warning("%s", exc)
            return None
        if res.returncode != 0:
            return None
        fields = dict(
            part.split("=", 1) for part in res.stdout.split() if "=" in part and part[0] != "="
        )
        state = fields.get("JobState", "")
        if base_state(state) not in FINAL_STATES:
            return None
        return state, parse_exit_code(fields.get("ExitCode"))


def _load_template(path: str | Path | None) -> tuple[str, jinja2.Template]:
    env = jinja2.sandbox.SandboxedEnvironment(
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True
    )
    env.filters["shell_quote"] = lambda v: shlex.quote(str(v))
    if path is None:
        name = f"built-in {BUILTIN_TEMPLATE}"
        text = (
            importlib_resources.files("cubic.runners") / "templates" / BUILTIN_TEMPLATE
        ).read_text()
    else:
        name = str(path)
        try:
            text = Path(path).expanduser().read_text()
        except OSError as exc:
            raise InvalidInput(f"slurm template {name}: {exc.strerror}", field="template") from exc
    try:
        return name, env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidInput(
            f"slurm template {name}: {exc.message} (line {exc.lineno})", field="template"
        ) from exc

"""The job contract, runner side: how a trial's config reaches a real job and how its end
becomes an outcome.

A job gets its config three ways at once: a JSON file (path in ``CUBIC_CONFIG``, the same
JSON inline in ``CUBIC_CONFIG_JSON`` for runners that share no files), one environment
variable per knob (``CUBIC_PARAM_MICRO_BATCH=4``) and command-line flags rendered into the
study's ``job.command`` template. It reports metrics by writing JSON to ``CUBIC_METRICS``,
by printing a line ``CUBIC_METRICS {"tokens_per_s": ...}``, or with :func:`cubic.job.report`,
which does both; while it runs, :class:`cubic.job.StepTimer` keeps its progress in the file
``CUBIC_PROGRESS`` names (:func:`read_progress`). Every runner ends a job through
:func:`classify`, so an out-of-memory error is ``infeasible`` (data for the search) and a
broken node or timeout is ``failed`` (retried) the same way everywhere.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox

from cubic.errors import InvalidInput
from cubic.job import PROGRESS_ENV
from cubic.outcome import Outcome
from cubic.pruning import Progress
from cubic.runners.base import TrialJob

METRICS_PREFIX = "CUBIC_METRICS"
LOG_TAIL_CHARS = 8192

# What the frameworks print when an accelerator or the host runs out of memory: PyTorch's
# CUDA and ROCm allocators (``torch.OutOfMemoryError: CUDA out of memory``, ``HIP out of
# memory``), cuBLAS/cuDNN allocation failures, NCCL's, XLA's ``RESOURCE_EXHAUSTED``, Python's
# ``MemoryError``, C++'s ``std::bad_alloc``, the kernel's or Slurm's OOM-kill notices, and
# Ray's memory monitor (``Task was killed due to the node running low on memory``).
OOM_RE = re.compile(
    r"out of memory|OutOfMemoryError|hipErrorOutOfMemory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED"
    r"|\bMemoryError\b|std::bad_alloc|oom[-_ ]kill|OOMKilled|running low on memory",
    re.IGNORECASE,
)
_METRICS_LINE = re.compile(rf"^{METRICS_PREFIX}[:=]?\s+(\{{.*\}})\s*$", re.MULTILINE)

_ENV = jinja2.sandbox.SandboxedEnvironment(
    undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False
)


def check_template(text: str) -> None:
    """Raise ValueError if ``text`` is not a valid Jinja2 template (used by the spec)."""
    try:
        _ENV.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"not a valid template: {exc.message} (line {exc.lineno})") from exc


def render(text: str, variables: dict[str, Any], *, field: str) -> str:
    """Render a user's template; an unknown name is an error that names the field."""
    try:
        return _ENV.from_string(text).render(**variables)
    except jinja2.TemplateError as exc:
        raise InvalidInput(f"{field}: cannot render template: {exc}", field=field) from exc


def flag_name(knob: str) -> str:
    return "--" + knob.replace("_", "-")


def render_flags(params: dict[str, Any]) -> list[str]:
    """Knobs as argparse-style flags: ``--micro-batch 4``; booleans as ``--bf16``/``--no-bf16``."""
    argv: list[str] = []
    for name, value in params.items():
        if isinstance(value, bool):
            argv.append(flag_name(name) if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            argv += [flag_name(name), str(value)]
    return argv


def param_env(params: dict[str, Any]) -> dict[str, str]:
    """One variable per knob: ``CUBIC_PARAM_<NAME>``; booleans as ``1``/``0``."""
    env = {}
    for name, value in params.items():
        key = "CUBIC_PARAM_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()
        if isinstance(value, bool):
            env[key] = "1" if value else "0"
        elif value is not None:
            env[key] = str(value)
    return env


def config_document(job: TrialJob) -> dict[str, Any]:
    """What ``CUBIC_CONFIG`` holds: the knobs and which trial they belong to."""
    return {
        "params": job.params,
        "trial": {
            "id": job.trial_id,
            "study_id": job.study_id,
            "number": job.number,
            "attempt": job.attempt,
        },
        "workload": job.workload,
        "objectives": list(job.objectives),
        "warmup_steps": int(job.job.get("warmup_steps", 0)),
    }


@dataclass(slots=True)
class PreparedJob:
    """A trial's job made concrete for one runner: command, environment, files."""

    command: str
    env: dict[str, str]
    workdir: Path | None
    config_path: str
    metrics_path: str
    config_json: str
    log_path: Path | None = None
    progress_path: str | None = None


def prepare(
    job: TrialJob, files_dir: Path | str | None, *, remote_dir: str | None = None
) -> PreparedJob:
    """Render the command and environment of ``job``; write its config file to ``files_dir``.

    ``remote_dir`` is where the job will see its files when it runs elsewhere (a Ray or
    Kubernetes pod): the paths in the environment point there, and the job's wrapper writes
    ``CUBIC_CONFIG_JSON`` to ``CUBIC_CONFIG`` before it starts.
    """
    spec = job.job
    if not spec or not spec.get("command"):
        raise InvalidInput(
            f"study {job.study_id} has no job.command; a real runner needs one "
            "(only the simulated runner runs without it)",
            field="job.command",
        )
    config_json = json.dumps(config_document(job), sort_keys=True)
    local = Path(files_dir) if files_dir is not None else None
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
        (local / "config.json").write_text(config_json)
    base = remote_dir if remote_dir is not None else str(local)
    config_path, metrics_path = f"{base}/config.json", f"{base}/metrics.json"
    progress_path = f"{base}/progress.json"
    if local is not None:
        (local / "metrics.json").unlink(missing_ok=True)
        (local / "progress.json").unlink(missing_ok=True)
    flags = render_flags(job.params)
    variables = {
        **job.params,
        "params": job.params,
        "flags": shlex.join(flags),
        "trial": config_document(job)["trial"],
        "workload": job.workload,
        "config_path": config_path,
        "metrics_path": metrics_path,
    }
    command = render(spec["command"], variables, field="job.command")
    env = {
        "CUBIC_CONFIG": config_path,
        "CUBIC_CONFIG_JSON": config_json,
        "CUBIC_METRICS": metrics_path,
        PROGRESS_ENV: progress_path,
        "CUBIC_TRIAL_ID": str(job.trial_id),
        "CUBIC_STUDY_ID": str(job.study_id),
        "CUBIC_TRIAL_NUMBER": str(job.number),
        "CUBIC_ATTEMPT": str(job.attempt),
        "CUBIC_WARMUP_STEPS": str(int(spec.get("warmup_steps", 0))),
        **param_env(job.params),
    }
    for key, value in (spec.get("env") or {}).items():
        env[key] = render(str(value), variables, field=f"job.env.{key}")
    workdir = spec.get("workdir")
    return PreparedJob(
        command=command,
        env=env,
        workdir=Path(workdir).expanduser() if workdir else None,
        config_path=config_path,
        metrics_path=metrics_path,
        config_json=config_json,
        progress_path=progress_path,
    )


def remote_command(prepared: PreparedJob) -> str:
    """The command wrapped to write ``CUBIC_CONFIG`` from ``CUBIC_CONFIG_JSON`` first."""
    return (
        'mkdir -p "$(dirname "$CUBIC_CONFIG")" && printf %s "$CUBIC_CONFIG_JSON" > "$CUBIC_CONFIG"'
        f" && {prepared.command}"
    )


def parse_metrics(log: str, metrics_file: str | None = None) -> dict[str, Any] | None:
    """The job's metrics: the ``CUBIC_METRICS`` file, else the last metrics line of its log."""
    if metrics_file is not None:
        try:
            doc = json.loads(Path(metrics_file).read_text())
        except (OSError, ValueError):
            doc = None
        if isinstance(doc, dict) and doc:
            return doc
    for match in reversed(_METRICS_LINE.findall(log or "")):
        try:
            doc = json.loads(match)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def read_progress(path: str | Path | None) -> Progress | None:
    """The progress a running job last wrote (None: none yet, or unreadable)."""
    if path is None:
        return None
    try:
        return Progress.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, InvalidInput):
        return None


def tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text[-limit:]


def oom_line(log: str) -> str | None:
    """The first line of ``log`` that says the job ran out of memory."""
    match = OOM_RE.search(log or "")
    if match is None:
        return None
    start = log.rfind("\n", 0, match.start()) + 1
    end = log.find("\n", match.end())
    return log[start : end if end >= 0 else len(log)].strip()[:500]


def classify(
    returncode: int | None,
    log: str,
    metrics: dict[str, Any] | None,
    *,
    objectives: tuple[str, ...] | list[str] = (),
    oom_killed: bool = False,
    timed_out: bool = False,
    timeout_s: float | None = None,
    cancelled: bool = False,
    lost: str | None = None,
) -> Outcome:
    """Turn how a job ended into an outcome, the same for every runner.

    Out of memory (a message in the log, or the scheduler's or kernel's OOM kill) is
    ``infeasible``; a timeout, cancel, lost node or preemption (``lost``) is ``failed`` and
    retried; any other non-zero exit is ``failed`` with the log's tail; a clean exit needs the
    objective metrics.
    """
    log_tail = tail(log) if log else None
    if cancelled:
        return Outcome("failed", error="cancelled", log_tail=log_tail)
    if timed_out:
        limit = f" after {timeout_s:g} s" if timeout_s is not None else ""
        return Outcome("failed", error=f"timeout{limit}", log_tail=log_tail)
    if lost:
        return Outcome("failed", error=lost, log_tail=log_tail)
    line = oom_line(log) if returncode != 0 else None
    if oom_killed or line is not None:
        why = line or "the job was killed for exceeding its memory (OOM kill)"
        return Outcome("infeasible", error=f"out of memory: {why}", log_tail=log_tail)
    if returncode != 0:
        code = "unknown" if returncode is None else str(returncode)
        return Outcome("failed", error=f"job exited with code {code}", log_tail=log_tail)
    if not metrics:
        return Outcome(
            "failed",
            error=f"job exited 0 but reported no metrics (write {METRICS_PREFIX} or print a "
            f"'{METRICS_PREFIX} {{...}}' line)",
            log_tail=log_tail,
        )
    missing = [m for m in objectives if m not in metrics]
    if missing:
        return Outcome(
            "failed",
            error=f"job reported no objective metric(s) {missing}; got {sorted(metrics)}",
            log_tail=log_tail,
        )
    return Outcome("complete", metrics=metrics, log_tail=log_tail)

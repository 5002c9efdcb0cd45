"""The ``local`` runner: each trial's job is a subprocess on the worker's machine.

The job runs in its own session and process group, so that a timeout or cancel stops all of
it (``torchrun`` and every rank it started), not just the shell that started it: SIGTERM to
the group, then SIGKILL after ``kill_grace_s``. Its stdout and stderr go to ``job.log`` next
to ``config.json`` and ``metrics.json`` in a folder per trial attempt under ``root``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cubic.outcome import Outcome
from cubic.pruning import Progress
from cubic.runners.base import Runner, TrialJob
from cubic.runners.contract import PreparedJob, classify, parse_metrics, prepare, read_progress


@dataclass(slots=True)
class LocalHandle:
    job: TrialJob
    prepared: PreparedJob
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    deadline: float
    term_at: float | None = None
    timed_out: bool = False
    cancelled: bool = False
    outcome: Outcome | None = None


def read_log(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return ""


class LocalRunner(Runner):
    name = "local"

    def __init__(
        self,
        *,
        root: str | Path | None = None,
        kill_grace_s: float = 10.0,
        shell: str = "/bin/bash",
    ) -> None:
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="cubic-jobs-"))
        self.kill_grace_s = kill_grace_s
        self.shell = shell

    def job_dir(self, job: TrialJob) -> Path:
        return self.root / f"study-{job.study_id}" / f"trial-{job.trial_id}-attempt-{job.attempt}"

    def submit(self, job: TrialJob) -> LocalHandle:
        files = self.job_dir(job)
        prepared = prepare(job, files)
        prepared.log_path = files / "job.log"
        log = prepared.log_path.open("wb")
        try:
            proc = subprocess.Popen(
                prepared.command,
                shell=True,
                executable=self.shell,
                cwd=prepared.workdir,
                env={**os.environ, **prepared.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed whole
            )
        except OSError:
            log.close()
            raise
        return LocalHandle(job, prepared, proc, log, time.monotonic() + job.timeout_s)

    def _signal(self, h: LocalHandle, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(h.proc.pid, sig)

    def poll(self, handle: LocalHandle) -> Outcome | None:
        h = handle
        if h.outcome is not None:
            return h.outcome
        rc = h.proc.poll()
        now = time.monotonic()
        if rc is None:
            if h.term_at is None and now >= h.deadline:
                h.timed_out = True
                self._terminate(h)
            elif h.term_at is not None and now - h.term_at >= self.kill_grace_s:
                self._signal(h, signal.SIGKILL)
            return None
        self._signal(h, signal.SIGKILL)  # whatever the job left behind in its group
        h.log.close()
        assert h.prepared.log_path is not None
        log = read_log(h.prepared.log_path)
        ours = h.term_at is not None
        h.outcome = classify(
            rc,
            log,
            parse_metrics(log, h.prepared.metrics_path),
            objectives=h.job.objectives,
            oom_killed=not ours and rc != 0 and killed_by_sigkill(rc, log),
            timed_out=h.timed_out,
            timeout_s=h.job.timeout_s,
            cancelled=h.cancelled,
        )
        return h.outcome

    def _terminate(self, h: LocalHandle) -> None:
        h.term_at = time.monotonic()
        self._signal(h, signal.SIGTERM)

    def cancel(self, handle: LocalHandle) -> None:
        """Stop the job's whole process group and wait for it (idempotent)."""
        h = handle
        if h.proc.poll() is not None:
            return
        h.cancelled = True
        if h.term_at is None:
            self._terminate(h)
        try:
            h.proc.wait(timeout=max(0.0, self.kill_grace_s - (time.monotonic() - h.term_at)))
        except subprocess.TimeoutExpired:
            self._signal(h, signal.SIGKILL)
            h.proc.wait()
        self._signal(h, signal.SIGKILL)

    def progress(self, handle: LocalHandle) -> Progress | None:
        """What the job's :class:`~cubic.job.StepTimer` last wrote to ``progress.json``."""
        return read_progress(handle.prepared.progress_path)

    def describe(self, handle: LocalHandle) -> dict[str, Any]:
        return {"pid": handle.proc.pid, "dir": str(handle.prepared.log_path.parent)}


def killed_by_sigkill(returncode: int | None, log: str) -> bool:
    """A SIGKILL nobody here sent: on Linux that is the kernel's OOM killer.

    ``torchrun`` reports a rank killed that way as ``exitcode: -9`` and exits 1 itself.
    """
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return True
    return "exitcode: -9" in log or "Signals.SIGKILL" in log

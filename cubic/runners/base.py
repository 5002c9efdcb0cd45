"""The runner interface: where a trial's job runs.

Lifecycle: the worker calls ``submit(job)`` once per leased trial and gets a handle, then
``poll(handle)`` until it returns an :class:`~cubic.outcome.Outcome`, and ``cancel(handle)``
when the job must stop (shutdown, timeout, a slow trial pruned); ``progress(handle)`` says
how far a running job has got, where the runner can see it. A runner turns the config into
what the job reads and the job's exit into an outcome (out of memory -> ``infeasible``; lost
node or timeout -> ``failed``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cubic.outcome import Outcome
from cubic.pruning import Progress


@dataclass(frozen=True, slots=True)
class TrialJob:
    """What a runner needs to start one trial's job."""

    trial_id: int
    study_id: int
    number: int
    attempt: int
    params: dict[str, Any]
    workload: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 3600.0
    job: dict[str, Any] = field(default_factory=dict)  # the study's ``job`` section
    objectives: tuple[str, ...] = ()

    @classmethod
    def sample(cls, spec: dict[str, Any], **job: Any) -> TrialJob:
        """A stand-in trial of a study (no knobs) to check its templates before leasing;
        ``job`` overrides fields of the study's ``job`` section."""
        workload = spec.get("workload")
        return cls(
            trial_id=0,
            study_id=0,
            number=0,
            attempt=1,
            params={},
            workload=workload if isinstance(workload, dict) else {},
            timeout_s=float(spec.get("trial_timeout_s", 3600.0)),
            job={**(spec.get("job") or {}), **job},
        )


class Runner(ABC):
    """Starts, watches and stops jobs. One instance serves one worker."""

    name: ClassVar[str]
    needs_command: ClassVar[bool] = True  # runs the study's ``job.command``

    def check(self, spec: dict[str, Any]) -> None:
        """Refuse a study this runner cannot run, before any trial is leased."""
        if self.needs_command and not (spec.get("job") or {}).get("command"):
            from cubic.errors import InvalidInput

            raise InvalidInput(
                f"study '{spec.get('name')}' has no job.command; the '{self.name}' runner runs "
                "the study's job (see the job contract in the README)",
                field="job.command",
            )

    def describe(self, handle: Any) -> dict[str, Any]:
        """Where the job runs (pid, scheduler job id, folder), for the worker's log."""
        return {}

    def progress(self, handle: Any) -> Progress | None:
        """How far the running job has got (None where this runner cannot see it): what a
        study that stops slow trials early judges them by."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most runners hold nothing
        """Release what the runner holds (connections, temporary files)."""

    @abstractmethod
    def submit(self, job: TrialJob) -> Any:
        """Start the job; return a handle for ``poll`` and ``cancel``."""

    @abstractmethod
    def poll(self, handle: Any) -> Outcome | None:
        """The outcome once the job has ended, else None."""

    @abstractmethod
    def cancel(self, handle: Any) -> None:
        """Stop the job (idempotent)."""

"""Immutable snapshots returned by the store.

Callers never see ORM rows: a row is tied to a session and can change under the caller, a
snapshot cannot. The dicts and lists inside a snapshot are private copies, so mutating them
changes nothing in the database and nothing in any other snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar


class TrialState(StrEnum):
    """Life cycle of a trial: ``waiting`` -> ``running`` -> one of the finished states."""

    WAITING = "waiting"
    RUNNING = "running"
    COMPLETE = "complete"
    INFEASIBLE = "infeasible"
    FAILED = "failed"
    PRUNED = "pruned"

    FINISHED: ClassVar[frozenset[TrialState]]
    MEASURED: ClassVar[frozenset[TrialState]]
    LEARNED: ClassVar[frozenset[TrialState]]

    @property
    def is_finished(self) -> bool:
        """Whether the state is terminal (the trial will never change again)."""
        return self in TrialState.FINISHED


TrialState.FINISHED = frozenset(
    {TrialState.COMPLETE, TrialState.INFEASIBLE, TrialState.FAILED, TrialState.PRUNED}
)
TrialState.MEASURED = frozenset({TrialState.COMPLETE, TrialState.PRUNED})
"""States whose metrics measure how fast the config ran: a pruned trial was stopped early, but
the throughput it measured until then is data (it says the config is slow)."""
TrialState.LEARNED = TrialState.MEASURED | {TrialState.INFEASIBLE}
"""Finished trials a search learns from: how fast a config ran, or that it cannot run (a
failed trial says nothing about its config)."""


class StudyState(StrEnum):
    """Life cycle of a study; ``archived`` is final and cannot be resumed."""

    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    COMPLETED = "completed"
    ARCHIVED = "archived"


TRIAL_SOURCES: frozenset[str] = frozenset({"strategy", "baseline", "enqueued", "imported", "retry"})
"""Where a trial's configuration came from."""


@dataclass(frozen=True, slots=True)
class Study:
    """One search job. ``spec`` is the full study description (workload, space, objective)."""

    id: int
    name: str
    spec: dict[str, Any]
    workload_kind: str
    state: StudyState
    max_attempts: int
    created_at: datetime
    updated_at: datetime
    owner_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class StudyCounts:
    """A study's state and the counts the tuner decides with (kept by the store)."""

    state: StudyState
    proposed: int  # first attempts, imported past runs excluded
    waiting: int
    running: int
    gpu_hours: float  # reported by its own trials (imports excluded)

    @property
    def active(self) -> int:
        return self.waiting + self.running


class Role(StrEnum):
    """What a token may do: readers read; submitters create and manage their own studies;
    workers lease, heartbeat, report and release; admins everything."""

    ADMIN = "admin"
    SUBMITTER = "submitter"
    WORKER = "worker"
    READER = "reader"


@dataclass(frozen=True, slots=True)
class ApiToken:
    """An API token's record (never its secret). ``study_id`` limits it to one study."""

    id: int
    name: str
    role: Role
    study_id: int | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, slots=True)
class Trial:
    """One configuration of a study and what happened to it.

    ``number`` is the 0-based position within the study, ``attempt`` is 1-based and grows
    when a failed trial is retried as a new trial (``retry_of`` points at the failed one).
    """

    id: int
    study_id: int
    number: int
    params: dict[str, Any]
    state: TrialState
    source: str
    metrics: dict[str, Any] | None
    predicted: dict[str, Any] | None
    worker_id: str | None
    lease_token: str | None
    lease_deadline: datetime | None
    attempt: int
    retry_of: int | None
    error: str | None
    log_tail: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def is_finished(self) -> bool:
        """Whether the trial is in a terminal state."""
        return self.state.is_finished

    @classmethod
    def detached(
        cls,
        id: int,
        params: dict[str, Any],
        state: TrialState | str,
        metrics: dict[str, Any] | None = None,
        *,
        study_id: int = 1,
        predicted: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> Trial:
        """A trial that never went through a store (number ``id - 1``, attempt 1).

        Benchmarks that replay the search loop in memory, and tests of strategies, build
        their history with it; a strategy cannot tell it from a stored trial.
        """
        now = datetime.now(UTC)
        return cls(
            id=id,
            study_id=study_id,
            number=id - 1,
            params=params,
            state=TrialState(state),
            source="strategy",
            metrics=metrics,
            predicted=predicted,
            worker_id=None,
            lease_token=None,
            lease_deadline=None,
            attempt=1,
            retry_of=None,
            error=error,
            log_tail=None,
            created_at=now,
            started_at=now,
            finished_at=now,
        )


@dataclass(frozen=True, slots=True)
class TrialEvent:
    """One state transition of a trial; ``from_state`` is None when the trial was created."""

    id: int
    trial_id: int
    from_state: TrialState | None
    to_state: TrialState
    at: datetime
    worker_id: str | None
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProxyModelVersion:
    """A persisted proxy model for one workload kind; ``version`` increases per kind.

    ``model`` is the JSON payload (e.g. XGBoost's JSON dump), ``features`` the ordered
    feature names the model was trained on.
    """

    id: int
    workload_kind: str
    version: int
    created_at: datetime
    n_train: int
    metrics: dict[str, Any]
    model: dict[str, Any]
    features: list[str]

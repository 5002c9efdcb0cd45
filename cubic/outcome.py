"""What a finished job reports: the outcome every runner produces and the tuner consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OUTCOME_STATES = ("complete", "infeasible", "failed", "pruned")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a trial ended.

    ``complete`` carries measured metrics; ``infeasible`` means the config cannot run (out of
    memory, invalid layout) and is data for the search, never retried; ``failed`` means the
    infrastructure broke and the trial is retried up to the study's cap; ``pruned`` means it
    was stopped early because it was clearly slow.
    """

    state: str
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    log_tail: str | None = None

    def __post_init__(self) -> None:
        if self.state not in OUTCOME_STATES:
            raise ValueError(f"state: expected one of {OUTCOME_STATES}, got {self.state!r}")

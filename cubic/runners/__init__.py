"""Runners: one module per place a trial can run, found by name here."""

from __future__ import annotations

from typing import Any

from cubic.errors import InvalidInput
from cubic.runners.base import Runner, TrialJob
from cubic.runners.simulated import SimulatedRunner

REGISTRY: dict[str, type[Runner]] = {SimulatedRunner.name: SimulatedRunner}


def make_runner(name: str, **options: Any) -> Runner:
    cls = REGISTRY.get(name)
    if cls is None:
        raise InvalidInput(
            f"runner '{name}' is not available; known: {', '.join(sorted(REGISTRY))}",
            field="runner",
        )
    return cls(**options)


__all__ = ["REGISTRY", "Runner", "TrialJob", "make_runner"]

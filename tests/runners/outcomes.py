"""Polling a runner until its job ends, as the worker does, for the runner tests."""

from __future__ import annotations

import time
from typing import Any

from cubic.outcome import Outcome
from cubic.runners.base import Runner


def wait(runner: Runner, handle: Any, limit: float = 60.0, every: float = 0.02) -> Outcome:
    """The job's outcome; fails the test if it has not ended within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        outcome = runner.poll(handle)
        if outcome is not None:
            return outcome
        time.sleep(every)
    raise AssertionError(f"the job ({handle!r:.200}) did not end within {limit} s")

"""Backoff with full jitter within an outage budget, and the server's ``Retry-After``."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from cubic.retry import LEASE_BACKOFF_MAX, Backoff, lease_wait, parse_retry_after


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_waits_are_jittered_under_a_growing_capped_ceiling() -> None:
    clock = _Clock()
    b = Backoff(outage_s=1e9, base_s=0.5, cap_s=4.0, rng=random.Random(0), clock=clock)
    waits = [b.next_wait() for _ in range(400)]
    assert all(w is not None for w in waits)
    assert all(0 <= w <= min(4.0, 0.5 * 2**i) for i, w in enumerate(waits))  # type: ignore[operator]
    late = waits[10:]
    assert max(late) > 3.5 and min(late) < 0.5  # full jitter: anywhere under the cap


def test_retry_after_is_a_floor_and_the_budget_ends_the_call() -> None:
    clock = _Clock()
    b = Backoff(outage_s=10.0, base_s=0.1, cap_s=0.1, rng=random.Random(1), clock=clock)
    assert b.next_wait(retry_after=3.0) == 3.0
    clock.now = 8.0
    assert b.next_wait(retry_after=5.0) == 2.0  # never past the budget
    clock.now = 10.0
    assert b.next_wait() is None


def test_retry_after_forms() -> None:
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-3") == 0.0
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Tue, 01 Dec 2026 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None


def test_a_run_of_short_leases_stretches_the_hint_up_to_a_cap() -> None:
    rng = random.Random(0)
    for short in range(1, 12):
        stretch = min(2.0 ** (short - 1), LEASE_BACKOFF_MAX)
        waits = [lease_wait(0.25, short, rng) for _ in range(200)]
        assert 0.125 * stretch <= min(waits) and max(waits) <= 0.25 * stretch
        assert max(waits) - min(waits) > 0.05 * stretch  # jittered: workers spread out
    assert lease_wait(0.25, 0, rng) <= 0.25  # a first short lease: about the hint

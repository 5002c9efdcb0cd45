"""How a client waits out an outage: exponential backoff with full jitter, within a budget.

A restart of the API or a failover of its database takes seconds to minutes; a worker that
gives up after a few quick retries loses the results it holds and leaves its GPUs idle. So a
call that is safe to repeat is retried until an *outage budget* (15 minutes by default) has
passed since its first failure. Each wait is drawn uniformly from zero to an exponentially
growing ceiling ("full jitter": hundreds of workers that lost the service at the same moment
do not come back at the same moment), and is never shorter than what the server asked for in
``Retry-After``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

DEFAULT_OUTAGE_S = 900.0
"""How long a client keeps retrying before it reports the service unreachable."""

INTERACTIVE_OUTAGE_S = 60.0
"""The same for a command a person waits on (``cubic submit``, ``status``, ``best``...): a
worker rides through a restart of the service; a typo in ``--url`` should not take 15 min."""


@dataclass(slots=True)
class Backoff:
    """The waits of one call: ``next_wait(retry_after)`` until it returns ``None``.

    ``base_s * 2**attempt`` (at most ``cap_s``) is the ceiling of the attempt's jittered
    wait; ``outage_s`` bounds the time from the first failure (``clock`` seconds, requests
    that hang until their timeout included) after which the call gives up.
    """

    outage_s: float = DEFAULT_OUTAGE_S
    base_s: float = 0.2
    cap_s: float = 10.0
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.monotonic
    attempt: int = 0
    started: float | None = None

    def next_wait(self, retry_after: float | None = None) -> float | None:
        """Seconds to wait before the next try, or ``None`` once the budget is spent."""
        now = self.clock()
        if self.started is None:
            self.started = now
        left = self.outage_s - (now - self.started)
        if left <= 0:
            return None
        ceiling = min(self.cap_s, self.base_s * 2.0**self.attempt)
        wait = self.rng.uniform(0.0, ceiling)
        if retry_after is not None:
            wait = max(wait, retry_after)
        self.attempt += 1
        return min(wait, left)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), else ``None``."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


LEASE_BACKOFF_MAX = 8.0
"""The most a run of short leases stretches the service's ``retry_after_s`` (times)."""


def lease_wait(hint_s: float, short_leases: int, rng: random.Random) -> float:
    """How long a worker waits before it leases again, after ``short_leases`` leases in a
    row that came back with fewer trials than it asked for, the last one hinting ``hint_s``.

    The service's hint is what one worker should wait; when many wait for the same proposal
    round, asking that often only costs the service CPU. So each further short lease doubles
    the wait, up to :data:`LEASE_BACKOFF_MAX` times the hint, drawn from its upper half so
    that the workers of a study spread out and none asks sooner than the hint's half.
    """
    stretch = min(2.0 ** max(0, short_leases - 1), LEASE_BACKOFF_MAX)
    return hint_s * stretch * rng.uniform(0.5, 1.0)

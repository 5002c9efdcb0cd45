"""Prometheus metrics in the text exposition format, without a client library.

A few thread-safe counters and histograms are all the API needs; the gauges of trials per
state are read from the database when ``/metrics`` is scraped. Each API process keeps its own
counters (scrape every process, or sum them in Prometheus).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

Labels = tuple[tuple[str, str], ...]


def escape(value: str) -> str:
    """A label value as the exposition format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_labels(labels: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{escape(str(v))}"' for k, v in labels)
    return "{" + inner + "}" if inner else ""


def format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if value != int(value) else str(int(value))


class Histogram:
    """Cumulative buckets, a sum and a count; ``observe`` is safe from any thread."""

    def __init__(
        self, name: str, help_text: str, buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        if list(buckets) != sorted(buckets) or not buckets:
            raise ValueError("buckets must be a non-empty increasing sequence")
        self.name = name
        self.help = help_text
        self.bounds = (*(float(b) for b in buckets), math.inf)
        self._counts = [0] * len(self.bounds)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    self._counts[i] += 1
                    break
            self._sum += value

    @contextmanager
    def time(self) -> Iterator[None]:
        """Observe how long the block takes, whether or not it raises."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - start)

    def snapshot(self) -> tuple[list[int], float]:
        """Cumulative bucket counts and the sum, read together."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for c in counts:
            running += c
            cumulative.append(running)
        return cumulative, total

    def expose(self) -> list[str]:
        cumulative, total = self.snapshot()
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for bound, count in zip(self.bounds, cumulative, strict=True):
            lines.append(f'{self.name}_bucket{{le="{format_value(bound)}"}} {count}')
        lines.append(f"{self.name}_sum {format_value(total)}")
        lines.append(f"{self.name}_count {cumulative[-1]}")
        return lines


class Counter:
    """A monotonically increasing count, optionally per label set."""

    def __init__(self, name: str, help_text: str) -> None:
        if not name.endswith("_total"):
            raise ValueError("a counter's name ends in _total")
        self.name = name
        self.help = help_text
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def expose(self) -> list[str]:
        with self._lock:
            values = dict(self._values) or {(): 0.0}
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        lines += [
            f"{self.name}{format_labels(k)} {format_value(v)}" for k, v in sorted(values.items())
        ]
        return lines


def gauge(name: str, help_text: str, samples: Iterable[tuple[Labels, float]]) -> list[str]:
    """A gauge family read at scrape time (no state kept here)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{format_labels(labels)} {format_value(v)}" for labels, v in samples]
    return lines


LEASE_LATENCY = Histogram(
    "cubic_lease_latency_seconds", "Time to answer a lease request (it never proposes)."
)
PROPOSAL = Histogram(
    "cubic_proposal_seconds",
    "Time the background proposer took for one study's round (fit included).",
    FIT_BUCKETS,
)
REPORT_LATENCY = Histogram(
    "cubic_report_latency_seconds", "Time to record a trial's reported outcome."
)
PROXY_FIT = Histogram("cubic_proxy_fit_seconds", "Time to fit a proxy model.", FIT_BUCKETS)
REAPED = Counter(
    "cubic_reaped_trials_total", "Trials whose lease expired and that were failed by the reaper."
)

PROCESS_METRICS: tuple[Histogram | Counter, ...] = (
    LEASE_LATENCY,
    PROPOSAL,
    REPORT_LATENCY,
    PROXY_FIT,
    REAPED,
)


def observe_proposal(seconds: float) -> None:
    """Record one background proposal round."""
    PROPOSAL.observe(seconds)


def observe_proxy_fit(seconds: float) -> None:
    """Record one proxy-model fit; the hook the proxy code calls after fitting."""
    PROXY_FIT.observe(seconds)


def exposition(extra: Iterable[list[str]] = ()) -> str:
    """The whole text page: this process's metrics, then ``extra`` families."""
    lines: list[str] = []
    for metric in PROCESS_METRICS:
        lines += metric.expose()
    for family in extra:
        lines += family
    return "\n".join(lines) + "\n"

"""Prometheus metrics through ``prometheus_client``, summed over every API process.

Under several API processes (``cubic serve --workers N``, ``uvicorn --workers N``) a scrape
reaches one of them at random; with ``PROMETHEUS_MULTIPROC_DIR`` set (``cubic serve`` sets
and empties one) each process keeps its counters and histograms in files there and any
scrape adds them all up. Without it, the counts are this process's own. The gauges of
studies and trials per state are read from the database when ``/metrics`` is scraped.

``PROMETHEUS_MULTIPROC_DIR`` is read when ``prometheus_client`` is first imported, so it
must be set before the API process starts, and emptied before the first one does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

Labels = tuple[tuple[str, str], ...]

# A ``*_created`` series per family is noise here (and absent in multiprocess mode anyway).
prometheus_client.disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's metrics (not the default registry: nothing else of the process's)."""

LEASE_LATENCY = Histogram(
    "cubic_lease_latency_seconds",
    "Time to answer a lease request (it never proposes).",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
PROPOSAL = Histogram(
    "cubic_proposal_seconds",
    "Time the background proposer took for one study's round (fit included).",
    buckets=FIT_BUCKETS,
    registry=REGISTRY,
)
REPORT_LATENCY = Histogram(
    "cubic_report_latency_seconds",
    "Time to record a trial's reported outcome.",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
PROXY_FIT = Histogram(
    "cubic_proxy_fit_seconds", "Time to fit a proxy model.", buckets=FIT_BUCKETS, registry=REGISTRY
)
REAPED = Counter(
    "cubic_reaped_trials",  # exposed as cubic_reaped_trials_total
    "Trials whose lease expired and that were failed by the reaper.",
    registry=REGISTRY,
)


def multiprocess() -> bool:
    """Whether this process shares its counts with the others (``PROMETHEUS_MULTIPROC_DIR``)."""
    return bool(os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()))


def observe_proposal(seconds: float) -> None:
    """Record one background proposal round."""
    PROPOSAL.observe(seconds)


def observe_proxy_fit(seconds: float) -> None:
    """Record one proxy-model fit; the hook the proxy code calls after fitting."""
    PROXY_FIT.observe(seconds)


class _Gauges(Collector):
    """Gauge families computed by the caller at scrape time (no state kept here)."""

    def __init__(self, families: Iterable[GaugeMetricFamily]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Any]:
        yield from self.families


def gauge(name: str, help_text: str, samples: Iterable[tuple[Labels, float]]) -> GaugeMetricFamily:
    """A gauge family read at scrape time; every sample has the same label names."""
    rows = list(samples)
    names = [k for k, _ in rows[0][0]] if rows else []
    family = GaugeMetricFamily(name, help_text, labels=names)
    for labels, value in rows:
        family.add_metric([v for _, v in labels], value)
    return family


def exposition(extra: Iterable[GaugeMetricFamily] = ()) -> str:
    """The whole text page: the counters and histograms (of every API process in
    multiprocess mode, else of this one), then ``extra`` gauge families."""
    registry = CollectorRegistry()
    if multiprocess():
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry)
    else:
        registry.register(_Registry(REGISTRY))
    registry.register(_Gauges(extra))
    return generate_latest(registry).decode()


class _Registry(Collector):
    """This process's registry as one collector of the page's."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        yield from self.source.collect()

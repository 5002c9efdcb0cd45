"""Objective values and constraint checks of finished trials, shared by tuner and strategies."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cubic.errors import InvalidInput
from cubic.study import StudySpec
from cubic.workload import Workload

GIB = 2.0**30

READ_METRICS = ("gpu_hours", "peak_memory_gib", "peak_memory_gb", "error_score", "throughput")
"""Metrics cubic itself reads (besides a study's objectives): each must be a number."""
_NON_NEGATIVE = {"gpu_hours", "peak_memory_gib", "peak_memory_gb", "error_score"}
_MAX_ABS = 1e300  # beyond what any measurement needs, and far from float overflow


def number(value: Any) -> float | None:
    """``value`` as a finite float if it is a real number (not a bool or string), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return f if math.isfinite(f) and abs(f) <= _MAX_ABS else None


def check_metrics(spec: StudySpec, metrics: Mapping[str, Any], field: str = "metrics") -> None:
    """Refuse a report whose metrics cubic cannot use: every objective and every metric in
    :data:`READ_METRICS` that is present must be a finite number (the non-negative ones
    not below zero). A bad value is refused at the door, so it can never poison a study
    (its best, its GPU-hour budget, its proxy model)."""
    names = [o.metric for o in spec.objectives] + [m for m in READ_METRICS if m in metrics]
    for name in dict.fromkeys(names):
        if name not in metrics:
            continue
        v = number(metrics[name])
        if v is None:
            raise InvalidInput(
                f"{field}.{name}: expected a finite number, got {metrics[name]!r:.80}",
                field=f"{field}.{name}",
            )
        if name in _NON_NEGATIVE and v < 0:
            raise InvalidInput(f"{field}.{name}: must not be negative", field=f"{field}.{name}")


def reported_peak_bytes(metrics: Mapping[str, Any] | None) -> float | None:
    """The peak memory per GPU a job reported, in bytes: ``peak_memory_gib`` (what
    ``torch.cuda.max_memory_allocated`` gives over 2**30) or ``peak_memory_gb`` (10**9)."""
    if not metrics:
        return None
    for key, unit in (("peak_memory_gib", GIB), ("peak_memory_gb", 1e9)):
        v = number(metrics.get(key))
        if v is not None and v > 0:
            return v * unit
    return None


THROUGHPUT_POWER = {
    "throughput": 1,
    "tokens_per_s": 1,
    "samples_per_s": 1,
    "mfu": 1,
    "cost": -1,
    "step_time_s": -1,
}
"""How each throughput-derived objective scales with throughput on a fixed cluster: as
throughput itself (MFU) or as its inverse (cost, step time). Peak memory is the one
objective that does not follow throughput."""
MEMORY_METRIC = "peak_memory_gb"
"""The peak-memory objective: per GPU, in 10^9 bytes (``peak_memory_gib`` is read too)."""


def cost_per_million(throughput: Any, num_gpus: Any) -> Any:
    """GPU-hours per million tokens (LLM) or samples (DLRM): the ``cost`` objective, from a
    throughput (tokens or samples per second over the whole job) and the GPUs it holds.
    Works on floats and NumPy arrays alike; every producer of ``cost`` computes it here."""
    return num_gpus / (throughput * 3600.0) * 1e6


def job_gpus(workload: Workload, params: Mapping[str, Any] | None = None) -> int:
    """The GPUs a config runs on: its ``num_gpus`` knob if the space has one, else the
    cluster's."""
    return int((params or {}).get("num_gpus", workload.cluster.num_gpus))


def metric_value(metrics: Mapping[str, Any], name: str, gpus: int | None = None) -> float | None:
    """A metric of a job as a finite number, or None. A job that reports its throughput but
    not its ``cost`` gets the cost derived (:func:`cost_per_million`, when ``gpus`` is known),
    and ``peak_memory_gb`` is read from ``peak_memory_gib`` too."""
    v = number(metrics.get(name))
    if v is not None:
        return v
    if name == "cost" and gpus:
        thr = next(
            (
                t
                for k in ("throughput", "tokens_per_s", "samples_per_s")
                for t in [number(metrics.get(k))]
                if t is not None and t > 0
            ),
            None,
        )
        return None if thr is None else float(cost_per_million(thr, gpus))
    if name == MEMORY_METRIC:
        peak = reported_peak_bytes(metrics)
        return None if peak is None else peak / 1e9
    return None


def violations(
    spec: StudySpec,
    workload: Workload,
    metrics: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why a complete trial breaks the study's constraints (empty when it respects them)."""
    c = spec.constraints
    out: list[str] = []
    peak = reported_peak_bytes(metrics)
    limit = workload.gpu.hbm_bytes * (1.0 - c.memory_headroom)
    if c.memory_headroom > 0 and peak is not None and peak > limit:
        out.append(
            f"peak memory {peak / GIB:.1f} GiB exceeds {limit / GIB:.1f} GiB "
            f"({c.memory_headroom:.0%} headroom kept free)"
        )
    err = number(metrics.get("error_score"))
    if c.max_error_score is not None and err is not None and err > c.max_error_score:
        out.append(f"numerical-error score {err:.3g} exceeds {c.max_error_score:.3g}")
    gpus = job_gpus(workload, params)
    if c.max_gpus is not None and gpus > c.max_gpus:
        out.append(f"uses {gpus} GPUs, more than max_gpus={c.max_gpus}")
    return out


def objective_values(
    spec: StudySpec, metrics: Mapping[str, Any], gpus: int | None = None
) -> list[float] | None:
    """The objective values of a complete trial, or None when a metric is missing (``gpus``:
    what the job ran on, so that a cost it did not report is derived, see
    :func:`metric_value`)."""
    vals = []
    for o in spec.objectives:
        v = metric_value(metrics, o.metric, gpus)
        if v is None:
            return None
        vals.append(v)
    return vals


def missing_objectives(
    spec: StudySpec, metrics: Mapping[str, Any], gpus: int | None = None
) -> list[str]:
    """The objectives whose value a report neither gives nor lets cubic derive."""
    return [o.metric for o in spec.objectives if metric_value(metrics, o.metric, gpus) is None]


def better(spec: StudySpec, a: float, b: float) -> bool:
    """Whether value ``a`` beats ``b`` on the first objective."""
    return a > b if spec.objectives[0].direction == "maximize" else a < b

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
    if isinstance(value, bool) or not isinstance(value, int | float):
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
    gpus = (params or {}).get("num_gpus", workload.cluster.num_gpus)
    if c.max_gpus is not None and int(gpus) > c.max_gpus:
        out.append(f"uses {int(gpus)} GPUs, more than max_gpus={c.max_gpus}")
    return out


def objective_values(spec: StudySpec, metrics: Mapping[str, Any]) -> list[float] | None:
    """The objective values of a complete trial, or None when a metric is missing."""
    vals = []
    for o in spec.objectives:
        v = number(metrics.get(o.metric))
        if v is None:
            return None
        vals.append(v)
    return vals


def better(spec: StudySpec, a: float, b: float) -> bool:
    """Whether value ``a`` beats ``b`` on the first objective."""
    return a > b if spec.objectives[0].direction == "maximize" else a < b

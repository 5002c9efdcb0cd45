"""Objective values and constraint checks of finished trials, shared by tuner and strategies."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cubic.study import StudySpec
from cubic.workload import Workload

GIB = 2.0**30


def reported_peak_bytes(metrics: Mapping[str, Any] | None) -> float | None:
    """The peak memory per GPU a job reported, in bytes: ``peak_memory_gib`` (what
    ``torch.cuda.max_memory_allocated`` gives over 2**30) or ``peak_memory_gb`` (10**9)."""
    if not metrics:
        return None
    for key, unit in (("peak_memory_gib", GIB), ("peak_memory_gb", 1e9)):
        v = metrics.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            return float(v) * unit
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
    err = metrics.get("error_score")
    if c.max_error_score is not None and err is not None and float(err) > c.max_error_score:
        out.append(f"numerical-error score {float(err):.3g} exceeds {c.max_error_score:.3g}")
    gpus = (params or {}).get("num_gpus", workload.cluster.num_gpus)
    if c.max_gpus is not None and int(gpus) > c.max_gpus:
        out.append(f"uses {int(gpus)} GPUs, more than max_gpus={c.max_gpus}")
    return out


def objective_values(spec: StudySpec, metrics: Mapping[str, Any]) -> list[float] | None:
    """The objective values of a complete trial, or None when a metric is missing."""
    vals = []
    for o in spec.objectives:
        v = metrics.get(o.metric)
        if v is None:
            return None
        vals.append(float(v))
    return vals


def better(spec: StudySpec, a: float, b: float) -> bool:
    """Whether value ``a`` beats ``b`` on the first objective."""
    return a > b if spec.objectives[0].direction == "maximize" else a < b

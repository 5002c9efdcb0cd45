"""Objective values and constraint checks of finished trials, shared by tuner and strategies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cubic.study import StudySpec
from cubic.workload import Workload


def violations(
    spec: StudySpec,
    workload: Workload,
    metrics: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why a complete trial breaks the study's constraints (empty when it respects them)."""
    c = spec.constraints
    out: list[str] = []
    mem = metrics.get("peak_memory_gb")
    limit = workload.gpu.hbm_bytes / 1e9 * (1.0 - c.memory_headroom)  # metrics are in GB
    if c.memory_headroom > 0 and mem is not None and float(mem) > limit:
        out.append(
            f"peak memory {float(mem):.1f} GB exceeds {limit:.1f} GB "
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

"""Training data from the simulated cluster: sampled configurations and what they measured.

Only tests and benchmarks use the simulator; the proxy sees the result as trials would give
it (throughput where the configuration ran, NaN and infeasible where it did not).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from cubic.proxy.features import featurize
from cubic.sim import simulate
from cubic.space import Space
from cubic.workload import PRESETS, Cluster, Workload

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"
SPACE_OF = {"llm": "llm_pretrain.yaml", "dlrm": "dlrm_sharding.yaml"}


def workload(preset: str, gpu: str | None = None, num_gpus: int | None = None) -> Workload:
    wl = PRESETS[preset]
    if gpu is None and num_gpus is None:
        return wl
    return replace(wl, cluster=Cluster(gpu or wl.cluster.gpu, num_gpus or wl.cluster.num_gpus))


@cache
def space(kind: str) -> Space:
    return Space.from_yaml(SPACES / SPACE_OF[kind])


def measured(
    wl: Workload, n: int, seed: int
) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray]:
    """``(configs, X, y, feasible)`` for ``n`` configurations sampled from the space."""
    configs, X, y, feasible = _measured(wl, n, seed)
    return [dict(c) for c in configs], X.copy(), y.copy(), feasible.copy()


@cache
def _measured(wl: Workload, n: int, seed: int) -> Any:
    configs = space(wl.kind).sample(np.random.default_rng(seed), n, wl.context())
    result = simulate(wl, configs)
    feasible = result.feasible.copy()
    y = np.where(feasible, result.throughput, np.nan)
    return configs, featurize(wl, configs), y, feasible


def stacked(
    parts: list[tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, feasible)`` of several :func:`measured` samples, one after another."""
    return (
        np.vstack([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        np.concatenate([p[3] for p in parts]),
    )

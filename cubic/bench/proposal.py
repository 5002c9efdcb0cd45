"""``cubic bench proposal``: how long one proposal round of the ``cubic`` strategy takes.

A round for ``n`` parallel workers with ``history`` finished trials: fitting the proxy on the
whole history, scoring the candidate pool and choosing a diverse batch, on one core. The
history is random configurations of a benchmark study measured on the simulated cluster.
The study's survey of its space (:func:`cubic.strategies.candidates.survey`: the runnable
candidates, built once per study, when it is created) is timed on its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from cubic.sim import simulate
from cubic.store.objects import Trial, TrialState
from cubic.strategies.cubic import CubicStrategy
from cubic.study import load_spec

DEFAULT_STUDY = (
    Path(__file__).resolve().parents[2]
    / "search_spaces"
    / "bench"
    / "llama3_70b_h100x64.study.yaml"
)


def synthetic_history(study: Any, n: int, seed: int = 0) -> list[Trial]:
    """``n`` finished trials: random valid configs, measured without noise."""
    rng = np.random.default_rng(seed)
    arrays = study.space.sample_arrays(rng, n, study.context)
    configs = study.space.from_arrays(arrays)
    res = simulate(study.workload, arrays)
    metric = study.spec.objectives[0].metric
    out = []
    for i, cfg in enumerate(configs):
        ok = bool(res.feasible[i])
        metrics = (
            {
                "throughput": float(res.throughput[i]),
                metric: float(res.throughput[i]),
                "peak_memory_gb": float(res.peak_memory[i]) / 1e9,
                "error_score": float(res.error_score[i]),
            }
            if ok
            else None
        )
        out.append(
            Trial.detached(
                i + 1, cfg, TrialState.COMPLETE if ok else TrialState.INFEASIBLE, metrics
            )
        )
    return out


def bench_sampler_round(
    strategy: str, study_file: Path | None = None, history: int = 64, n: int = 8, repeat: int = 3
) -> dict[str, Any]:
    """Seconds for one round of ``n`` proposals of an Optuna-backed strategy (``gp``, say)
    with ``history`` finished trials: a fresh strategy each time, as a new API process
    would build it (median of ``repeat``)."""
    from cubic.bench.search import build_strategy

    spec, base = load_spec(study_file or DEFAULT_STUDY)
    study = spec.resolve(base)
    trials = synthetic_history(study, history)
    times = []
    for r in range(repeat):
        s, _ = build_strategy(strategy, study, r)
        t0 = time.perf_counter()
        s.suggest(trials, n)
        times.append(time.perf_counter() - t0)
    return {"strategy": strategy, "history": history, "n": n, "round_s": float(np.median(times))}


def bench_proposal(
    study_file: Path | None = None, history: int = 10_000, n: int = 8, repeat: int = 3
) -> dict[str, float]:
    """Seconds for one round (proxy fit included) and for a round on a fitted proxy, as a
    study's long-lived strategy runs them; and for the first round a new strategy makes
    (every trial seen for the first time: its key, the invalid regions)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spec, base = load_spec(study_file or DEFAULT_STUDY)
    study = spec.resolve(base)
    trials = synthetic_history(study, history)
    t0 = time.perf_counter()
    CubicStrategy(study, seed=0)._candidates()
    survey_s = time.perf_counter() - t0
    first, cold, warm = [], [], []
    for r in range(repeat):
        strategy = CubicStrategy(study, seed=r)
        strategy._candidates()  # once per study, shared (timed above)
        t0 = time.perf_counter()
        strategy.suggest(trials, n)
        first.append(time.perf_counter() - t0)
        strategy._model = None  # as when new trials finished: the next round refits
        t0 = time.perf_counter()
        strategy.suggest(trials, n)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        strategy.suggest(trials, n)
        warm.append(time.perf_counter() - t0)
    return {
        "history": history,
        "n": n,
        "round_with_fit_s": float(np.median(cold)),
        "round_on_fitted_proxy_s": float(np.median(warm)),
        "first_round_s": float(np.median(first)),
        "survey_s": survey_s,
    }

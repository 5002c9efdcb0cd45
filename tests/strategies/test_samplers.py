"""Optuna-backed strategies see the whole history, conditional knobs included."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cubic.store.objects import Trial, TrialState
from cubic.strategies import make_strategy
from cubic.study import load_spec

ROOT = Path(__file__).resolve().parents[2]


def _trial(i: int, params: dict, state: TrialState, metrics: dict | None) -> Trial:
    return Trial.detached(i + 1, params, state, metrics)


def test_inactive_conditional_knobs_do_not_hide_trials_from_the_sampler() -> None:
    spec, base = load_spec(ROOT / "search_spaces" / "dlrm_criteo_dcnv2.study.yaml")
    resolved = spec.resolve(base)
    strategy = make_strategy(resolved)
    configs = resolved.space.sample(np.random.default_rng(0), 40, resolved.context)
    # Most configs leave cache_load_factor/lossy_error_bound inactive at a default that is
    # not one of their choices; every one of them must still reach the sampler.
    assert any(c["cache_load_factor"] == 1.0 for c in configs)
    history = [
        _trial(i, c, TrialState.COMPLETE, {"samples_per_s": 1000.0 + i})
        for i, c in enumerate(configs)
    ]
    frozen = strategy._frozen(history, resolved.space.optuna_distributions())
    assert len(frozen) == len(history)

"""What every strategy shares: recognising configurations proposed before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cubic.store.objects import Trial, TrialState
from cubic.strategies import config_key, make_strategy
from cubic.study import load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_seen_keys_follow_the_params_not_only_the_trial_id() -> None:
    spec, base = load_spec(ROOT / "search_spaces" / "bench" / "llama3_8b_h100x16.study.yaml")
    study = spec.resolve(base)
    strategy = make_strategy(study)
    a, b = study.space.sample(np.random.default_rng(0), 2, study.context)
    first = [Trial.detached(1, a, TrialState.COMPLETE, {"tokens_per_s": 1.0})]
    assert strategy.seen(first) == {config_key(a)}
    assert strategy.seen(first) == {config_key(a)}  # cached: the same answer
    # Another history reusing the id (a fresh study, a test): the key is not reused.
    other = [Trial.detached(1, b, TrialState.COMPLETE, {"tokens_per_s": 1.0})]
    assert strategy.seen(other) == {config_key(b)}
    # Params equal but a different dict (the trial reloaded from the store): same key.
    reloaded = [Trial.detached(1, dict(b), TrialState.COMPLETE, {"tokens_per_s": 1.0})]
    assert strategy.seen(reloaded) == {config_key(b)}

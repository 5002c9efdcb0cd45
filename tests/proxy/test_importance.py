"""Knob importance: the columns each knob moves, found by changing it alone, and the gain
given back to the knobs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cubic.proxy.features import feature_names
from cubic.proxy.importance import feature_gains, knob_columns, knob_importance, study_configs
from cubic.proxy.model import ProxyModel
from cubic.study import load_spec

STUDY = (
    Path(__file__).resolve().parents[2] / "search_spaces" / "bench" / "llama3_8b_h100x16.study.yaml"
)


def _study():  # type: ignore[no-untyped-def]
    spec, base = load_spec(STUDY)
    return spec.resolve(base)


def test_each_knob_moves_its_own_columns_and_the_derived_ones() -> None:
    study = _study()
    names = feature_names("llm")
    configs = study_configs(study.space, study.context, [])
    columns = {
        k: {names[j] for j in v}
        for k, v in knob_columns(study.workload, study.space, configs).items()
    }
    assert set(columns) == set(study.space.names)
    assert "log2_tp" in columns["tp"] and "log2_tp" not in columns["pp"]
    assert {"recompute_none", "recompute_selective", "recompute_full"} <= columns["recompute"]
    assert "memory_gb" in columns["tp"] and "memory_gb" in columns["micro_batch"]  # derived
    assert not any("peak_bf16_tflops" in c for c in columns.values())  # the workload's own


def test_knob_importance_shares_derived_columns() -> None:
    names = ["log2_tp", "memory", "nodes"]
    gains = np.array([6.0, 4.0, 10.0])
    columns = {"tp": np.array([0, 1]), "pp": np.array([1]), "fixed": np.array([], dtype=int)}
    shares, other = knob_importance(gains, names, columns)
    assert [(s.knob, s.share) for s in shares] == [("tp", 0.8), ("pp", 0.2), ("fixed", 0.0)]
    assert shares[0].features == ("log2_tp", "memory") and other == 0.5
    assert knob_importance(np.zeros(3), names, columns) == ([], 0.0)


def test_feature_gains_of_a_fitted_model_follow_the_signal() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = np.exp(2.0 * X[:, 2] + 0.1 * rng.normal(size=300))
    model = ProxyModel(n_members=2, n_estimators=30, gp_weight=0).fit(X, y, np.ones(300, bool))
    gains = feature_gains(model)
    assert gains.shape == (4,) and int(np.argmax(gains)) == 2

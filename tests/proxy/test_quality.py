"""Quality metrics against hand-computed cases, and the held-out evaluation protocols."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

from cubic.proxy.quality import cross_validate, evaluate, newest_holdout, top_k_recall


def test_perfect_prediction() -> None:
    y = np.arange(1.0, 21.0)
    r = evaluate(y, y, np.ones(20, bool), np.full(20, 0.9))
    assert r["kendall_tau"] == pytest.approx(1.0)
    assert r["spearman"] == pytest.approx(1.0)
    assert r["top10_recall"] == 1.0
    assert r["mape"] == 0.0
    assert r["feasibility_auc"] is None  # one class
    assert r["n"] == r["n_feasible"] == 20


def test_reversed_prediction() -> None:
    y = np.arange(1.0, 21.0)
    r = evaluate(y, -y + 100, np.ones(20, bool))
    assert r["kendall_tau"] == pytest.approx(-1.0)
    assert r["spearman"] == pytest.approx(-1.0)
    assert r["top10_recall"] == 0.0


def test_hand_computed_tau_and_mape() -> None:
    # One discordant pair (3, 4) out of six: tau = (5 - 1) / 6.
    r = evaluate([1, 2, 3, 4], [1, 2, 4, 3], [True] * 4)
    assert r["kendall_tau"] == pytest.approx(4 / 6)
    assert r["spearman"] == pytest.approx(1 - 6 * 2 / (4 * 15))
    assert evaluate([100, 200], [110, 180], [True, True])["mape"] == pytest.approx(0.1)


def test_top_k_recall_by_hand() -> None:
    y_true = np.arange(12.0)  # true top 10: 2..11
    y_pred = y_true.copy()
    y_pred[[11, 10]] = -1.0  # two of the best predicted worst: 0 and 1 take their place
    assert top_k_recall(y_true, y_pred, 10) == pytest.approx(0.8)
    assert top_k_recall(y_true[:4], y_pred[:4], 10) == 1.0  # k shrinks to the rows there are
    assert evaluate(y_true, y_pred, np.ones(12, bool))["top10_recall"] == pytest.approx(0.8)


def test_infeasible_rows_are_ignored_for_speed_and_scored_for_feasibility() -> None:
    y = np.array([1.0, 2.0, 3.0, np.nan, np.nan])
    pred = np.array([1.0, 2.0, 3.0, 99.0, -5.0])
    feas = np.array([True, True, True, False, False])
    r = evaluate(y, pred, feas, p_feasible=[0.9, 0.8, 0.7, 0.2, 0.75])
    assert r["kendall_tau"] == pytest.approx(1.0)
    assert r["n_feasible"] == 3
    assert r["feasibility_auc"] == pytest.approx(5 / 6)  # (0.75 beats 0.7): 5 of 6 pairs
    assert evaluate([1.0], [1.0], [True])["kendall_tau"] is None


def test_rank_metrics_within_groups() -> None:
    # Each group is ranked perfectly, but group 1 is predicted 100x too fast: pooled tau < 1.
    y = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 30.0])
    pred = np.array([100.0, 200.0, 300.0, 10.0, 20.0, 30.0])
    feas = np.ones(6, bool)
    assert evaluate(y, pred, feas)["kendall_tau"] < 1.0
    assert evaluate(y, pred, feas, groups=[1, 1, 1, 2, 2, 2])["kendall_tau"] == pytest.approx(1.0)


class LinearModel:
    """Least squares on the features: enough to check the protocols' bookkeeping."""

    fitted_rows: ClassVar[list[int]] = []

    def fit(self, X: Any, y: Any, feasible: Any, groups: Any = None) -> LinearModel:
        X, y, feasible = np.asarray(X), np.asarray(y), np.asarray(feasible)
        self.coef, *_ = np.linalg.lstsq(X[feasible], y[feasible], rcond=None)
        self.p = feasible.mean()
        LinearModel.fitted_rows.append(len(X))
        return self

    def predict(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        mean = np.asarray(X) @ self.coef
        return mean, np.zeros(len(mean))

    def feasible(self, X: Any) -> np.ndarray:
        return np.asarray(X)[:, 1]  # feature 1 marks feasibility


def _linear_data(n: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.random(n), rng.random(n) < 0.7, rng.random(n)]).astype(float)
    feasible = X[:, 1] > 0
    y = np.where(feasible, 3 * X[:, 0] + X[:, 2] + 1, np.nan)
    return X, y, feasible


def test_cross_validate_averages_folds() -> None:
    X, y, feasible = _linear_data()
    LinearModel.fitted_rows = []
    r = cross_validate(LinearModel, X, y, feasible, k=5, seed=0)
    assert r["folds"] == 5 and r["k"] == 5
    assert LinearModel.fitted_rows == [48] * 5
    assert r["kendall_tau"] == pytest.approx(1.0)
    assert r["top10_recall"] == pytest.approx(1.0)
    assert r["feasibility_auc"] == pytest.approx(1.0)
    assert r["pooled"]["kendall_tau"] == pytest.approx(1.0)
    assert r["mape"] < 1e-9


def test_newest_holdout_trains_on_older_rows() -> None:
    X, y, feasible = _linear_data()
    LinearModel.fitted_rows = []
    r = newest_holdout(LinearModel, X, y, feasible, n_newest=15)
    assert LinearModel.fitted_rows == [45]
    assert r["n"] == 15 and r["n_train"] == 45
    assert r["kendall_tau"] == pytest.approx(1.0)
    assert newest_holdout(LinearModel, X, y, feasible)["n"] == 12  # a fifth by default
    assert newest_holdout(LinearModel, X[:3], y[:3], np.zeros(3, bool)) == {}

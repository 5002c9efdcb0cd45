"""How good a proxy model is at what a search needs from it.

A search acts on the order of configurations, so rank agreement (Kendall tau, Spearman) and
top-10 recall come first; MAPE says whether predicted speeds can be read as numbers, and the
feasibility AUC whether the model can tell configurations that run from those that do not.
Every score here is on held-out trials: k-fold cross-validation, and the newest trials
predicted from the older ones, which is how a model is used during a study.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from scipy import stats
from sklearn.metrics import mean_absolute_percentage_error, roc_auc_score
from sklearn.model_selection import KFold, StratifiedKFold

METRICS = ("kendall_tau", "spearman", "top10_recall", "mape", "feasibility_auc")


class _Model(Protocol):
    def fit(self, X: Any, y: Any, feasible: Any, groups: Any = None) -> Any: ...
    def predict(self, X: Any) -> tuple[np.ndarray, np.ndarray]: ...
    def feasible(self, X: Any) -> np.ndarray: ...


def top_k_recall(y_true: np.ndarray, y_pred: np.ndarray, k: int = 10) -> float:
    """Share of the ``k`` truly fastest configurations among the ``k`` predicted fastest."""
    k = min(k, len(y_true))
    if k == 0:
        return math.nan
    true_top = set(np.argsort(-y_true, kind="stable")[:k].tolist())
    pred_top = set(np.argsort(-y_pred, kind="stable")[:k].tolist())
    return len(true_top & pred_top) / k


def _rank_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    if len(y_true) < 2:
        return {"kendall_tau": math.nan, "spearman": math.nan, "top10_recall": math.nan}
    with warnings.catch_warnings():  # a constant input has no defined correlation: NaN
        warnings.simplefilter("ignore")
        tau = stats.kendalltau(y_true, y_pred).statistic
        rho = stats.spearmanr(y_true, y_pred).statistic
    return {
        "kendall_tau": float(tau),
        "spearman": float(rho),
        "top10_recall": top_k_recall(y_true, y_pred, 10),
    }


def evaluate(
    y_true: Any,
    y_pred: Any,
    feasible_true: Any,
    p_feasible: Any = None,
    groups: Any = None,
) -> dict[str, Any]:
    """Scores of predictions against measurements.

    Throughput metrics use the truly feasible rows only (an infeasible trial has no speed).
    With ``groups`` (e.g. study ids) the rank metrics are computed within each group and
    averaged weighted by its feasible rows, since a search only ever compares configurations
    of one workload. A metric that cannot be computed (fewer than two feasible rows, one
    class for the AUC) is None.
    """
    y_true = np.asarray(y_true, dtype=float).reshape(-1)
    y_pred = np.asarray(y_pred, dtype=float).reshape(-1)
    feas = np.asarray(feasible_true, dtype=bool).reshape(-1)
    if not len(y_true) == len(y_pred) == len(feas):
        raise ValueError("y_true, y_pred and feasible_true differ in length")
    ok = feas & np.isfinite(y_true) & np.isfinite(y_pred)
    g = np.zeros(len(y_true)) if groups is None else np.asarray(groups).reshape(-1)
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for gid in np.unique(g[ok]):
        rows = ok & (g == gid)
        for name, value in _rank_metrics(y_true[rows], y_pred[rows]).items():
            if not math.isnan(value):
                w = float(rows.sum())
                sums[name] = sums.get(name, 0.0) + w * value
                weights[name] = weights.get(name, 0.0) + w
    out: dict[str, Any] = {
        "n": len(y_true),
        "n_feasible": int(ok.sum()),
        **{
            name: (sums[name] / weights[name] if name in weights else None)
            for name in ("kendall_tau", "spearman", "top10_recall")
        },
        "mape": (
            float(mean_absolute_percentage_error(y_true[ok], y_pred[ok])) if ok.any() else None
        ),
        "feasibility_auc": None,
    }
    if p_feasible is not None:
        p = np.asarray(p_feasible, dtype=float).reshape(-1)
        if 0 < feas.sum() < len(feas):
            out["feasibility_auc"] = float(roc_auc_score(feas, p))
    return out


def _mean(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in METRICS:
        vals = [r[name] for r in results if r.get(name) is not None]
        out[name] = float(np.mean(vals)) if vals else None
    return out


def _predict(model: _Model, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean, _ = model.predict(X)
    return np.asarray(mean, dtype=float), np.asarray(model.feasible(X), dtype=float)


def cross_validate(
    model_factory: Callable[[], _Model],
    X: Any,
    y: Any,
    feasible: Any,
    k: int = 5,
    seed: int = 0,
    groups: Any = None,
) -> dict[str, Any]:
    """k-fold cross-validation: the metrics of :func:`evaluate` averaged over folds.

    Folds are stratified by feasibility when both classes have at least ``k`` rows, so each
    one scores both parts of the model. ``pooled`` holds the same metrics over every
    out-of-fold prediction at once, steadier than the fold mean when a fold holds only a
    handful of feasible trials. Folds whose training part has fewer than two feasible rows
    are skipped (``folds`` counts those used).
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).reshape(-1)
    feas = np.asarray(feasible, dtype=bool).reshape(-1)
    g = None if groups is None else np.asarray(groups).reshape(-1)
    n = len(y)
    k = max(2, min(int(k), n))
    both = min(feas.sum(), (~feas).sum()) >= k
    splitter = (
        StratifiedKFold(k, shuffle=True, random_state=seed)
        if both
        else KFold(k, shuffle=True, random_state=seed)
    )
    oof_y = np.full(n, np.nan)
    oof_p = np.full(n, np.nan)
    results = []
    for train, test in splitter.split(X, feas if both else None):
        if (feas[train] & np.isfinite(y[train])).sum() < 2:
            continue
        model = model_factory().fit(
            X[train], y[train], feas[train], None if g is None else g[train]
        )
        oof_y[test], oof_p[test] = _predict(model, X[test])
        results.append(
            evaluate(y[test], oof_y[test], feas[test], oof_p[test], None if g is None else g[test])
        )
    done = ~np.isnan(oof_p)
    pooled = (
        evaluate(y[done], oof_y[done], feas[done], oof_p[done], None if g is None else g[done])
        if done.any()
        else {}
    )
    return {
        "k": k,
        "folds": len(results),
        "n": n,
        "n_feasible": int(feas.sum()),
        **_mean(results),
        "pooled": {m: pooled.get(m) for m in METRICS},
    }


def newest_holdout(
    model_factory: Callable[[], _Model],
    X: Any,
    y: Any,
    feasible: Any,
    n_newest: int | None = None,
    groups: Any = None,
) -> dict[str, Any]:
    """Train on all rows but the newest ``n_newest`` and score on those.

    Rows are taken to be in the order the trials finished (as :func:`training_set` returns
    them). The default holds out a fifth of the rows, at least one. Returns an empty dict
    when the older rows hold fewer than two feasible trials.
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float).reshape(-1)
    feas = np.asarray(feasible, dtype=bool).reshape(-1)
    n = len(y)
    m = max(1, n // 5) if n_newest is None else int(n_newest)
    if not 0 < m < n or (feas[: n - m] & np.isfinite(y[: n - m])).sum() < 2:
        return {}
    g = None if groups is None else np.asarray(groups).reshape(-1)
    model = model_factory().fit(
        X[: n - m], y[: n - m], feas[: n - m], None if g is None else g[: n - m]
    )
    pred, p = _predict(model, X[n - m :])
    out = evaluate(y[n - m :], pred, feas[n - m :], p, None if g is None else g[n - m :])
    out["n_train"] = n - m
    return out

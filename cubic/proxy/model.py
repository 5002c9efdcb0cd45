"""The proxy model: XGBoost predictions of throughput and feasibility from features.

Trained on measured trials only, it lets a strategy rank many candidate configurations for
the price of a prediction and spend real GPU time on the few it expects to be fast and to
fit in memory. Four parts:

* an ensemble of XGBoost regressors of log throughput (each on a random subsample of rows
  and columns, with its own seed); the spread of their predictions is the uncertainty a
  strategy trades off against the mean;
* optionally, pairwise rankers (``objective="rank"``, ``rank:pairwise`` grouped per study)
  in place of the regressors, mapped back to log throughput by a linear fit, for data where
  ordering configurations matters more than predicting their speed;
* a Gaussian process over the same features (:mod:`cubic.proxy.gp`), fitted on the newest
  ``gp_rows`` trials of the study it ranks and blended into the mean with weight
  ``gp_weight``: the trees alone tie configurations that fall in one leaf, which with a few
  dozen trials is most of them; with ``gp_linear`` its kernel has a linear part in the knobs'
  own columns, so that a switch's effect measured in some layouts carries over to a layout
  measured only without it;
* an XGBoost classifier of feasibility (ran vs. out of memory or invalid).

When the model knows its workload kind, it learns log throughput relative to the roofline
throughput of each configuration (the ``OFFSET`` feature, see :mod:`cubic.proxy.features`):
an efficiency, which is what carries over between models and cluster sizes, and which a few
dozen trials can pin down where raw tokens/s could not.

Models are saved as XGBoost's own JSON inside a plain dict with the feature names, versions
and hyperparameters next to it; never pickled.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

import numpy as np
import xgboost as xgb
from sklearn.base import BaseEstimator

from cubic.proxy.features import OFFSET, feature_names, knob_columns
from cubic.proxy.gp import KernelModel

FORMAT = "cubic.proxy_model/1"
OBJECTIVES = ("regression", "rank")
OFFSETS = ("roofline", "fitted", "none", "auto")
#: Fewest feasible rows for which the Gaussian process is fitted.
GP_MIN_ROWS = 8


def _rank_calibration(
    scores: np.ndarray, target: np.ndarray, groups: np.ndarray
) -> tuple[float, float]:
    """``(slope, intercept)`` mapping rank scores to log throughput (relative to the offset).

    The slope is fitted within groups (each group's scores and targets less their means):
    rankers order configs of one workload, and a line through several workloads' rows would
    mix their levels of efficiency into it and flatten it, so that a strategy weighing the
    predicted gain against the chance to fit would see almost no gain. The intercept puts
    the line through the mean of all rows."""
    sc, tg = _centered(scores, groups), _centered(target, groups)
    denom = float(np.dot(sc, sc))
    slope = float(np.dot(sc, tg)) / denom if denom > 0 else 0.0
    slope = max(slope, 1e-6)
    return slope, float(np.mean(target) - slope * np.mean(scores))


def _centered(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``values`` less the mean of their group."""
    out = values.astype(float).copy()
    for gid in np.unique(groups):
        rows = groups == gid
        out[rows] -= out[rows].mean()
    return out


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


class ProxyModel(BaseEstimator):
    """Predicts throughput (with uncertainty) and feasibility of configurations.

    ``kind`` ('llm' or 'dlrm') fixes the feature names and makes the model learn throughput
    relative to the roofline feature; without it, any feature matrix is accepted and raw log
    throughput is learned. ``n_members`` boosters of ``n_estimators`` rounds form the
    ensemble (the defaults fit 5,000 trials in about a second on one core). Learned
    attributes end in ``_``.
    """

    def __init__(
        self,
        kind: str | None = None,
        objective: str = "regression",
        offset: str = "roofline",
        n_members: int = 5,
        n_estimators: int = 100,
        max_depth: int = 5,
        learning_rate: float = 0.15,
        subsample: float = 0.8,
        colsample_bytree: float = 0.5,
        min_child_weight: float = 1.0,
        reg_lambda: float = 1.0,
        max_bin: int = 256,
        gp_weight: float = 0.7,
        gp_rows: int = 128,
        gp_linear: bool = True,
        center_groups: bool = False,
        classifier_rows: int = 4000,
        seed: int = 0,
        n_jobs: int = 1,
    ) -> None:
        self.kind = kind
        self.objective = objective
        self.offset = offset
        self.n_members = n_members
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.max_bin = max_bin
        self.gp_weight = gp_weight
        self.gp_rows = gp_rows
        self.gp_linear = gp_linear
        self.center_groups = center_groups
        self.classifier_rows = classifier_rows
        self.seed = seed
        self.n_jobs = n_jobs

    # -- fitting -------------------------------------------------------------------------

    def _check_params(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.offset not in OFFSETS:
            raise ValueError(f"offset must be one of {OFFSETS}, got {self.offset!r}")
        if self.kind is not None:
            feature_names(self.kind)  # raises on an unknown kind
        if not 0.0 <= float(self.gp_weight) <= 1.0:
            raise ValueError("gp_weight must be in [0, 1]")
        for name in (
            "n_members",
            "n_estimators",
            "max_depth",
            "max_bin",
            "n_jobs",
            "gp_rows",
            "classifier_rows",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("subsample", "colsample_bytree"):
            if not 0.0 < float(getattr(self, name)) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]")
        if not float(self.learning_rate) > 0.0:
            raise ValueError("learning_rate must be positive")

    def _check_X(self, X: Any, fitted: bool) -> np.ndarray:
        X = np.asarray(X, dtype=float)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D, got shape {X.shape}")
        width = (
            self.n_features_in_
            if fitted
            else (len(feature_names(self.kind)) if self.kind is not None else X.shape[1])
        )
        if X.shape[1] != width:
            raise ValueError(f"X has {X.shape[1]} features, expected {width}")
        return X

    def _offset(self, X: np.ndarray) -> np.ndarray:
        i = self.offset_index_
        if i is None:
            return np.zeros(len(X))
        intercept, slope = self.offset_coef_
        return intercept + slope * X[:, i]

    def _fit_offset(
        self, X: np.ndarray, log_y: np.ndarray, groups: np.ndarray
    ) -> tuple[float, float]:
        """``(intercept, slope)`` of the base the trees learn relative to.

        ``roofline``: log throughput over the roofline, an efficiency (what transfers between
        workloads). ``fitted``: a least-squares line in the roofline, its slope kept in
        [0, 1]; within one study the roofline is a rough guide whose errors the trees would
        otherwise have to unlearn, and the line lets the data say how much of it to trust.
        ``none``: raw log throughput (the roofline stays a feature to split on). ``auto``:
        ``roofline`` when the rows come from more than one group (workload), else ``fitted``.
        """
        i = self.offset_index_
        offset = self.offset
        if offset == "auto":
            offset = "roofline" if len(np.unique(groups)) > 1 else "fitted"
        if i is None or offset == "none":
            return 0.0, 0.0
        if offset == "roofline":
            return 0.0, 1.0
        r = X[:, i]
        slope = float(np.polyfit(r, log_y, 1)[0]) if len(r) > 2 and np.ptp(r) > 0 else 1.0
        slope = min(max(slope, 0.0), 1.0)
        return float(np.mean(log_y - slope * r)), slope

    def _booster_params(self, seed: int, objective: str) -> dict[str, Any]:
        return {
            "objective": objective,
            "tree_method": "hist",
            "max_depth": int(self.max_depth),
            "eta": float(self.learning_rate),
            "subsample": float(self.subsample),
            "colsample_bytree": float(self.colsample_bytree),
            "min_child_weight": float(self.min_child_weight),
            "lambda": float(self.reg_lambda),
            "max_bin": int(self.max_bin),
            "nthread": int(self.n_jobs),
            "seed": int(seed),
            "verbosity": 0,
        }

    def fit(
        self,
        X: Any,
        y: Any,
        feasible: Any,
        groups: Any = None,
        gp_group: Any = None,
    ) -> ProxyModel:
        """Fit on trials: ``y`` is throughput (NaN where infeasible), ``feasible`` a bool mask.

        ``groups`` (one id per row, e.g. the study) keeps pairwise ranking inside a study;
        the regression ignores it. Rows are taken to be in the order they finished. The
        Gaussian process learns one study, the one whose configurations the model will
        rank: ``gp_group``, or the only group there is; from rows of several studies and no
        ``gp_group``, the trees alone are fitted. Needs at least two feasible rows.
        """
        self._check_params()
        X = self._check_X(X, fitted=False)
        y = np.asarray(y, dtype=float).reshape(-1)
        feasible = np.asarray(feasible, dtype=bool).reshape(-1)
        if not len(y) == len(feasible) == len(X):
            raise ValueError(f"X, y and feasible have {len(X)}, {len(y)}, {len(feasible)} rows")
        if not np.all(np.isfinite(X)):
            raise ValueError("X holds NaN or infinite values")
        ok = feasible & np.isfinite(y) & (y > 0)
        if np.any(feasible & ~ok):
            raise ValueError("feasible rows need a positive, finite throughput")
        if ok.sum() < 2:
            raise ValueError(f"need at least two feasible rows, got {int(ok.sum())}")
        g = np.zeros(len(y), dtype=np.int64) if groups is None else _group_codes(groups)
        if len(g) != len(y):
            raise ValueError(f"groups has {len(g)} entries for {len(y)} rows")

        self.n_features_in_ = X.shape[1]
        self.feature_names_ = (
            feature_names(self.kind)
            if self.kind is not None
            else [f"f{i}" for i in range(X.shape[1])]
        )
        self.offset_index_ = (
            self.feature_names_.index(OFFSET) if OFFSET in self.feature_names_ else None
        )
        Xf = X[ok]
        self.offset_coef_ = self._fit_offset(Xf, np.log(y[ok]), g[ok])
        target = np.log(y[ok]) - self._offset(Xf)
        if self.center_groups:
            # Each group's mean taken out: the trees learn how configs of one workload
            # differ, not each workload's level (which a new workload does not share).
            target = _centered(target, g[ok])
        self.members_ = self._fit_members(Xf, target, g[ok])
        if self.objective == "rank":
            scores = self._member_scores(Xf).mean(axis=0)
            self.calibration_ = _rank_calibration(scores, target, g[ok])
        else:
            self.calibration_ = (1.0, 0.0)
        self.gp_ = None
        mine = _study_rows(groups, g, ok, gp_group)
        if float(self.gp_weight) > 0 and len(mine) >= GP_MIN_ROWS:
            newest = mine[-int(self.gp_rows) :]
            linear = None
            if self.gp_linear:
                linear = knob_columns(self.kind) if self.kind else np.arange(X.shape[1])
            self.gp_ = KernelModel(self.seed, linear=linear).fit(Xf[newest], target[newest])
        self.n_train_ = len(y)
        self.n_feasible_ = int(ok.sum())
        self.p_feasible_ = float(feasible.mean())
        self.classifier_ = None
        if 0 < feasible.sum() < len(feasible):
            rows, weight = _class_sample(feasible, int(self.classifier_rows), self.seed)
            dtrain = xgb.DMatrix(
                X[rows],
                label=feasible[rows].astype(float),
                weight=weight,
                nthread=int(self.n_jobs),
            )
            self.classifier_ = xgb.train(
                self._booster_params(self.seed, "binary:logistic"),
                dtrain,
                num_boost_round=int(self.n_estimators),
            )
        return self

    def _fit_members(self, X: np.ndarray, target: np.ndarray, g: np.ndarray) -> list[xgb.Booster]:
        if self.objective == "rank":
            order = np.argsort(g, kind="stable")  # XGBoost needs each query's rows together
            dtrain = xgb.DMatrix(
                X[order], label=target[order], qid=g[order], nthread=int(self.n_jobs)
            )
            obj = "rank:pairwise"
        else:
            dtrain = xgb.DMatrix(X, label=target, nthread=int(self.n_jobs))
            obj = "reg:squarederror"
        return [
            xgb.train(
                self._booster_params(self.seed + i, obj),
                dtrain,
                num_boost_round=int(self.n_estimators),
            )
            for i in range(int(self.n_members))
        ]

    # -- prediction ----------------------------------------------------------------------

    def _member_scores(self, X: np.ndarray) -> np.ndarray:
        return np.stack([np.asarray(b.inplace_predict(X), dtype=float) for b in self.members_])

    def predict_log(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of log throughput (natural log): the boosters' mean
        and spread, blended with the Gaussian process's mean and standard deviation."""
        self._check_fitted()
        X = self._check_X(X, fitted=True)
        if len(X) == 0:
            return np.zeros(0), np.zeros(0)
        slope, intercept = self.calibration_
        scores = self._member_scores(X) * slope + intercept
        mean, std = scores.mean(axis=0), scores.std(axis=0)
        if self.gp_ is not None:
            w = float(self.gp_weight)
            gp_mean, gp_std = self.gp_.predict(X)
            mean = (1.0 - w) * mean + w * gp_mean
            std = np.sqrt((1.0 - w) * std**2 + w * gp_std**2)
        return mean + self._offset(X), std

    def familiarity(self, X: Any) -> np.ndarray:
        """How close each row is to the study's measured rows in the Gaussian process's
        learned metric (see :meth:`cubic.proxy.gp.KernelModel.familiarity`); 0 without one."""
        self._check_fitted()
        X = self._check_X(X, fitted=True)
        if self.gp_ is None:
            return np.zeros(len(X))
        return self.gp_.familiarity(X)

    def predict(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, std)``: throughput (the trials' unit, e.g. tokens/s) and its uncertainty.

        ``mean`` is ``exp`` of the ensemble's mean log throughput (a geometric mean). ``std``
        is on the natural-log scale: 0.1 means about +/-10 %, comparable across workloads
        whose throughputs differ by orders of magnitude.
        """
        mean, std = self.predict_log(X)
        return np.exp(mean), std

    def feasible(self, X: Any) -> np.ndarray:
        """Probability that each configuration runs (fits in memory, is a valid layout)."""
        self._check_fitted()
        X = self._check_X(X, fitted=True)
        if self.classifier_ is None:
            return np.full(len(X), self.p_feasible_)
        if len(X) == 0:
            return np.zeros(0)
        return np.asarray(self.classifier_.inplace_predict(X), dtype=float)

    def _check_fitted(self) -> None:
        if not hasattr(self, "members_"):
            raise RuntimeError("ProxyModel is not fitted; call fit() or load() first")

    # -- persistence ---------------------------------------------------------------------

    def save(self) -> dict[str, Any]:
        """A JSON-serialisable dict: each booster as XGBoost's JSON text, plus a sidecar
        (feature names, workload kind, versions, hyperparameters) checked on load."""
        self._check_fitted()
        return {
            "format": FORMAT,
            "kind": self.kind,
            "feature_names": list(self.feature_names_),
            "versions": {"cubic": _version("cubic"), "xgboost": xgb.__version__},
            "params": self.get_params(),
            "n_train": self.n_train_,
            "n_feasible": self.n_feasible_,
            "p_feasible": self.p_feasible_,
            "calibration": list(self.calibration_),
            "offset_coef": list(self.offset_coef_),
            "members": [_booster_json(b) for b in self.members_],
            "classifier": None if self.classifier_ is None else _booster_json(self.classifier_),
            "gp": None if self.gp_ is None else self.gp_.save(),
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> ProxyModel:
        """Rebuild a model from :meth:`save`'s dict; it predicts exactly what was saved."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a saved proxy model (expected format {FORMAT!r})")
        model = cls(**data["params"])
        names = list(data["feature_names"])
        if model.kind is not None and names != feature_names(model.kind):
            raise ValueError(
                f"saved feature names do not match this version's {model.kind!r} features; "
                "retrain the model"
            )
        model.feature_names_ = names
        model.n_features_in_ = len(names)
        model.offset_index_ = names.index(OFFSET) if OFFSET in names else None
        model.n_train_ = int(data["n_train"])
        model.n_feasible_ = int(data["n_feasible"])
        model.p_feasible_ = float(data["p_feasible"])
        slope, intercept = data["calibration"]
        model.calibration_ = (float(slope), float(intercept))
        base = data.get("offset_coef", (0.0, 1.0))  # saved before the offset was fitted
        model.offset_coef_ = (float(base[0]), float(base[1]))
        model.members_ = [_booster_from_json(m, model.n_jobs) for m in data["members"]]
        clf = data.get("classifier")
        model.classifier_ = None if clf is None else _booster_from_json(clf, model.n_jobs)
        gp = data.get("gp")
        model.gp_ = None if gp is None else KernelModel.load(gp)
        return model


def _class_sample(labels: np.ndarray, cap: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``cap`` rows for the feasibility classifier, and their weights.

    Whether a config runs is a simpler function than how fast it runs: a sample of a long
    history teaches it as well, in a bounded time. The rarer class keeps up to half the
    sample, and weights restore each class's share of the whole history.
    """
    n = len(labels)
    if n <= cap:
        return np.arange(n), np.ones(n)
    rng = np.random.default_rng(seed)
    pos, neg = np.flatnonzero(labels), np.flatnonzero(~labels)
    rare, common = (pos, neg) if len(pos) <= len(neg) else (neg, pos)
    k = min(len(rare), cap // 2)
    take = [rng.choice(rare, k, replace=False), rng.choice(common, cap - k, replace=False)]
    rows = np.concatenate(take)
    weight = np.concatenate(
        [np.full(k, len(rare) / max(k, 1)), np.full(cap - k, len(common) / (cap - k))]
    )
    order = np.argsort(rows)
    return rows[order], weight[order]


def _booster_json(booster: xgb.Booster) -> str:
    """XGBoost's own JSON model, verbatim (kept as text so that it loads bit for bit)."""
    return bytes(booster.save_raw("json")).decode()


def _booster_from_json(text: str, n_jobs: int) -> xgb.Booster:
    booster = xgb.Booster()
    booster.load_model(bytearray(text.encode()))
    booster.set_param({"nthread": int(n_jobs)})
    return booster


def _study_rows(groups: Any, codes: np.ndarray, ok: np.ndarray, gp_group: Any) -> np.ndarray:
    """Positions, among the feasible rows ``ok``, of the study the GP learns: ``gp_group``,
    else the only group; none when several groups and no ``gp_group`` are given."""
    if gp_group is not None and groups is not None:
        return np.flatnonzero(np.asarray(groups).astype(str).reshape(-1)[ok] == str(gp_group))
    if len(np.unique(codes[ok])) == 1:
        return np.arange(int(ok.sum()))
    return np.zeros(0, dtype=np.int64)


def _group_codes(groups: Any) -> np.ndarray:
    _, codes = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    return codes.reshape(-1).astype(np.int64)


def select_objective(
    X: Any,
    y: Any,
    feasible: Any,
    groups: Any = None,
    *,
    k: int = 5,
    seed: int = 0,
    **params: Any,
) -> tuple[str, dict[str, dict[str, Any]]]:
    """Cross-validate the regression and the ranking objective; keep the better ranker.

    Returns the objective with the higher mean Kendall tau (the regression on ties or when
    neither can be scored) and each objective's cross-validation results.
    """
    from cubic.proxy.quality import cross_validate

    results: dict[str, dict[str, Any]] = {}
    for objective in OBJECTIVES:
        factory: Callable[[], ProxyModel] = _factory(objective, seed, params)
        results[objective] = cross_validate(factory, X, y, feasible, k=k, seed=seed, groups=groups)
    taus = {o: results[o].get("kendall_tau") for o in OBJECTIVES}
    best = "regression"
    if taus["rank"] is not None and (
        taus["regression"] is None or taus["rank"] > taus["regression"]
    ):
        best = "rank"
    return best, results


def _factory(objective: str, seed: int, params: dict[str, Any]) -> Callable[[], ProxyModel]:
    return lambda: ProxyModel(objective=objective, seed=seed, **params)

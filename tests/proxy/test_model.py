"""ProxyModel: fit, predict, feasibility, persistence and speed."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import xgboost as xgb
from sklearn.base import clone

from cubic.proxy.features import OFFSET, feature_names
from cubic.proxy.model import FORMAT, ProxyModel, _rank_calibration, select_objective
from tests.proxy.simdata import measured, stacked, workload


def _synthetic(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Throughput exp(x0 + 0.5 x1) where x2 < 0.8, infeasible elsewhere."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, 4))
    feasible = X[:, 2] < 0.8
    y = np.where(feasible, np.exp(2 * X[:, 0] + X[:, 1]) * 1000, np.nan)
    return X, y, feasible


def test_fit_predict_feasible() -> None:
    X, y, feasible = _synthetic()
    model = ProxyModel(seed=1)
    assert model.fit(X, y, feasible) is model
    Xt, yt, ft = _synthetic(200, seed=2)
    mean, std = model.predict(Xt)
    assert mean.shape == std.shape == (200,)
    assert np.all(mean > 0) and np.all(std >= 0) and std.max() > 0
    rel = np.abs(mean[ft] / yt[ft] - 1)
    assert np.median(rel) < 0.1  # throughput units, not log
    log_mean, log_std = model.predict_log(Xt)
    np.testing.assert_allclose(np.exp(log_mean), mean)
    np.testing.assert_array_equal(log_std, std)
    p = model.feasible(Xt)
    assert np.all((p >= 0) & (p <= 1))
    assert p[ft].mean() > 0.9 and p[~ft].mean() < 0.1
    assert model.n_features_in_ == 4 and model.feature_names_ == ["f0", "f1", "f2", "f3"]


def test_single_class_gives_a_constant_probability() -> None:
    X, y, _ = _synthetic()
    ok = np.isfinite(y)
    model = ProxyModel().fit(X[ok], y[ok], np.ones(ok.sum(), bool))
    assert model.classifier_ is None
    np.testing.assert_array_equal(model.feasible(X[:5]), np.ones(5))


def test_fit_validates_its_input() -> None:
    X, y, feasible = _synthetic(50)
    with pytest.raises(ValueError, match="features"):
        ProxyModel(kind="llm").fit(X, y, feasible)
    with pytest.raises(ValueError, match="two feasible"):
        ProxyModel().fit(X, y, np.zeros(50, bool))
    with pytest.raises(ValueError, match="positive"):
        ProxyModel().fit(X, np.where(feasible, -1.0, np.nan), feasible)
    with pytest.raises(ValueError, match="rows"):
        ProxyModel().fit(X, y[:10], feasible)
    with pytest.raises(ValueError, match="objective"):
        ProxyModel(objective="lambdamart").fit(X, y, feasible)
    bad = X.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ProxyModel().fit(bad, y, feasible)
    with pytest.raises(RuntimeError, match="not fitted"):
        ProxyModel().predict(X)
    model = ProxyModel(n_estimators=5).fit(X, y, feasible)
    with pytest.raises(ValueError, match="features"):
        model.predict(X[:, :3])


def test_scikit_learn_conventions() -> None:
    model = ProxyModel(kind="dlrm", max_depth=3)
    twin = clone(model)
    assert twin.get_params() == model.get_params()
    assert not hasattr(twin, "members_")


def test_save_load_round_trip_is_exact_and_json() -> None:
    wl = workload("llama3_70b")
    _, X, y, feasible = measured(wl, 300, 3)
    model = ProxyModel(kind="llm", seed=4).fit(X, y, feasible)
    saved = model.save()
    text = json.dumps(saved, allow_nan=False)  # plain JSON: no pickle, no bytes, no NaN
    doc = json.loads(text)
    assert doc["format"] == FORMAT and doc["kind"] == "llm"
    assert doc["feature_names"] == feature_names("llm")
    assert doc["versions"]["xgboost"] == xgb.__version__ and doc["versions"]["cubic"]
    assert doc["params"]["max_depth"] == model.max_depth
    assert len(doc["members"]) == model.n_members and doc["classifier"] is not None
    assert json.loads(doc["members"][0])["learner"]  # XGBoost's own JSON model
    assert len(doc["gp"]["Z"]) == min(model.gp_rows, feasible.sum())  # its newest rows
    loaded = ProxyModel.load(doc)
    _, Xt, _, _ = measured(wl, 500, 5)
    for a, b in zip(model.predict(Xt), loaded.predict(Xt), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.feasible(Xt), loaded.feasible(Xt))
    assert loaded.get_params() == model.get_params()


def test_load_refuses_other_formats_and_features() -> None:
    X, y, feasible = _synthetic(60)
    saved = ProxyModel(n_estimators=5).fit(X, y, feasible).save()
    with pytest.raises(ValueError, match="format"):
        ProxyModel.load({**saved, "format": "pickle"})
    stale = {**saved, "params": {**saved["params"], "kind": "llm"}}
    with pytest.raises(ValueError, match="feature names"):
        ProxyModel.load(stale)


def test_throughput_is_learned_relative_to_the_roofline() -> None:
    """What is learned is efficiency, so it carries over to a workload ten times faster."""
    i = feature_names("llm").index(OFFSET)
    _, X, _, feasible = measured(workload("llama3_8b", num_gpus=16), 300, 0)
    y = np.where(feasible, 0.4 * np.exp(X[:, i]), np.nan)  # 40 % of the roofline everywhere
    model = ProxyModel(kind="llm").fit(X, y, feasible)
    _, Xt, _, _ = measured(workload("llama3_70b", "h200", 128), 300, 0)
    np.testing.assert_allclose(model.predict(Xt)[0], 0.4 * np.exp(Xt[:, i]), rtol=1e-3)


def test_rank_objective_and_selection() -> None:
    w8, w70 = workload("llama3_8b", num_gpus=16), workload("llama3_70b")
    parts = [measured(w8, 200, 1), measured(w70, 200, 1)]
    X, y, feasible = stacked(parts)
    groups = np.repeat([8, 70], 200)
    ranker = ProxyModel(kind="llm", objective="rank").fit(X, y, feasible, groups)
    mean, std = ranker.predict(X)
    assert np.all(np.isfinite(mean)) and np.all(std >= 0)
    assert ranker.calibration_[0] > 0
    best, results = select_objective(X, y, feasible, groups, k=3, kind="llm", n_estimators=30)
    assert best in ("regression", "rank")
    assert set(results) == {"regression", "rank"}
    taus = {o: r["kendall_tau"] for o, r in results.items()}
    assert taus[best] == max(taus.values())


def test_rankers_map_to_log_throughput_by_the_slope_within_workloads() -> None:
    """Pairwise rankers fix each workload's scores only up to a shift of their own. Where
    a workload's scores sit high and its throughput low, a line through both workloads'
    rows slopes down and flattens every predicted gain to nothing; within each workload the
    scores track log throughput one to one."""
    s = np.linspace(0.0, 1.0, 50)
    scores = np.concatenate([s, s + 5.0])
    target = np.concatenate([s, s - 10.0])
    groups = np.repeat([0, 1], 50)
    assert np.polyfit(scores, target, 1)[0] < 0  # what one line through all rows says
    slope, intercept = _rank_calibration(scores, target, groups)
    assert slope == pytest.approx(1.0)
    assert intercept == pytest.approx(np.mean(target) - np.mean(scores))


def test_centered_groups_learn_the_differences_within_a_workload_not_its_level() -> None:
    rng = np.random.default_rng(0)
    x, level = rng.uniform(0, 1, 400), np.repeat([0.0, 1.0], 200)
    X = np.column_stack([x, level])
    y = np.exp(x + 5.0 * level)
    probe = np.array([[0.2, 0.0], [0.8, 0.0], [0.2, 1.0], [0.8, 1.0]])
    means = {}
    for center in (False, True):
        model = ProxyModel(gp_weight=0.0, center_groups=center)
        means[center] = model.fit(X, y, np.ones(400, bool), level).predict_log(probe)[0]
    assert means[False][2] - means[False][0] > 4.0  # the level is learned
    assert abs(means[True][2] - means[True][0]) < 0.2  # taken out
    assert means[True][1] - means[True][0] > 0.4  # the difference within stays


def test_a_long_history_fits_and_ranks_held_out_configs() -> None:
    """5,000 trials fit, and 10,000 unseen configs are ranked well (the fit and scoring
    times are printed, not asserted: a loaded machine says nothing about them)."""
    from scipy.stats import kendalltau

    wl = workload("llama3_8b")
    _, X, y, feasible = measured(wl, 15_000, 7)
    model = ProxyModel(kind="llm")
    start = time.perf_counter()
    model.fit(X[:5000], y[:5000], feasible[:5000])
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    pred, _ = model.predict(X[5000:])
    p_ok = model.feasible(X[5000:])
    predict_s = time.perf_counter() - start
    print(
        f"\nfit 5,000 rows ({int(feasible[:5000].sum())} feasible): {fit_s:.2f} s; "
        f"predict + feasible on 10,000 rows: {predict_s:.3f} s"
    )
    held = feasible[5000:]
    assert pred.shape == (10_000,) and np.isfinite(pred).all()
    assert kendalltau(pred[held], y[5000:][held]).statistic > 0.8
    # The classifier separates what runs from what does not.
    assert p_ok[held].mean() > p_ok[~held].mean() + 0.5


def test_offset_auto_fits_the_base_for_one_workload_and_learns_efficiency_across() -> None:
    i = feature_names("llm").index(OFFSET)
    w8, w70 = workload("llama3_8b", num_gpus=16), workload("llama3_70b")
    _, X8, y8, f8 = measured(w8, 120, 2)
    _, X70, y70, f70 = measured(w70, 120, 2)
    one = ProxyModel(kind="llm", offset="auto", n_estimators=20).fit(X8, y8, f8)
    fit8 = ProxyModel(kind="llm", offset="fitted", n_estimators=20).fit(X8, y8, f8)
    assert one.offset_coef_ == fit8.offset_coef_
    raw = ProxyModel(kind="llm", offset="none", n_estimators=20).fit(X8, y8, f8)
    assert raw.offset_coef_ == (0.0, 0.0)
    X, y, f = np.vstack([X8, X70]), np.concatenate([y8, y70]), np.concatenate([f8, f70])
    groups = np.repeat([8, 70], 120)
    both = ProxyModel(kind="llm", offset="auto", n_estimators=20).fit(X, y, f, groups)
    assert both.offset_coef_ == (0.0, 1.0)
    fitted = ProxyModel(kind="llm", offset="fitted", n_estimators=20).fit(X8, y8, f8)
    assert 0.0 <= fitted.offset_coef_[1] <= 1.0
    # The base travels with a saved model.
    again = ProxyModel.load(fitted.save())
    np.testing.assert_array_equal(again.predict(X70)[0], fitted.predict(X70)[0])
    assert np.isfinite(X8[:, i]).all()
    with pytest.raises(ValueError, match="offset"):
        ProxyModel(kind="llm", offset="median").fit(X8, y8, f8)


def test_a_long_history_trains_the_classifier_on_a_weighted_sample() -> None:
    """Beyond ``classifier_rows`` the classifier learns from a sample that keeps the rare
    class (weighted back to its share), so its probabilities stay calibrated."""
    rng = np.random.default_rng(0)
    X = rng.random((6000, 4))
    feasible = X[:, 2] < 0.1  # rare: about 10 % run
    y = np.where(feasible, np.exp(X[:, 0]) * 1000, np.nan)
    model = ProxyModel(seed=0, n_members=1, classifier_rows=1000).fit(X, y, feasible)
    Xt = rng.random((2000, 4))
    p = model.feasible(Xt)
    truth = Xt[:, 2] < 0.1
    assert p[truth].mean() > 0.8 and p[~truth].mean() < 0.1
    assert abs(p.mean() - truth.mean()) < 0.05  # the weights undo the rebalanced sample
    assert ProxyModel.load(json.loads(json.dumps(model.save()))).classifier_rows == 1000
    with pytest.raises(ValueError, match="classifier_rows"):
        ProxyModel(classifier_rows=0).fit(X, y, feasible)

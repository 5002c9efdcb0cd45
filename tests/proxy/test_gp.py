"""The Gaussian-process half of the proxy: what it keeps, how it predicts, how it is saved."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from cubic.proxy.gp import KernelModel
from cubic.proxy.model import GP_MIN_ROWS, ProxyModel
from cubic.proxy.quality import cross_validate
from tests.proxy.simdata import measured, stacked, workload


def _smooth(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns x0, x1, x2, a constant and a copy of x0; target sin(3 x0) + x1^2."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 3))
    X = np.column_stack([x, np.full(n, 7.0), 2.0 * x[:, 0] + 1.0])
    return X, np.sin(3.0 * x[:, 0]) + x[:, 1] ** 2


def test_drops_constant_and_copied_columns_and_interpolates() -> None:
    X, t = _smooth(40, 0)
    model = KernelModel().fit(X, t)
    assert model.keep_.tolist() == [0, 1, 2]
    Xt, tt = _smooth(300, 1)
    mean, _ = model.predict(Xt)
    assert stats.kendalltau(mean, tt).statistic > 0.9
    # Less sure away from the data than at a measured row.
    far = np.array([[3.0, 3.0, 3.0, 7.0, 7.0]])
    assert model.predict(far)[1][0] > 5 * model.predict(X[:1])[1][0]


def test_saved_as_json_and_loaded_without_refitting_the_kernel() -> None:
    X, t = _smooth(40, 0)
    model = KernelModel().fit(X, t)
    doc = json.loads(json.dumps(model.save()))
    loaded = KernelModel.load(doc)
    Xt, _ = _smooth(50, 2)
    for a, b in zip(model.predict(Xt), loaded.predict(Xt), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(loaded.gp_.kernel_.theta, model.gp_.kernel_.theta)


def test_proxy_fits_it_on_the_newest_rows_and_blends_its_mean() -> None:
    wl = workload("llama3_8b", num_gpus=16)
    _, X, y, feasible = measured(wl, 80, 0)
    blended = ProxyModel(kind="llm", gp_weight=0.7, gp_rows=20).fit(X, y, feasible)
    trees = ProxyModel(kind="llm", gp_weight=0.0).fit(X, y, feasible)
    assert trees.gp_ is None and blended.gp_ is not None
    newest = X[feasible][-20:]
    np.testing.assert_array_equal(
        blended.gp_.gp_.X_train_, (newest[:, blended.gp_.keep_] - blended.gp_.mu_) / blended.gp_.sd_
    )
    _, Xt, _, _ = measured(wl, 50, 1)
    gp_mean, _ = blended.gp_.predict(Xt)
    tree_mean, _ = trees.predict_log(Xt)
    base = blended._offset(Xt)
    np.testing.assert_allclose(
        blended.predict_log(Xt)[0], 0.3 * (tree_mean - base) + 0.7 * gp_mean + base, rtol=1e-9
    )
    few = np.flatnonzero(feasible)[: GP_MIN_ROWS - 1]
    assert ProxyModel(kind="llm").fit(X[few], y[few], feasible[few]).gp_ is None


def test_gp_weight_is_checked() -> None:
    wl = workload("llama3_8b", num_gpus=16)
    _, X, y, feasible = measured(wl, 30, 0)
    with pytest.raises(ValueError, match="gp_weight"):
        ProxyModel(kind="llm", gp_weight=1.5).fit(X, y, feasible)
    with pytest.raises(ValueError, match="gp_rows"):
        ProxyModel(kind="llm", gp_rows=0).fit(X, y, feasible)


def test_blend_ranks_held_out_trials_better_than_the_trees_alone() -> None:
    """64 trials of the DCNv2 study: the trees tie configurations that share a leaf; the
    blend with the GP separates them (pooled out-of-fold Kendall tau)."""
    wl = workload("dlrm_criteo_dcnv2")
    _, X, y, feasible = measured(wl, 64, 0)
    taus = {
        w: cross_validate(
            lambda w=w: ProxyModel(kind="dlrm", offset="auto", gp_weight=w),
            X,
            y,
            feasible,
            k=5,
            seed=0,
        )["pooled"]["kendall_tau"]
        for w in (0.0, 0.7)
    }
    print(f"\npooled CV Kendall tau: trees {taus[0.0]:.3f}, blend {taus[0.7]:.3f}")
    assert taus[0.7] > taus[0.0] + 0.02


def test_learns_only_the_study_it_ranks() -> None:
    """Trees learn every study of the kind; the GP only ``gp_group`` (or the only group)."""
    parts = [
        measured(workload("llama3_8b", num_gpus=16), 40, 1),
        measured(workload("llama3_70b"), 120, 1),
    ]
    X, y, feasible = stacked(parts)
    groups = np.repeat(["this", "other"], [40, 120])
    assert ProxyModel(kind="llm").fit(X, y, feasible, groups).gp_ is None
    model = ProxyModel(kind="llm").fit(X, y, feasible, groups, gp_group="this")
    mine = X[:40][feasible[:40]]
    assert len(model.gp_.gp_.X_train_) == len(mine)
    np.testing.assert_allclose(model.gp_.mu_, mine[:, model.gp_.keep_].mean(axis=0))


def _layouts(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Five layouts (column 0) of uneven speed, a switch (column 1) worth +0.3 in every
    layout and a switch (column 2) worth nothing; layout 4 was measured only with the good
    switch off, twice per (layout, switch) otherwise."""
    rng = np.random.default_rng(seed)
    speed = np.array([0.0, 0.5, 0.1, 0.6, 0.2])
    rows = [
        (lay, on, int(rng.integers(0, 2)))
        for lay in range(5)
        for on in (0, 1)
        for _ in range(2)
        if not (lay == 4 and on == 1)
    ]
    X = np.array(rows, dtype=float)
    target = speed[X[:, 0].astype(int)] + 0.3 * X[:, 1] + rng.normal(0.0, 0.005, len(X))
    return X, target


@pytest.mark.parametrize("seed", range(3))
def test_the_linear_part_carries_a_switch_to_a_layout_measured_without_it(seed: int) -> None:
    """A layout measured only with poor switches: the Matern kernel alone reverts towards
    the mean there, the linear part adds the switch's effect measured in every other
    layout (truth 0.5)."""
    X, target = _layouts(seed)
    query = np.array([[4.0, 1.0, 0.0]])
    plain = KernelModel(seed).fit(X, target).predict(query)[0][0]
    linear = KernelModel(seed, linear=[0, 1, 2]).fit(X, target).predict(query)[0][0]
    assert abs(linear - 0.5) < 0.05 < abs(plain - 0.5)


def test_familiarity_follows_the_learned_length_scales() -> None:
    """1 at a measured row; a row that differs only in a column that never mattered is more
    familiar than one in a layout never measured."""
    X, target = _layouts(0)
    model = KernelModel(linear=[0, 1, 2]).fit(X, target)
    np.testing.assert_allclose(model.familiarity(X), 1.0)
    flipped = X[:1].copy()
    flipped[0, 2] = 1.0 - flipped[0, 2]
    unmeasured = np.array([[9.0, 0.0, 0.0]])
    assert model.familiarity(flipped)[0] > 0.9 > model.familiarity(unmeasured)[0]


def test_a_linear_kernel_is_saved_and_loaded_as_it_was() -> None:
    X, target = _layouts(1)
    model = KernelModel(linear=[0, 1, 2]).fit(X, target)
    loaded = KernelModel.load(json.loads(json.dumps(model.save())))
    assert loaded.linear == [0, 1, 2]
    query = np.array([[4.0, 1.0, 0.0], [2.0, 0.0, 1.0]])
    for a, b in zip(model.predict(query), loaded.predict(query), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # A GP saved before the option existed loads as the Matern kernel it was.
    doc = KernelModel().fit(X, target).save()
    del doc["linear"]
    assert KernelModel.load(doc).linear is None

"""The lossy embedding exchange: fixed bound against per-table, per-phase adaptive bounds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cubic.shipped import shipped
from cubic.sim.dlrm import simulate_dlrm
from cubic.sim.lossy_a2a import (
    ADAPTIVE_MAX_BOUND,
    PHASES,
    TABLE_SENSITIVITY_SPAN,
    adaptive_exchange,
    adaptive_plan,
    lossy_ratio,
    table_sensitivity,
)
from cubic.study import load_spec
from cubic.workload import DLRM, PRESETS, Cluster, EmbeddingTable, Training, Workload

DCN = PRESETS["dlrm_criteo_dcnv2"]
STUDY = shipped("dlrm_dcnv2_adaptive_lossy.study.yaml")


def _study():
    assert STUDY is not None, "the worked example study is shipped"
    spec, base = load_spec(STUDY)
    resolved = spec.resolve(base)
    baseline = resolved.space.complete(dict(spec.baseline), resolved.context)
    baseline.pop("global_batch")
    return spec, resolved, baseline


# ---- the model ----------------------------------------------------------------------------


def test_table_sensitivity_falls_with_size_and_traffic():
    tables = [
        EmbeddingTable("tiny", 4, 128),
        EmbeddingTable("mid", 50_000, 128, pooling=2.0),
        EmbeddingTable("hot", 50_000, 128, pooling=20.0),
        EmbeddingTable("huge", 40_000_000, 128, pooling=20.0),
    ]
    s = table_sensitivity(tables)
    assert s[0] == pytest.approx(TABLE_SENSITIVITY_SPAN)
    assert s[3] == pytest.approx(1.0 / TABLE_SENSITIVITY_SPAN)
    assert s[0] > s[1] > s[2] > s[3]
    # Tables alike in size and traffic are alike, and nothing is adapted between them.
    same = table_sensitivity([EmbeddingTable(f"t{i}", 1000, 64) for i in range(3)])
    np.testing.assert_array_equal(same, 1.0)


def test_adaptive_bounds_spend_the_fixed_bounds_error_budget_for_more_compression():
    sens = np.array([4.0, 1.0, 0.25])
    weight = np.array([[128.0, 128.0, 128.0], [128.0, 128.0, 0.0]])
    budget = np.array([1e-3, 2e-3])
    bounds, q, err = adaptive_plan(budget, weight, sens)
    assert bounds.shape == (2, 3, len(PHASES))
    # The weighted error equals the fixed bound's (no bound reaches the cap here) ...
    np.testing.assert_allclose(err, 1.0)
    assert bounds.max() < ADAPTIVE_MAX_BOUND
    # ... and, the ratio being concave in the bound, it buys fewer bytes on the wire.
    assert np.all(q < 4.0 / lossy_ratio(budget))
    # Looser for tolerant tables and early phases, tighter for sensitive ones and late.
    assert np.all(np.diff(bounds[0], axis=0) > 0)  # tables by falling sensitivity
    assert np.all(np.diff(bounds[0], axis=1) < 0)  # phases, early to late
    # Near the cap the bounds stop growing: the error falls below the budget instead.
    capped, _, err = adaptive_plan(np.array([0.05]), weight[:1], sens)
    assert capped.max() == ADAPTIVE_MAX_BOUND and err[0] < 1.0


def test_only_tables_that_cross_the_exchange_are_weighed():
    tables = DCN.model.tables
    cls = np.array([0 if t.rows >= 1e6 else 1 if t.rows >= 1e4 else 2 for t in tables])
    ex = np.array([[True, True, True], [True, True, False], [False, False, False]])
    q, err = adaptive_exchange(tables, cls, np.full(3, 0.01), ex)
    # Small (sensitive) tables kept data-parallel leave the rest a different budget share.
    assert q[0] != q[1]
    # Nothing exchanged: priced over every table, as the error score still counts.
    assert q[2] == q[0] and err[2] == err[0]
    # A class this workload has no table of crosses nothing either.
    only_large = [t for t in tables if t.rows >= 1e6]
    q1, _ = adaptive_exchange(only_large, np.zeros(len(only_large), int), [0.01], [[0, 1, 0]])
    assert np.isfinite(q1).all() and q1[0] < 4.0 / lossy_ratio(0.01)


def test_adaptive_knob_only_changes_a_lossy_exchange():
    wl = replace(DCN, cluster=Cluster("h100_sxm", 64, 8))
    for prec in ("fp32", "fp16", "fp8"):
        res = simulate_dlrm(wl, [{"a2a_precision": prec, "lossy_adaptive": a} for a in (0, 1)])
        assert res.row(0) == res.row(1)
    res = simulate_dlrm(
        wl,
        [
            {"a2a_precision": "lossy", "lossy_error_bound": 1e-3, "lossy_adaptive": a}
            for a in (False, True)
        ],
    )
    assert res.breakdown["a2a"][1] < res.breakdown["a2a"][0]
    assert res.error_score[1] == pytest.approx(res.error_score[0])
    bad = simulate_dlrm(wl, [{"a2a_precision": "lossy", "lossy_error_bound": 0.0}])
    assert not bad.valid[0] and "lossy_error_bound" in bad.reason[0]


def test_batch_of_adaptive_configs_equals_one_at_a_time():
    rng = np.random.default_rng(3)
    wl = replace(DCN, cluster=Cluster("a100_80gb", 16, 8))
    cfgs = [
        {
            "sharding_large": str(rng.choice(["table_wise", "row_wise", "table_row_wise"])),
            "sharding_medium": str(rng.choice(["table_wise", "data_parallel"])),
            "sharding_small": str(rng.choice(["row_wise", "data_parallel"])),
            "a2a_precision": str(rng.choice(["fp16", "lossy"])),
            "lossy_error_bound": float(rng.choice([1e-3, 1e-2, 5e-2])),
            "lossy_adaptive": bool(rng.random() < 0.5),
        }
        for _ in range(40)
    ]
    batch = simulate_dlrm(wl, cfgs)
    for i, c in enumerate(cfgs):
        assert simulate_dlrm(wl, [c]).row(0) == batch.row(i)


# ---- the worked example study -------------------------------------------------------------


def test_adaptive_exchange_beats_every_fixed_bound_at_equal_or_lower_error():
    """DLRM-DCNv2 on 64 H100 at the study's baseline (TorchRec's row-wise plan, whose
    exchange crosses the NICs): against fixed bounds from 1e-4 to 0.1, the adaptive exchange
    at each bound the space offers is faster than every fixed bound with no more error, and
    has less error than every fixed bound at least as fast (Feng et al., SC'24)."""
    spec, study, baseline = _study()
    choices = study.space["lossy_error_bound"].choices
    grid = np.geomspace(1e-4, 0.1, 61)
    lossy = dict(baseline, a2a_precision="lossy")
    configs = [dict(lossy, lossy_error_bound=float(b), lossy_adaptive=False) for b in grid]
    configs += [dict(lossy, lossy_error_bound=b, lossy_adaptive=True) for b in choices]
    configs += [dict(baseline, a2a_precision="fp32")]
    res = simulate_dlrm(study.workload, configs)
    assert res.feasible.all()
    thr, err = res.throughput, res.error_score
    n = len(grid)
    fixed_thr, fixed_err = thr[:n], err[:n]
    assert np.all(np.diff(fixed_thr) > 0)  # the exchange is exposed: a looser bound pays
    for k, b in enumerate(choices):
        a_thr, a_err = thr[n + k], err[n + k]
        no_worse = fixed_err <= a_err + 1e-9
        assert no_worse.any() and np.all(fixed_thr[no_worse] < a_thr), b
        as_fast = fixed_thr >= a_thr
        assert np.all(fixed_err[as_fast] > a_err), b
        # Against the fixed bound itself: faster at no more error.
        same = simulate_dlrm(study.workload, [dict(lossy, lossy_error_bound=b)])
        assert a_thr > same.throughput[0] and a_err <= same.error_score[0] + 1e-9
    # Under the study's error budget the best adaptive exchange beats the best fixed one.
    budget = spec.constraints.max_error_score
    ok = err <= budget
    assert thr[n : n + len(choices)][ok[n : n + len(choices)]].max() > fixed_thr[ok[:n]].max()
    # And lossy compression itself pays where the exchange dominates the step.
    assert thr[n + list(choices).index(0.01)] > thr[-1]


def test_in_the_study_space_adaptive_never_loses_and_wins_where_the_exchange_shows():
    """Every fixed-bound configuration of the study's space (a random 4,000) against its
    adaptive twin: never slower, never more error; strictly faster wherever a looser fixed
    bound would have been faster, i.e. wherever the exchange is on the critical path."""
    _, study, _ = _study()
    arrays = study.space.enumerate_arrays(study.context)
    fixed = np.flatnonzero((arrays["a2a_precision"] == "lossy") & ~arrays["lossy_adaptive"])
    rows = np.random.default_rng(0).choice(fixed, 4000, replace=False)
    base = {k: v[rows] for k, v in arrays.items() if k != "global_batch"}
    looser = dict(base, lossy_error_bound=base["lossy_error_bound"] * 1.5)
    twin = dict(base, lossy_adaptive=np.ones(len(rows), bool))
    res = [simulate_dlrm(study.workload, c) for c in (base, looser, twin)]
    f, lo, ad = res
    np.testing.assert_array_equal(ad.feasible | ~f.feasible, True)
    assert np.all(ad.throughput >= f.throughput)
    assert np.all(ad.error_score <= f.error_score + 1e-9)
    exposed = f.feasible & (lo.throughput > f.throughput)
    assert exposed.any() and np.all(ad.throughput[exposed] > f.throughput[exposed])


def test_a_workload_whose_exchanged_classes_hold_no_table_prices_every_table():
    """Two alike small tables kept data-parallel: nothing crosses the exchange, so the plan
    weighs every table; alike tables leave only the phases to adapt, within the budget."""
    tables = (EmbeddingTable("a", 5_000, 64), EmbeddingTable("b", 5_000, 64))
    wl = Workload("t", DLRM("t", tables), Cluster("a100_80gb", 16, 8), Training())
    cfg = {"a2a_precision": "lossy", "lossy_error_bound": 0.01, "sharding_small": "data_parallel"}
    res = simulate_dlrm(wl, [dict(cfg, lossy_adaptive=a) for a in (False, True)])
    assert res.feasible.all() and np.isfinite(res.step_time).all()
    assert res.error_score[1] == pytest.approx(res.error_score[0]) == pytest.approx(0.4)

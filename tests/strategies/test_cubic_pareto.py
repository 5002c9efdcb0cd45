"""The ``cubic`` strategy on a study of two objectives: it proposes for the Pareto front."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cubic.pareto import hypervolume, oriented, reference_point
from cubic.store.objects import Trial, TrialState
from cubic.strategies import config_key, make_strategy
from cubic.strategies.cubic import CubicStrategy
from cubic.study import ResolvedStudy, load_spec
from tests.strategies.test_cubic import _run

BENCH_MO = Path(__file__).resolve().parents[2] / "search_spaces" / "bench_mo"
DIRECTIONS = ["maximize", "minimize"]


def _study() -> ResolvedStudy:
    spec, base = load_spec(BENCH_MO / "llama3_8b_h100x16_memory.study.yaml")
    spec = spec.model_copy(
        update={"strategy": spec.strategy.model_copy(update={"name": "cubic", "seed": 0})}
    )
    return spec.resolve(base)


def _points(trials: list[Trial]) -> np.ndarray:
    vals = [
        [t.metrics["tokens_per_s"], t.metrics["peak_memory_gb"]]
        for t in trials
        if t.state == TrialState.COMPLETE
    ]
    return oriented(vals, DIRECTIONS)


def test_two_objectives_improve_the_hypervolume_over_the_warm_up() -> None:
    study = _study()
    strategy = make_strategy(study)
    assert isinstance(strategy, CubicStrategy)
    history = _run(study, strategy, 24)
    phases = [t.predicted["phase"] for t in history]
    assert phases[:8] == ["warm-up"] * 8 and set(phases[8:]) == {"model"}
    assert len({config_key(t.params) for t in history}) == len(history)
    guided = history[8:]
    # Each proposal predicts every objective and says how it was chosen: every fourth
    # model-guided pick goes to the front's fast end by the throughput's own acquisition.
    acquisitions = [t.predicted["acquisition"] for t in guided]
    assert set(acquisitions) <= {"ehvi", "anchor-ei", "anchor-ucb"}
    assert [a.startswith("anchor-") for a in acquisitions] == [
        i % 4 == 0 for i in range(len(guided))
    ]
    anchors = [a for a in acquisitions if a != "ehvi"]
    assert anchors[:2] == ["anchor-ei", "anchor-ucb"]  # the portfolio's turns, as alone
    fast = [t.predicted["values"][0] for t in guided if t.predicted["acquisition"] != "ehvi"]
    front = [t.predicted["values"][0] for t in guided if t.predicted["acquisition"] == "ehvi"]
    assert np.median(fast) > np.median(front)
    # The GP's linear part is for one objective (see CubicStrategy).
    assert strategy.gp_linear is False and strategy._model[1].gp_.linear is None
    assert all(len(t.predicted["values"]) == 2 for t in guided)
    # The memory prediction is the corrected arithmetic estimate: close to what ran.
    ran = [t for t in guided if t.state == TrialState.COMPLETE]
    err = [abs(np.log(t.predicted["values"][1] / t.metrics["peak_memory_gb"])) for t in ran]
    assert np.median(err) < 0.15
    warm, everything = _points(history[:8]), _points(history)
    ref = reference_point(everything)
    assert hypervolume(everything, ref) > 1.1 * hypervolume(warm, ref)
    # The guided trials spread along the front: more than one memory level on it.
    on_front = _points(ran)
    assert len(np.unique(np.round(on_front[:, 1]))) >= 3


def test_single_objective_proposals_carry_no_front_fields() -> None:
    spec, base = load_spec(BENCH_MO / "llama3_8b_h100x16_memory.study.yaml")
    one = spec.model_copy(update={"objectives": spec.objectives[:1]}).resolve(base)
    history = _run(one, make_strategy(one), 16)
    assert all("values" not in t.predicted for t in history)
    assert {t.predicted.get("acquisition") for t in history[8:]} <= {"ei", "ucb", "lcb"}


def test_three_objectives_take_random_scalarisations() -> None:
    """With three objectives the rounds are ParEGO's: each pick carries every objective's
    prediction, and cost (GPU-hours per million tokens) follows the throughput's inverse."""
    spec, base = load_spec(BENCH_MO / "llama3_8b_h100x16_memory.study.yaml")
    objectives = [*spec.objectives, spec.objectives[1].model_copy(update={"metric": "cost"})]
    three = spec.model_copy(update={"objectives": objectives}).resolve(base)
    history = _run(three, make_strategy(three), 16)
    guided = history[8:]
    assert {t.predicted["acquisition"] for t in guided} == {"parego"}
    assert len({config_key(t.params) for t in history}) == len(history)
    for t in guided:
        thr, _, cost = t.predicted["values"]
        assert cost == pytest.approx(1e6 / (thr * 3600) * 16, rel=1e-3)


def _guided_trial(number: int, predicted_thr: float, measured_thr: float) -> Trial:
    return Trial.detached(
        number,
        {},
        TrialState.COMPLETE,
        {"tokens_per_s": measured_thr, "peak_memory_gb": 30.0},
        predicted={"phase": "model", "values": [predicted_thr, 30.0], "log_std": 0.03},
    )


def test_the_spread_follows_how_far_the_proxy_has_been_off() -> None:
    """The proxy's own spread says little early on: the error its past picks measured is
    added to it, pooled with a prior that holds until a few picks have been measured."""
    strategy = make_strategy(_study())
    assert isinstance(strategy, CubicStrategy)
    prior = strategy.error_prior_sd
    assert strategy._prediction_error([]) == pytest.approx(prior)
    overrated = [_guided_trial(i, 130_000.0, 100_000.0) for i in range(1, 21)]
    assert strategy._prediction_error(overrated) == pytest.approx(np.log(1.3), rel=0.1)
    exact = [_guided_trial(i, 100_000.0, 100_000.0) for i in range(1, 21)]
    assert strategy._prediction_error(exact) < prior / 2
    # Warm-up trials (no prediction) and trials that did not complete say nothing.
    warm = [
        Trial.detached(i, {}, TrialState.COMPLETE, {"tokens_per_s": 1.0, "peak_memory_gb": 9.0})
        for i in range(1, 5)
    ]
    assert strategy._prediction_error(warm) == pytest.approx(prior)


def test_a_pending_result_covers_the_front_only_where_its_draws_do() -> None:
    """A running trial predicted to dominate a candidate leaves it nothing to gain if it is
    believed at its mean; as a fantasy drawn from its spread it leaves the candidate the
    draws in which it falls short."""
    sign = np.array([1.0, -1.0])
    m = np.log([[100.0, 10.0]])  # the candidate: 100 tokens/s at 10 GB
    s = np.zeros((1, 2))
    z = np.zeros((1, 2))
    ref = np.array([50.0, -20.0])
    front = np.zeros((0, 2))
    pending_mean = np.log([110.0, 9.0])
    believed = (sign * np.exp(pending_mean))[None, None, :]  # (draws, pending, objectives)
    rng = np.random.default_rng(0)
    draws = pending_mean + np.array([0.3, 0.0]) * rng.standard_normal((256, 1, 2))
    fantasies = sign * np.exp(draws)
    rows = np.arange(1)
    alone = CubicStrategy._ehvi(m, s, z, sign, front, np.zeros((1, 0, 2)), ref, rows)[0]
    assert alone == pytest.approx((100 - 50) * (20 - 10))
    assert CubicStrategy._ehvi(m, s, z, sign, front, believed, ref, rows)[0] == 0.0
    z_many = np.zeros((256, 2))
    shared = CubicStrategy._ehvi(m, s, z_many, sign, front, fantasies, ref, rows)[0]
    assert 0.05 * alone < shared < 0.5 * alone


def test_the_reference_reaches_as_far_as_the_memory_limit() -> None:
    """Peak memory cannot pass the share of HBM the study allows: the fastest configs, which
    spend the most memory, are always worth reaching. A cost objective has no such bound."""
    study = _study()
    strategy = make_strategy(study)
    assert isinstance(strategy, CubicStrategy)
    hbm_gb = study.workload.gpu.hbm_bytes / 1e9
    worst = strategy._worst_acceptable()
    assert np.isnan(worst[0])
    assert worst[1] == pytest.approx(hbm_gb * (1 - study.spec.constraints.memory_headroom))
    spec, base = load_spec(BENCH_MO / "llama3_8b_h100x16_memory.study.yaml")
    objectives = [spec.objectives[0], spec.objectives[1].model_copy(update={"metric": "cost"})]
    cost = spec.model_copy(update={"objectives": objectives}).resolve(base)
    other = make_strategy(cost)
    assert isinstance(other, CubicStrategy)
    assert np.isnan(other._worst_acceptable()).all()

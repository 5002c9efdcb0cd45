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
    # Each proposal predicts every objective and says how it was chosen.
    assert all(t.predicted["acquisition"] == "ehvi" for t in guided)
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
    assert {t.predicted.get("acquisition") for t in history[8:]} <= {"ei", "ucb"}


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

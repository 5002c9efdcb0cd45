"""The pruning benchmark: the search benchmark's replay with a pruning rule stops slow trials
early, at the cost of only the steps they ran; a disabled rule changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from cubic.bench.pruning import bench_pruning, compare, gpu_hours
from cubic.bench.search import build_strategy, load_study, simulate_search
from cubic.store.objects import TrialState
from cubic.study import PruningSpec

RULE = PruningSpec(enabled=True)


def _key(trials: list) -> list:
    return [(t.params, t.state, t.metrics, t.finished_at, t.attempt) for t in trials]


def test_a_disabled_rule_replays_as_no_rule(llm_study: Path) -> None:
    study = load_study(llm_study)
    plain = simulate_search(study, build_strategy("tpe", study, 3)[0], seed=3, budget=24)
    off = RULE.model_copy(update={"enabled": False})
    again = simulate_search(study, build_strategy("tpe", study, 3)[0], seed=3, budget=24, rule=off)
    assert _key(again) == _key(plain)


def test_pruned_trials_cost_only_the_steps_they_ran(llm_study: Path) -> None:
    study = load_study(llm_study)
    off = simulate_search(study, build_strategy("random", study, 1)[0], seed=1, budget=40)
    on = simulate_search(study, build_strategy("random", study, 1)[0], seed=1, budget=40, rule=RULE)
    pruned = [t for t in on if t.state == TrialState.PRUNED]
    assert pruned, "a random search of this space runs slow configs"
    full = {json.dumps(t.params, sort_keys=True): t for t in off}
    for t in pruned:
        m = t.metrics
        assert m["pruned_bound"] < m["pruned_limit"] == pytest.approx(0.8 * m["pruned_best"])
        assert 5 <= m["timed_steps"] < 20 and t.error.startswith("pruned (threshold)")
        twin = full.get(json.dumps(t.params, sort_keys=True))
        if twin is not None and twin.state == TrialState.COMPLETE:
            assert m["gpu_hours"] < twin.metrics["gpu_hours"]
            assert m["tokens_per_s"] == pytest.approx(twin.metrics["tokens_per_s"], rel=0.1)
    assert gpu_hours(on) < gpu_hours(off)


def test_compare_reports_gpu_hours_and_best_with_and_without(llm_study: Path) -> None:
    study = load_study(llm_study)
    run = compare(study, "random", 1, budget=40, rule=RULE)
    assert run.pruned > 0 and run.trials == 40
    assert run.gpu_hours_on < run.gpu_hours_off
    assert run.saved == pytest.approx(1 - run.gpu_hours_on / run.gpu_hours_off)
    assert 0 < run.best_ratio_off <= 1 and 0 < run.best_ratio_on <= 1
    assert 0 < run.hours_to_best_off <= run.gpu_hours_off
    d = run.to_dict()
    assert d["saved"] == run.saved and d["same_best"] == run.same_best


def test_bench_pruning_prints_a_table_and_writes_json(llm_study: Path, tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    result = bench_pruning([llm_study], "random", "0-1", budget=16, console=console)
    console.print(result.table())
    text = console.export_text()
    assert "tiny-llm" in text and "GPU-hours" in text and "saved" in text
    (row,) = result.summary()
    assert row["runs"] == 2 and row["strategy"] == "random"
    doc = json.loads(json.dumps(result.to_dict()))
    assert len(doc["runs"]) == 2 and doc["settings"]["budget"] == 16

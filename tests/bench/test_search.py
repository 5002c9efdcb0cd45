"""The search benchmark: true optimum, deterministic runs, scores, retries, JSON and plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from rich.console import Console

from cubic.bench.search import (
    accepts_prior,
    bench_search,
    build_strategy,
    default_studies,
    history_from_other_studies,
    landscape,
    load_study,
    parse_seeds,
    run_benchmark,
    run_one,
    simulate_search,
)
from cubic.objectives import violations
from cubic.sim import simulate
from cubic.sim.job import NoiseModel
from cubic.store.objects import Trial, TrialState
from cubic.strategies import REGISTRY
from cubic.strategies.samplers import RandomStrategy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fixture", ["llm_study", "dlrm_study"])
def test_optimum_is_the_brute_force_maximum(fixture: str, request: pytest.FixtureRequest) -> None:
    study = load_study(request.getfixturevalue(fixture))
    best, infeasible = None, 0
    configs = study.space.enumerate(study.context)
    for cfg in configs:
        row = simulate(study.workload, [cfg]).row(0)
        metrics = {"peak_memory_gb": row["peak_memory_gb"], "error_score": row["error_score"]}
        if not row["feasible"] or violations(study.spec, study.workload, metrics, cfg):
            infeasible += 1
            continue
        if best is None or row["throughput"] > best[0]:
            best = (row["throughput"], cfg)
    info = landscape(study)
    assert best is not None and info.size == len(configs)
    assert info.optimum == pytest.approx(best[0], rel=1e-9)
    assert info.optimum_config == best[1]
    assert info.infeasible_share == pytest.approx(infeasible / len(configs))


def test_a_run_is_deterministic_for_a_seed(llm_study: Path) -> None:
    study = load_study(llm_study)

    def trials(seed: int) -> list[Trial]:
        strategy, _ = build_strategy("tpe", study, seed)
        return simulate_search(study, strategy, seed=seed, workers=3, budget=12)

    a, b = trials(1), trials(1)
    assert [(t.params, t.state, t.metrics, t.finished_at) for t in a] == [
        (t.params, t.state, t.metrics, t.finished_at) for t in b
    ]
    assert (
        run_one(study, "tpe", 1, workers=3, budget=12).curve
        == run_one(study, "tpe", 1, workers=3, budget=12).curve
    )
    assert [t.params for t in trials(2)] != [t.params for t in a]


@pytest.mark.parametrize("strategy", ["random", "tpe"])
def test_scores_never_exceed_one_and_grow_with_trials(llm_study: Path, strategy: str) -> None:
    study = load_study(llm_study)
    for seed in range(3):
        run = run_one(study, strategy, seed, workers=4, budget=16)
        tried = np.asarray(run.best_tried)
        curve = np.asarray(run.curve)
        assert len(curve) == 16 and (curve <= tried + 1e-12).all() and (tried <= 1.0).all()
        assert (np.diff(tried) >= 0).all()
        # Without noise the measured incumbent is the true one, so its score never drops.
        quiet = run_one(study, strategy, seed, workers=4, budget=16, noise=NoiseModel.off())
        assert (np.diff(quiet.curve) >= 0).all() and max(quiet.curve) <= 1.0
        assert quiet.curve == quiet.best_tried


def test_failed_trials_are_retried_without_consuming_budget(llm_study: Path) -> None:
    study = load_study(llm_study)
    strategy, _ = build_strategy("random", study, 0)
    flaky = NoiseModel(failure_prob=0.4)
    trials = simulate_search(study, strategy, seed=0, workers=3, budget=10, noise=flaky)
    retries = [t for t in trials if t.attempt > 1]
    assert retries, "a 40 % failure rate must cause retries"
    assert sum(t.attempt == 1 for t in trials) == 10
    by_id = {t.id: t for t in trials}
    for t in retries:
        first = by_id[t.retry_of]
        assert first.state == TrialState.FAILED and t.source == "retry"
        assert t.params == first.params and t.attempt == first.attempt + 1
    assert all(t.attempt <= study.spec.max_attempts for t in trials)
    assert all(t.is_finished for t in trials)
    run = run_one(study, "random", 0, workers=3, budget=10, noise=flaky)
    assert run.n_trials == 10 and run.n_attempts > 10 and run.n_failed > 0


def test_json_has_the_documented_keys_and_the_plot_is_a_png(
    llm_study: Path, dlrm_study: Path, tmp_path: Path
) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    console = Console(record=True, width=200)
    result = bench_search(
        [llm_study, dlrm_study],
        "random,no-such-strategy",
        "0-1",
        workers=2,
        budget=8,
        json_out=out,
        plot_out=png,
        console=console,
    )
    text = console.export_text()
    assert "no-such-strategy" in text and "tiny-llm" in text
    data = json.loads(out.read_text())
    assert set(data) == {"version", "settings", "studies", "runs", "summary", "skipped"}
    assert data["skipped"] == ["no-such-strategy"]
    assert set(data["studies"]["tiny-dlrm"]) == {
        "name",
        "file",
        "kind",
        "workload",
        "cluster",
        "metric",
        "direction",
        "size",
        "infeasible_share",
        "optimum",
        "optimum_config",
        "baseline_ratio",
        "objectives",
        "directions",
        "front",
        "reference",
    }
    assert data["studies"]["tiny-dlrm"]["front"] == []  # one objective: no front
    assert len(data["runs"]) == 4
    assert set(data["runs"][0]) == {
        "study",
        "strategy",
        "seed",
        "curve",
        "best_tried",
        "trials_to",
        "n_trials",
        "n_attempts",
        "n_failed",
        "n_infeasible",
        "infeasible_share",
        "best_config",
        "best_measured",
        "best_ratio",
        "proxy_tau",
        "prior_trials",
        "wall_s",
        "makespan_s",
    }
    row = data["summary"][0]
    assert set(row) == {
        "study",
        "strategy",
        "runs",
        "best_at",
        "trials_to",
        "infeasible_share",
        "proxy_tau",
        "wall_s",
    }
    assert set(row["best_at"]) == {"8"} and set(row["best_at"]["8"]) == {"median", "q25", "q75"}
    assert set(row["trials_to"]) == {"0.95", "0.99"}
    assert set(row["trials_to"]["0.95"]) == {"median", "reached"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.summary() == data["summary"]


class _PriorStrategy(RandomStrategy):
    """A strategy that learns from other studies: it only records what it was given."""

    name = "prior-test"
    given: list[int] = []  # noqa: RUF012 - a test probe

    def __init__(
        self,
        study: Any,
        *,
        seed: int | None = None,
        prior: Sequence[tuple[Any, Trial]] = (),
        **options: Any,
    ) -> None:
        super().__init__(study, seed=seed, **options)
        _PriorStrategy.given.append(len(prior))


def test_history_of_other_studies_reaches_strategies_that_accept_it(
    llm_study: Path, dlrm_study: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prior = history_from_other_studies([llm_study, dlrm_study], "tiny-llm", n_per_study=6)
    assert len(prior) == 6
    assert all(wl.kind == "dlrm" and t.is_finished and t.study_id == 2 for wl, t in prior)
    assert not history_from_other_studies([llm_study], llm_study)
    monkeypatch.setitem(REGISTRY, "prior-test", _PriorStrategy)
    monkeypatch.setattr(_PriorStrategy, "given", [])
    assert accepts_prior(_PriorStrategy) and not accepts_prior(RandomStrategy)
    result = run_benchmark(
        [llm_study], ["prior-test", "random"], [0], workers=2, budget=4, history={"tiny-llm": prior}
    )
    assert _PriorStrategy.given == [6]
    assert [r.prior_trials for r in result.runs] == [6, 0]


def test_seeds_parse_ranges_and_lists() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,2,7-8") == [0, 2, 7, 8]
    assert parse_seeds(None) == [0, 1, 2, 3, 4]


def test_shipped_benchmark_studies_use_the_full_spaces_and_the_largest_models() -> None:
    from cubic.space import Space

    shipped = {
        name: Space.from_yaml(ROOT / "search_spaces" / f"{name}.yaml").to_dict()
        for name in ("llm_pretrain", "dlrm_sharding")
    }
    files = default_studies()
    hard_gpus, big_dlrm, kinds = set(), 0, []
    for f in files:
        study = load_study(f)
        info = landscape(study, f)
        wl = study.workload
        kinds.append(info.kind)
        assert study.space.to_dict() in shipped.values(), f"{f}: not a full shipped space"
        assert 1_000 <= info.size <= 1_000_000, f
        assert 0.10 <= info.infeasible_share < 1.0, f
        assert info.baseline_ratio is not None and info.baseline_ratio < 0.95, f
        assert study.spec.constraints.memory_headroom == 0.05
        assert study.spec.budget.max_trials == 64 and study.spec.budget.max_parallel == 8
        if (
            info.kind == "llm"
            and wl.model.params() >= 100e9
            and wl.cluster.num_gpus >= 128
            and info.infeasible_share >= 0.90
        ):
            hard_gpus.add(wl.cluster.gpu.split("_")[0])
        big_dlrm += info.kind == "dlrm" and wl.cluster.num_gpus >= 64
    assert len(hard_gpus) >= 3, hard_gpus  # 100B+ LLMs on 128+ GPUs of three kinds
    assert big_dlrm >= 1
    assert kinds.count("llm") >= 5 and kinds.count("dlrm") >= 3


def test_a_two_objective_run_is_scored_by_the_hypervolume_of_its_front(
    llm_study: Path,
) -> None:
    """Every config of a tiny two-objective study tried without noise: the found front is
    the true front, so the score ends at 1; it never falls, and never exceeds 1."""
    spec = yaml.safe_load(llm_study.read_text())
    del spec["objective"]
    spec["objectives"] = [
        {"metric": "tokens_per_s", "direction": "maximize"},
        {"metric": "peak_memory_gb", "direction": "minimize"},
    ]
    llm_study.write_text(yaml.safe_dump(spec, sort_keys=False))
    study = load_study(llm_study)
    info = landscape(study)
    assert info.multi and len(info.front) >= 2 and info.optimum > 0
    run = run_one(study, "random", 0, workers=4, budget=200, noise=NoiseModel.off(), info=info)
    assert run.n_trials == info.size  # every valid config, once
    assert np.all(np.diff(run.curve) >= -1e-12) and max(run.curve) <= 1 + 1e-9
    assert run.curve[-1] == pytest.approx(1.0)


def test_a_benchmark_keeps_every_finished_run_when_it_breaks(
    llm_study: Path, tmp_path: Path
) -> None:
    """``checkpoint``: the runs measured so far are on disk after each run, so that a
    benchmark of hours that breaks (or is stopped) keeps what it measured."""
    out = tmp_path / "bench.json"

    def broken(run: Any, done: int, total: int) -> None:
        if done == 2:
            raise RuntimeError("the machine went away")

    with pytest.raises(RuntimeError, match="went away"):
        run_benchmark(
            [llm_study], ["random"], [0, 1, 2], workers=2, budget=4, progress=broken,
            checkpoint=out,
        )  # fmt: skip
    saved = json.loads(out.read_text())
    assert [r["seed"] for r in saved["runs"]] == [0, 1]
    assert not (tmp_path / "bench.json.part").exists()

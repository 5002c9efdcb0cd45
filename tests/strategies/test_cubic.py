"""The proxy-guided ``cubic`` strategy: phases, candidates, predictions, transfer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cubic.sim.job import NoiseModel, run_job
from cubic.store.objects import Trial, TrialState
from cubic.strategies import config_key, make_strategy
from cubic.strategies.cubic import CubicStrategy
from cubic.study import ResolvedStudy, load_spec

BENCH = Path(__file__).resolve().parents[2] / "search_spaces" / "bench"


def _study(name: str, strategy: str = "cubic") -> ResolvedStudy:
    spec, base = load_spec(BENCH / f"{name}.study.yaml")
    spec = spec.model_copy(
        update={"strategy": spec.strategy.model_copy(update={"name": strategy, "seed": 0})}
    )
    return spec.resolve(base)


def _run(
    study: ResolvedStudy, strategy: CubicStrategy, n_trials: int, batch: int = 8
) -> list[Trial]:
    history: list[Trial] = []
    while len(history) < n_trials:
        for p in strategy.suggest(history, batch):
            out = run_job(study.workload, p.params, noise=NoiseModel.off())
            history.append(
                Trial.detached(
                    len(history) + 1,
                    p.params,
                    TrialState(out.state),
                    out.metrics or None,
                    predicted=p.predicted,
                    error=out.error,
                )
            )
    return history


def test_warm_up_then_model_guided_without_repeats() -> None:
    study = _study("dlrm_dot_a100x8")
    strategy = make_strategy(study)
    assert isinstance(strategy, CubicStrategy)
    history = _run(study, strategy, 24)
    phases = [t.predicted["phase"] for t in history]
    assert phases[:8] == ["warm-up"] * 8 and set(phases[8:]) == {"model"}
    assert len({config_key(t.params) for t in history}) == len(history)
    assert all(not study.space.validate(t.params, study.context) for t in history)
    # Proposals carry what the proxy predicted, to compare with what was measured.
    model = [t for t in history[8:] if t.state == TrialState.COMPLETE]
    assert all(t.predicted["value"] > 0 and 0 <= t.predicted["p_feasible"] <= 1 for t in model)
    pred = np.array([t.predicted["value"] for t in model])
    meas = np.array([t.metrics["samples_per_s"] for t in model])
    assert np.median(np.abs(pred / meas - 1)) < 0.5


def test_mutations_are_valid_choices_of_every_knob() -> None:
    # Mutating a string knob must never truncate it ('table_wise' -> 'column_wis'), and a
    # conditional knob switched on must get a real value, not its inactive default.
    study = _study("dlrm_dot_a100x8")
    strategy = make_strategy(study)
    history = _run(study, strategy, 16)
    mutants = strategy._mutants(history, 2000, np.random.default_rng(0))
    configs = study.space.from_arrays(mutants)
    assert len(configs) > 500
    assert all(not study.space.validate(c, study.context) for c in configs)


def test_memory_estimate_keeps_the_search_out_of_oom_regions() -> None:
    study = _study("llama3_70b_h100x64")  # about half of this space runs out of memory
    history = _run(study, make_strategy(study), 32)
    infeasible = sum(t.state == TrialState.INFEASIBLE for t in history)
    assert infeasible <= 4


def test_prior_from_other_studies_skips_the_warm_up() -> None:
    target = _study("llama3_70b_h100x64")
    other = _study("llama3_8b_h100x16")
    rng = np.random.default_rng(1)
    prior = []
    for i, cfg in enumerate(other.space.sample(rng, 64, other.context)):
        out = run_job(other.workload, cfg, noise=NoiseModel.off())
        prior.append(
            (
                other.workload,
                Trial.detached(
                    1000 + i, cfg, TrialState(out.state), out.metrics or None, study_id=2
                ),
            )
        )
    # A DLRM trial in the prior is ignored: one proxy per workload kind.
    dlrm = _study("dlrm_dot_a100x8")
    prior.append((dlrm.workload, prior[0][1]))
    strategy = CubicStrategy(target, seed=0, prior=prior, transfer_tau=0.0)
    assert all(wl.kind == "llm" for wl, _ in strategy.prior)
    first = strategy.suggest([], 8)
    assert {p.predicted["phase"] for p in first} == {"model"}


@pytest.mark.parametrize("name", ["llama3_8b_h100x16", "dlrm_dot_a100x8"])
def test_beats_random_search_on_a_small_budget(name: str) -> None:
    study = _study(name)
    cubic = max(
        t.metrics.get("throughput", 0) for t in _run(study, make_strategy(study), 24) if t.metrics
    )
    rand = _study(name, "random")
    random = max(
        t.metrics.get("throughput", 0) for t in _run(rand, make_strategy(rand), 24) if t.metrics
    )
    assert cubic >= random

"""The proxy-guided ``cubic`` strategy: phases, candidates, predictions, transfer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cubic.proxy.features import featurize
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
    mutants = strategy._mutants(strategy._elites(history), 2000, np.random.default_rng(0))
    configs = study.space.from_arrays(mutants)
    assert len(configs) > 500
    assert all(not study.space.validate(c, study.context) for c in configs)


def test_every_one_step_neighbour_of_the_best_measured_joins_the_pool() -> None:
    # The optimum is often one knob step from a measured config; a random subsample of the
    # candidates would miss it.
    study = _study("llama3_70b_h100x64")
    strategy = make_strategy(study)
    history = _run(study, strategy, 16)
    space = study.space
    best = strategy._measured_best(history)  # the 64 best: here every measured config
    assert len(best) > 8
    finite = dict((p.name, grid) for p, grid in strategy._finite_knobs())
    near = space.from_arrays(strategy._neighbours(best))
    steps: set[tuple[int, str, Any]] = set()
    for cfg in near:
        assert not space.validate(cfg, study.context)
        # One knob active in some base moved one grid step; other changes are knobs the
        # step switched on or off, or derived values.
        for b, base in enumerate(best):
            moved = [k for k, grid in finite.items() if base[k] in grid and cfg[k] != base[k]]
            if len(moved) == 1:
                k = moved[0]
                grid = finite[k]
                if cfg[k] in grid and abs(grid.index(cfg[k]) - grid.index(base[k])) == 1:
                    steps.add((b, k, cfg[k]))
    # Complete: every single step that is valid as it stands is among them.
    for b, base in enumerate(best):
        for k, grid in finite.items():
            if base[k] not in grid:
                continue
            i = grid.index(base[k])
            for j in (i - 1, i + 1):
                if 0 <= j < len(grid):
                    cfg = {**base, k: grid[j]}
                    if not space.validate(cfg, study.context):
                        assert (b, k, grid[j]) in steps
    assert len(steps) >= 4 * len(best)
    # ... and every one the study has not run that the memory estimate lets run is a
    # candidate of the next round.
    seen = {config_key(t.params) for t in history}
    new = [c for c in near if config_key(c) not in seen]
    runs = strategy._runnable(history, featurize(study.workload, space.to_arrays(new)))
    assert runs.sum() > 0
    pool, *_ = strategy._pool(history, seen, np.random.default_rng(0))
    keys = {config_key(c) for c in pool}
    assert all(config_key(c) in keys for c, ok in zip(new, runs, strict=True) if ok)


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


def _measured(study: ResolvedStudy, params: dict, number: int) -> Trial:
    out = run_job(study.workload, params, noise=NoiseModel.off())
    return Trial.detached(number, params, TrialState(out.state), out.metrics or None)


def _random_prior(other: ResolvedStudy, n: int = 64) -> list[tuple[Any, Trial]]:
    """``n`` random configs of another study, measured: a history to transfer from."""
    rng = np.random.default_rng(1)
    return [
        (other.workload, _measured(other, cfg, 1000 + i))
        for i, cfg in enumerate(other.space.sample(rng, n, other.context))
    ]


def test_error_bound_is_learned_per_site_and_extrapolated_in_the_lossy_bound() -> None:
    from cubic.proxy.features import numerics

    study = _study("dlrm_dcnv2_h100x64")
    # At most four sites at once in the full space (three FP8 dense sites and a reduced-
    # precision exchange); a prior of four times the bound shared by four makes each
    # untested site alone worth the whole bound.
    strategy = CubicStrategy(study, seed=0, error_prior=4.0)
    assert strategy._max_sites() == 4
    base = study.space.complete(
        {k: v for k, v in study.spec.baseline.items() if k in study.space.names}, study.context
    )

    def cfg(**kw: object) -> dict:
        return study.space.complete({**base, **kw}, study.context)

    lossy_small = cfg(a2a_precision="lossy", lossy_error_bound=0.001)
    lossy_big = cfg(a2a_precision="lossy", lossy_error_bound=0.05)
    fp8_mlp = cfg(fp8_bottom_mlp=True)
    both = cfg(a2a_precision="lossy", lossy_error_bound=0.001, fp8_bottom_mlp=True)
    candidates = [base, lossy_small, lossy_big, fp8_mlp, both]
    N = numerics(study.workload, candidates)
    # Nothing measured: a site may be tried alone, never on top of another untested one.
    assert strategy._within_bounds([], N).tolist() == [True, True, True, True, False]
    # One small-bound lossy trial measured: its cost per unit of bound says the large bound
    # breaks the study's limit, though no trial at that bound ran.
    history = [_measured(study, lossy_small, 1), _measured(study, base, 2)]
    assert history[0].metrics["error_score"] < 1.0
    ok = strategy._within_bounds(history, N)
    assert ok[1] and not ok[2] and ok[3]
    assert not ok[4]  # the FP8 bottom MLP is still untested: not on top of a measured site
    history.append(_measured(study, fp8_mlp, 3))
    assert strategy._within_bounds(history, N)[4]


def test_warm_up_tries_each_untested_precision_site_once_at_a_time() -> None:
    from cubic.proxy.features import numerics

    study = _study("dlrm_dcnv2_h100x64")
    for seed in range(3):
        first = CubicStrategy(study, seed=seed).suggest([], 8)
        assert len(first) == 8
        sites = numerics(study.workload, [p.params for p in first]) > 0
        assert sites.sum(axis=0).max() <= 1
        assert all(not study.space.validate(p.params, study.context) for p in first)


def test_the_error_prior_shares_the_bound_among_the_sites_a_config_can_switch_on() -> None:
    from cubic.proxy.features import FP8_SITES, numerics

    study = _study("llama3_70b_h100x64")
    strategy = CubicStrategy(study, seed=0)
    assert strategy._max_sites() == len(FP8_SITES)
    every = study.space.sample(np.random.default_rng(0), 256, study.context)
    N = numerics(study.workload, every)
    # Untested, all five FP8 sites together are just within the bound by the prior...
    predicted, seen, _ = strategy._error_model([], N)
    assert strategy._respects_bound(predicted).all() and not seen.any()
    # ...but a config switches on at most one site no trial has measured.
    sites = (N > 0).sum(axis=1)
    assert np.array_equal(strategy._within_bounds([], N), sites <= 1)
    assert (sites > 1).any() and (sites <= 1).any()


def _layout_405b(sites: str, **knobs: object) -> dict:
    """A Llama-3 405B config on 128 H200s (a fast layout by default) with the FP8 sites
    switched on where ``sites`` (in :data:`FP8_SITES` order) says 1."""
    from cubic.proxy.features import FP8_SITES

    study = _study("llama3_405b_h200x128")
    params: dict[str, object] = {
        "tp": 8, "pp": 16, "cp": 1, "vp": 1, "micro_batch": 1, "zero_stage": 1,
        "recompute": "none", "sequence_parallel": True, "tp_comm_overlap": True,
        "overlap_grad_reduce": True, "overlap_param_gather": False, **knobs,
    }  # fmt: skip
    params.update({site: on == "1" for site, on in zip(FP8_SITES, sites, strict=True)})
    return study.space.complete(params, study.context)


def test_an_untested_site_is_a_priced_risk_in_model_guided_rounds() -> None:
    """Four FP8 sites measured on Llama-3 405B (their scores add up to 0.85 of the bound),
    the fifth only in a slow warm-up job still running. The warm-up's rule would keep every
    other config with that site out until the slow job ends; a model-guided round weighs it
    by the chance that the site costs what is left of the bound (an exponential draw with
    the prior's mean, a fifth of the bound): the fast layout with all five sites is a risk
    worth one trial, two untested sites in one config are not taken."""
    from cubic.proxy.features import numerics

    study = _study("llama3_405b_h200x128")
    sets = ["00000", "10000", "01000", "00100", "00001", "11100", "11101", "10101", "01101"]
    history = [_measured(study, _layout_405b(s), i) for i, s in enumerate(sets, start=1)]
    history.append(_measured(study, _layout_405b("11101", pp=8, cp=2), 10))
    slow = _layout_405b("00010", pp=1, cp=4, zero_stage=3)
    history.append(Trial.detached(11, slow, TrialState.RUNNING))
    strategy = CubicStrategy(study, seed=0)
    N = numerics(study.workload, [_layout_405b(s) for s in ("11101", "11111", "00010")])
    p, fresh = strategy._bound_odds(history, N)
    known = history[6].metrics["error_score"]  # 11101
    assert p[0] == 1.0 and not fresh[0].any()
    assert p[1] == pytest.approx(1.0 - np.exp(-(1.0 - known) / 0.2), rel=1e-3)
    assert 0.3 < p[1] < 0.9 and fresh[1].sum() == 1
    assert p[2] > 0.99  # the untested site alone: its prior cost is a fifth of the bound
    assert not strategy._within_bounds(history, N)[1:].any()  # the warm-up's rule: wait
    # Before any site is measured, two of them in one config are never taken.
    pair = numerics(study.workload, [_layout_405b("10010")])
    assert strategy._bound_odds(history[:1], pair)[0][0] == 0.0

    picks = strategy.suggest(history, 8)
    sites = numerics(study.workload, [q.params for q in picks]) > 0
    with_new = sites[:, 3]  # fp8_mlp_out, the untested site
    assert with_new.sum() == 1  # one trial at a time within the batch
    pick = picks[int(np.flatnonzero(with_new)[0])]
    assert sites[with_new].sum() >= 2 and 0.0 < pick.predicted["p_bound"] < 1.0


def test_a_batch_ranked_only_by_other_workloads_is_spread_wider() -> None:
    target = _study("llama3_70b_h100x64")
    prior = _random_prior(_study("llama3_8b_h100x16"))

    def spread(borrowed_radius: float) -> float:
        strategy = CubicStrategy(
            target, seed=0, prior=prior, transfer_tau=0.0, borrowed_radius=borrowed_radius
        )
        first = strategy.suggest([], 8)
        assert {p.predicted["phase"] for p in first} == {"model"}
        pos = strategy.positions(target.space.to_arrays([p.params for p in first]))
        return float(np.abs(pos[:, None] - pos[None]).sum(-1).mean())

    assert spread(3.0) > spread(1.0)


def test_a_borrowed_batch_takes_memory_risks_every_other_pick() -> None:
    # Before any memory report the configs near the limit have an even chance to fit; on
    # the 405B studies the fastest layouts are there. Half the borrowed batch ranks by the
    # prediction alone, the other half weighs the chance to fit as every later round does.
    target = _study("llama3_405b_h100x512")
    prior = _random_prior(_study("llama3_405b_h200x128"))
    picks = {}
    for bold in (False, True):
        strategy = CubicStrategy(
            target,
            seed=0,
            prior=prior,
            transfer_tau=0.0,
            borrowed_turns=("ucb", "bold") if bold else ("ucb",),
        )
        picks[bold] = strategy.suggest([], 8)
    assert [p.predicted["acquisition"] for p in picks[True]] == ["ucb", "bold"] * 4
    assert {p.predicted["acquisition"] for p in picks[False]} == {"ucb"}
    risk = {b: min(p.predicted["p_fit"] for p in ps) for b, ps in picks.items()}
    assert risk[True] < 0.9 <= risk[False]
    # The cautious picks are those of the batch without bold turns.
    cautious = [config_key(p.params) for p in picks[True][::2]]
    assert cautious[0] == config_key(picks[False][0].params)


def test_a_borrowed_round_climbs_from_the_sample_to_what_the_proxy_ranks_first() -> None:
    """The plausible configs are a uniform sample of the space: before this study has
    measured anything, the one-knob-step neighbours of the best-predicted candidates join
    the pool while they raise the best prediction, and the batch may take them."""
    target = _study("llama3_70b_h100x64")
    prior = _random_prior(_study("llama3_8b_h100x16"))
    # A sample of 2,000 of the 70B study's runnable configs, which misses the few the proxy
    # ranks first (the default 10,000 may hold one of them, and then there is no climb).
    opts = {"prior": prior, "transfer_tau": 0.0, "pool_size": 2000}
    strategy = CubicStrategy(target, seed=0, **opts)
    model = strategy._fit([])
    assert model is not None
    pool, X, pos, N = strategy._pool([], set(), np.random.default_rng(0))
    mu, sd = model.predict_log(X)
    grown, X2, pos2, N2, mu2, sd2 = strategy._climb([], set(), model, pool, X, pos, N, mu, sd)
    added = grown[len(pool) :]
    assert added and len(X2) == len(pos2) == len(N2) == len(mu2) == len(sd2) == len(grown)
    assert mu2.max() > mu.max()
    keys = [config_key(c) for c in grown]
    assert len(set(keys)) == len(keys)  # nothing twice, nothing the sample held
    assert strategy._runnable([], X2[len(pool) :]).all()
    climbed = {config_key(c) for c in added}
    first = strategy.suggest([], 8)
    assert {config_key(p.params) for p in first} & climbed
    # Without steps the batch is drawn from the sample and its usual extras alone.
    plain = CubicStrategy(target, seed=0, climb_steps=0, **opts)
    assert not {config_key(p.params) for p in plain.suggest([], 8)} & climbed
    with pytest.raises(ValueError, match="climb_top"):
        CubicStrategy(target, seed=0, climb_top=0)


def test_a_borrowed_batch_learns_how_configs_of_one_workload_differ() -> None:
    """Before this study has measured anything the proxy only has to order its configs:
    each prior workload's mean is taken out (its level does not transfer), and once trials
    of its own are in, the proxy learns their throughput as it is."""
    target = _study("llama3_70b_h100x64")
    prior = _random_prior(_study("llama3_8b_h100x16")) + [
        (wl, replace(t, study_id=3)) for wl, t in _random_prior(_study("llama3_405b_h200x128"))
    ]
    strategy = CubicStrategy(target, seed=0, prior=prior, transfer_tau=0.0)
    assert strategy.prefit([])
    assert strategy._model is not None and strategy._model[1].center_groups
    first = strategy.suggest([], 8)
    assert {p.predicted["phase"] for p in first} == {"model"}
    own = [_measured(target, p.params, i + 1) for i, p in enumerate(first)]
    assert strategy.prefit(own)
    assert not strategy._model[1].center_groups
    ranked = CubicStrategy(target, seed=0, prior=prior, transfer_tau=0.0, borrowed_objective="rank")
    ranked.prefit([])
    assert ranked._model is not None and ranked._model[1].objective == "rank"
    with pytest.raises(ValueError, match="borrowed_objective"):
        CubicStrategy(target, seed=0, borrowed_objective="lambdamart")


def test_one_invalid_trial_rules_out_its_whole_region() -> None:
    """A config the framework rejects (not out of memory) teaches the strategy every config
    that shares what it had and no run had, not that one config alone."""
    study = _study("llama3_70b_h100x64")
    strategy = CubicStrategy(study, seed=0)
    rng = np.random.default_rng(0)
    ran = [
        c
        for c in study.space.sample(rng, 400, study.context)
        if not c["fp8_lm_head"] and not study.space.validate(c, study.context)
    ][:12]
    history = [_measured(study, c, i + 1) for i, c in enumerate(ran)]
    history = [t for t in history if t.state == TrialState.COMPLETE]
    bad = study.space.complete({**history[0].params, "fp8_lm_head": True}, study.context)
    rejected = Trial.detached(
        len(history) + 1,
        bad,
        TrialState.INFEASIBLE,
        error="invalid: FP8 LM head is not supported by this Transformer Engine build",
    )
    assert strategy._invalid_regions([*history, rejected]) == [{"fp8_lm_head": True}]
    base = strategy._candidates()[0]
    inside = strategy._in_invalid_region([*history, rejected], base.arrays)
    assert np.array_equal(inside, np.array([c["fp8_lm_head"] for c in base.configs]))
    props = strategy.suggest([*history, rejected], 8)
    assert len(props) == 8 and not any(p.params["fp8_lm_head"] for p in props)
    # An out-of-memory trial is the memory model's to learn from, not a region rule.
    oom = Trial.detached(99, bad, TrialState.INFEASIBLE, error="CUDA out of memory")
    assert strategy._invalid_regions([*history, oom]) == []


def test_expected_improvement_pays_for_a_chance_to_beat_the_best() -> None:
    from cubic.strategies.cubic import _expected_improvement

    best = 0.0
    mu = np.array([-0.05, -0.01, 0.02, -0.01])
    sd = np.array([0.01, 0.01, 0.01, 0.05])
    ei = _expected_improvement(mu, sd, best)
    assert np.all(ei >= 0) and ei[0] < ei[1] < ei[2]
    assert ei[3] > ei[1]  # as likely below the best, but with more room above it
    # A config 20 % likelier to fail that may beat the best by 2 % is worth more than a
    # sure one 1 % below it: an upper bound times the probability of running said otherwise.
    risky, sure = ei[2] * 0.8, ei[1] * 1.0
    assert risky > sure
    assert np.exp(mu[2] + 0.01) * 0.8 < np.exp(mu[1] + 0.01) * 1.0


def test_a_memory_risk_is_scouted_by_one_trial_at_a_time() -> None:
    """While a job near the memory limit runs, its close neighbours (same layout, another
    overlap flag) wait for its report; configs elsewhere and safe ones do not."""
    study = _study("llama3_405b_h200x128")
    strategy = CubicStrategy(study, seed=0)
    base = strategy._candidates()[0]
    rng = np.random.default_rng(0)
    history = [
        _measured(study, base.configs[i], n + 1)
        for n, i in enumerate(rng.choice(len(base), 24, replace=False))
    ]
    model = strategy._memory_model(history)
    p_fit = model.p_fit(base.X)
    risky = np.flatnonzero((p_fit > 0.2) & (p_fit < 0.9))
    safe = np.flatnonzero(p_fit > 0.999)
    assert len(risky) > 2 and len(safe)
    scout = base.configs[risky[0]]
    twin = dict(scout, overlap_grad_reduce=not scout["overlap_grad_reduce"])

    X = np.concatenate([featurize(study.workload, [twin]), base.X[[safe[0]]]])
    corr = model.correlation(base.X[risky], featurize(study.workload, [scout]))[:, 0]
    elsewhere = risky[corr < 0.1]
    assert len(elsewhere)
    X = np.concatenate([X, base.X[elsewhere[:1]]])
    running = Trial.detached(len(history) + 1, scout, TrialState.RUNNING)
    waits = strategy._deferred(
        [*history, running], X, model.p_fit(X), featurize(study.workload, [scout])
    )
    assert waits.tolist() == [True, False, False]


def test_the_portfolio_takes_turns_between_its_acquisitions() -> None:
    study = _study("llama3_8b_h100x16")
    strategy = CubicStrategy(study, seed=0)
    history = _run(study, strategy, 16)
    model = [t.predicted["acquisition"] for t in history if t.predicted["phase"] == "model"]
    # Half by expected improvement, a quarter each by the upper and the lower bound.
    assert len(model) >= 4 and model == [strategy.turns[i % 4] for i in range(len(model))]
    assert set(model) == {"ei", "ucb", "lcb"}
    # One objective: the proxy's GP has its linear part (see CubicStrategy.gp_linear).
    assert strategy.gp_linear is True
    assert strategy._model is not None and strategy._model[1].gp_.linear
    assert CubicStrategy(study, seed=0, gp_linear=False).gp_linear is False
    with pytest.raises(ValueError, match="acquisition"):
        CubicStrategy(study, seed=0, acquisition="pi")
    with pytest.raises(ValueError, match="turns"):
        CubicStrategy(study, seed=0, turns=["ei", "pi"])
    with pytest.raises(ValueError, match="borrowed_turns"):
        CubicStrategy(study, seed=0, borrowed_turns=["ei"])


def test_a_knob_value_no_trial_has_measured_is_an_uncertainty_of_its_own() -> None:
    """The trees and the GP copy a never-measured tp from the nearest measured one with the
    confidence they have there; the strategy counts such values and widens the spread."""
    study = _study("llama3_405b_h100x512")
    strategy = CubicStrategy(study, seed=0)
    base = strategy._candidates()[0]
    tp = np.asarray(base.arrays["tp"])
    eights = np.flatnonzero((tp == 8) & (base.estimate < 0.8))
    history = [_measured(study, base.configs[i], n + 1) for n, i in enumerate(eights[:24])]
    assert {t.params["tp"] for t in history} == {8}
    assert sum(t.state == TrialState.COMPLETE for t in history) >= 8
    pos = strategy.positions(base.arrays)
    complete = [t for t in history if t.state == TrialState.COMPLETE]
    novelty = strategy._novelty(complete, pos)
    assert novelty.shape == (len(base),)
    # A measured config is novel in nothing; every config of another tp is novel in tp.
    assert np.all(novelty[[base.keys.index(config_key(t.params)) for t in complete]] == 0)
    assert np.all(novelty[tp != 8] >= 1)
    # Without a measured trial nothing is known to be novel (the warm-up spreads instead).
    assert not CubicStrategy(study, seed=0)._novelty([], pos).any()
    # A round records the widened spread it ranked by.
    wide = CubicStrategy(study, seed=0, novelty_sd=0.2)
    narrow = CubicStrategy(study, seed=0, novelty_sd=0.0)
    for s in (wide, narrow):
        s._base = strategy._base
    sd_wide = [p.predicted["log_std"] for p in wide.suggest(history, 8)]
    sd_narrow = [p.predicted["log_std"] for p in narrow.suggest(history, 8)]
    assert max(sd_wide) > 0.2 > max(sd_narrow)


def test_a_pruned_trial_teaches_the_proxy_its_measured_throughput() -> None:
    """A trial stopped early for being slow counts as the slow measurement it made: in the
    training set with its partial throughput, and among the trials the warm-up counts."""
    study = _study("dlrm_dot_a100x8")
    strategy = make_strategy(study)
    history = _run(study, strategy, 8)
    done = [t for t in history if t.state == TrialState.COMPLETE]
    slow = done[0]
    as_pruned = Trial.detached(
        slow.id, slow.params, TrialState.PRUNED, {**slow.metrics}, error="pruned (threshold)"
    )
    pruned_history = [as_pruned if t.id == slow.id else t for t in history]
    X, y, feasible, _ = strategy._training_set(pruned_history)
    Xc, yc, fc, _ = strategy._training_set(history)
    np.testing.assert_array_equal(X, Xc)
    np.testing.assert_array_equal(feasible, fc)
    np.testing.assert_array_equal(y, yc)  # the same value, learned the same way
    assert strategy._value(as_pruned) == strategy._value(slow)
    without = [t for t in history if t.id != slow.id]
    assert len(strategy._training_set(without)[1]) == len(yc) - 1


def test_switches_that_have_not_mattered_are_not_worth_the_floor() -> None:
    """Llama-3 405B on 512 H100, 24 trials in: the incumbent's layout has been measured with
    several sets of switches. With the full expected-improvement floor everywhere, a switch
    variant of that layout takes one of the next batch's expected-improvement turns; with
    the floor taken only as far as the GP's metric says a config is unlike the measured
    ones, none, and fewer picks of the batch go to that layout."""
    from cubic.bench.search import load_study, simulate_search

    study = load_study(BENCH / "llama3_405b_h100x512.study.yaml")
    layout = ("tp", "pp", "cp", "vp", "micro_batch", "recompute", "zero_stage")
    history = simulate_search(
        study, CubicStrategy(study, seed=0, familiar_floor=False), seed=0, budget=24
    )
    complete = [t for t in history if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: t.metrics["tokens_per_s"])
    incumbent = tuple(best.params[k] for k in layout)
    assert sum(tuple(t.params[k] for k in layout) == incumbent for t in history) >= 2
    inside = {}
    for familiar in (False, True):
        picks = CubicStrategy(study, seed=0, familiar_floor=familiar).suggest(history, 8)
        inside[familiar] = [
            p.predicted["acquisition"]
            for p in picks
            if tuple(p.params[k] for k in layout) == incumbent
        ]
    assert "ei" in inside[False]
    assert "ei" not in inside[True]
    assert len(inside[True]) < len(inside[False])

"""Optuna-backed strategies see the whole history, conditional knobs included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from cubic.store.objects import Trial, TrialState
from cubic.strategies import config_key, make_strategy
from cubic.study import load_spec

ROOT = Path(__file__).resolve().parents[2]


def _trial(i: int, params: dict, state: TrialState, metrics: dict | None) -> Trial:
    return Trial.detached(i + 1, params, state, metrics)


def test_inactive_conditional_knobs_do_not_hide_trials_from_the_sampler() -> None:
    spec, base = load_spec(ROOT / "search_spaces" / "dlrm_criteo_dcnv2.study.yaml")
    resolved = spec.resolve(base)
    strategy = make_strategy(resolved)
    configs = resolved.space.sample(np.random.default_rng(0), 40, resolved.context)
    # Most configs leave cache_load_factor/lossy_error_bound inactive at a default that is
    # not one of their choices; every one of them must still reach the sampler.
    assert any(c["cache_load_factor"] == 1.0 for c in configs)
    history = [
        _trial(i, c, TrialState.COMPLETE, {"samples_per_s": 1000.0 + i})
        for i, c in enumerate(configs)
    ]
    frozen = strategy._frozen(history, resolved.space.optuna_distributions())
    assert len(frozen) == len(history)


def test_knobs_the_hardware_rules_out_are_not_asked_of_the_sampler() -> None:
    """On an H100 the block-scaled format knobs hold their defaults: the sampler models and
    draws only the knobs that can move there, and its proposals keep the defaults."""
    resolved = _bench("llama3_8b_h100x16", "tpe")
    strategy = make_strategy(resolved)
    fixed = resolved.space.fixed(resolved.context)
    assert "mlp_in_format" in fixed and "fp8_mlp_in" not in fixed
    assert set(strategy._distributions()) == set(resolved.space.names) - set(fixed)
    for p in strategy.suggest([], 4):
        assert all(p.params[k] == v for k, v in fixed.items())


def _bench(name: str, strategy: str, folder: str = "bench"):
    spec, base = load_spec(ROOT / "search_spaces" / folder / f"{name}.study.yaml")
    spec = spec.model_copy(
        update={"strategy": spec.strategy.model_copy(update={"name": strategy, "seed": 0})}
    )
    return spec.resolve(base)


@pytest.mark.parametrize(("name", "asks"), [("tpe", 8), ("qmc", 8), ("gp", 2)])
def test_a_round_asks_the_sampler_once_per_proposal_at_most(name: str, asks: int) -> None:
    """On a space where most draws break a rule (tp*pp*cp must divide 128, pp*vp the 126
    layers...), a draw that breaks one is repaired to the nearest valid config: the sampler
    is asked at most once per proposal, and every proposal is valid and new."""
    if name == "gp":
        pytest.importorskip("torch", reason="strategy 'gp' needs PyTorch")
    study = _bench("llama3_405b_h200x128", name)
    strategy = make_strategy(study)
    rng = np.random.default_rng(1)
    history = [
        _trial(i, c, TrialState.COMPLETE, {"tokens_per_s": float(rng.uniform(1e4, 5e4))})
        for i, c in enumerate(study.space.sample(rng, 16, study.context))
    ]
    calls = []
    make = strategy.sampler

    def counting(seed: int):
        sampler = make(seed)
        inner = sampler.sample_relative

        def sample_relative(*args, **kwargs):
            calls.append(1)
            return inner(*args, **kwargs)

        sampler.sample_relative = sample_relative
        return sampler

    strategy.sampler = counting
    props = strategy.suggest(history, 8)
    assert len(props) == 8
    assert len(calls) <= asks
    keys = {config_key(p.params) for p in props} | {config_key(t.params) for t in history}
    assert len(keys) == 8 + len(history)
    assert all(not study.space.validate(p.params, study.context) for p in props)


@pytest.mark.parametrize("seed", [2**32, 10**12])
def test_a_seed_beyond_32_bits_still_proposes(seed: int) -> None:
    """The sampler's seed is derived from the study's; numpy takes only 32 bits."""
    resolved = _bench("dlrm_dot_a100x8", "tpe")
    proposals = make_strategy(resolved).__class__(resolved, seed=seed).suggest([], 2)
    assert len(proposals) == 2


def _measured(resolved, n: int, seed: int = 0) -> list[Trial]:
    """``n`` finished trials of the study's space: complete ones, and every fifth infeasible."""
    configs = resolved.space.sample(np.random.default_rng(seed), n, resolved.context)
    return [
        _trial(i, c, TrialState.INFEASIBLE, None)
        if i % 5 == 4
        else _trial(i, c, TrialState.COMPLETE, {"tokens_per_s": 1000.0 + i})
        for i, c in enumerate(configs)
    ]


def test_a_finished_trial_enters_the_sampler_as_the_same_frozen_trial_every_round() -> None:
    """A finished trial never changes, so its Optuna trial is made once: a later round adds
    the same object (the storage's copy shares its params, with a number of its own), and an
    infeasible trial is made again only when the penalty it stands in with moves."""
    resolved = _bench("llama3_8b_h100x16", "tpe")
    strategy = make_strategy(resolved)
    dists = strategy._distributions()
    history = _measured(resolved, 20)
    first = strategy._frozen(history, dists)
    again = strategy._frozen(history, dists)
    assert len(first) == 20 and all(a is b for a, b in zip(first, again, strict=True))
    ostudy = optuna.create_study(direction="maximize")
    ostudy.add_trials(again)
    stored = ostudy.get_trials(deepcopy=False)
    assert [t.number for t in stored] == list(range(20))
    assert all(s is not f and s.params is f.params for s, f in zip(stored, first, strict=True))
    assert [t.values for t in stored] == [t.values for t in first]
    # A new worst value moves the penalty: the infeasible trials stand in with it.
    worse = [*history, _trial(20, history[0].params, TrialState.COMPLETE, {"tokens_per_s": 5.0})]
    third = strategy._frozen(worse, dists)
    infeasible = [i for i, t in enumerate(history) if t.state == TrialState.INFEASIBLE]
    assert all(third[i].values == [5.0] and third[i] is not first[i] for i in infeasible)
    assert all(third[i] is first[i] for i in range(20) if i not in infeasible)


def test_random_proposes_the_same_without_reading_the_history() -> None:
    """``RandomSampler`` learns nothing from trials, so its round does not build them."""
    resolved = _bench("llama3_8b_h100x16", "random")
    history = _measured(resolved, 40)
    plain = make_strategy(resolved)
    reading = make_strategy(resolved)
    reading.reads_history = True
    assert [p.params for p in plain.suggest(history, 6)] == [
        p.params for p in reading.suggest(history, 6)
    ]
    assert plain._made == {} and len(reading._made) == 40


def test_a_finished_trial_is_scored_once() -> None:
    resolved = _bench("llama3_8b_h100x16", "tpe")
    strategy = make_strategy(resolved)
    (t,) = _measured(resolved, 1)
    first = strategy.scored(t)
    reread = Trial.detached(t.id, dict(t.params), t.state, dict(t.metrics or {}))
    assert strategy.scored(reread) is first  # the same trial read again: not re-scored
    changed = Trial.detached(t.id, dict(t.params), t.state, {"tokens_per_s": 7.0})
    assert strategy.scored(changed) == ([7.0], 0.0)


def _with_pending(resolved, n: int, pending: int) -> list[Trial]:
    """``n`` finished trials with ``pending`` running ones spread among them, as a study
    with many workers has."""
    history = _measured(resolved, n + pending, seed=1)
    for i in range(2, len(history), max(1, (n + pending) // pending))[:pending]:
        history[i] = _trial(i, history[i].params, TrialState.RUNNING, None)
    return history


@pytest.mark.parametrize("study", ["llama3_8b_h100x16", "dlrm_dcnv2_h100x64"])
def test_tpe_told_its_rounds_space_proposes_what_optuna_inferring_it_would(
    study: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round's multivariate search space is computed once from the finished trials' knob
    names (conditional knobs inactive in some trials drop out, running trials count for
    nothing) and equals Optuna's own intersection, so the batch is the same."""
    from cubic.strategies import samplers

    resolved = _bench(study, "tpe")
    history = _with_pending(resolved, 40, 8)
    strategy = make_strategy(resolved)
    dists = strategy._distributions()
    frozen = strategy._frozen(history, dists)
    ostudy = optuna.create_study(direction="maximize")
    ostudy.add_trials(frozen)
    inferred = optuna.samplers.TPESampler(multivariate=True).infer_relative_search_space(
        ostudy, ostudy.trials[0]
    )
    told = samplers._common_space(frozen, dists)
    assert list(told) == list(inferred) and told == inferred
    if study.startswith("dlrm"):
        assert set(told) < {k for k, d in dists.items() if not d.single()}  # knobs dropped
    fast = [p.params for p in make_strategy(resolved).suggest(history, 6)]
    monkeypatch.setattr(samplers, "_common_space", lambda frozen, dists: None)
    inferring = make_strategy(resolved)
    assert [p.params for p in inferring.suggest(history, 6)] == fast


def test_a_pending_trial_is_made_once_while_it_runs_and_again_when_it_ends() -> None:
    resolved = _bench("llama3_8b_h100x16", "tpe")
    strategy = make_strategy(resolved)
    dists = strategy._distributions()
    history = _with_pending(resolved, 20, 4)
    running = [i for i, t in enumerate(history) if t.state == TrialState.RUNNING]
    first = strategy._frozen(history, dists)
    again = strategy._frozen(history, dists)
    assert all(first[i] is again[i] for i in running)
    assert all(first[i].state == optuna.trial.TrialState.RUNNING for i in running)
    ended = list(history)
    ended[running[0]] = _trial(
        running[0], history[running[0]].params, TrialState.COMPLETE, {"tokens_per_s": 3000.0}
    )
    third = strategy._frozen(ended, dists)
    assert third[running[0]].values == [3000.0] and third[running[0]] is not first[running[0]]
    assert all(third[i] is first[i] for i in running[1:])
    assert set(strategy._pending) == {
        (t.study_id, t.id) for i, t in enumerate(ended) if i in running[1:]
    }


def test_tpe_keeping_what_it_derives_from_a_trial_proposes_what_recomputing_it_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shared trial's constraint values and internal representation are derived once and
    reused by every ask of every round: the batches are those of Optuna deriving them at
    every ask."""
    from optuna.trial import FrozenTrial

    from cubic.strategies import samplers

    resolved = _bench("llama3_8b_h100x16", "tpe")
    history = _with_pending(resolved, 40, 8)
    growing = [history[:30], history[:40], history]
    kept = make_strategy(resolved)
    fast = [[p.params for p in kept.suggest(h, 4)] for h in growing]
    made = [ft for _, ft in kept._made.values()]
    assert made and all({"constraints", "repr", "repr_of"} <= set(ft.memo) for ft in made)
    monkeypatch.setattr(
        samplers._RoundTPE, "_get_internal_repr", optuna.samplers.TPESampler._get_internal_repr
    )
    monkeypatch.setattr(samplers._Shared, "constraints", FrozenTrial.constraints)
    monkeypatch.setattr(samplers._RoundTPE, "_sample", optuna.samplers.TPESampler._sample)
    plain = make_strategy(resolved)
    assert [[p.params for p in plain.suggest(h, 4)] for h in growing] == fast


@pytest.mark.parametrize(
    ("study", "folder"), [("llama3_8b_h100x16", "bench"), ("llama3_8b_h100x16_memory", "bench_mo")]
)
def test_tpe_keeping_a_rounds_split_and_estimators_proposes_what_rebuilding_them_would(
    study: str, folder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within a round the finished trials' split and the estimators of trial sets already
    seen are kept (one or two objectives): the batches are Optuna's own, and a round of
    ``n`` proposals builds at most ``n + 1`` estimators where Optuna builds two per ask."""
    from cubic.strategies import samplers

    resolved = _bench(study, "tpe", folder)
    assert len(resolved.spec.objectives) == (2 if folder == "bench_mo" else 1)
    history = _with_pending(resolved, 60, 8)
    growing = [history[:40], history]
    built: list[int] = []
    build = optuna.samplers.TPESampler._build_parzen_estimator

    def counted(self, *args, **kwargs):
        built.append(1)
        return build(self, *args, **kwargs)

    asks: list[int] = []
    ask = optuna.Study.ask

    def counted_ask(self, *args, **kwargs):
        asks.append(1)
        return ask(self, *args, **kwargs)

    monkeypatch.setattr(samplers._RoundTPE, "_build_parzen_estimator", counted)
    monkeypatch.setattr(optuna.Study, "ask", counted_ask)
    kept = make_strategy(resolved)
    fast = []
    for h in growing:
        built.clear()
        asks.clear()
        fast.append([p.params for p in kept.suggest(h, 6)])
        assert len(built) <= 6 + 1 < 2 * len(asks)
    monkeypatch.setattr(samplers._RoundTPE, "_sample", optuna.samplers.TPESampler._sample)
    plain = make_strategy(resolved)
    assert [[p.params for p in plain.suggest(h, 6)] for h in growing] == fast


@pytest.mark.parametrize("study", ["llama3_8b_h100x16", "dlrm_dcnv2_h100x64"])
def test_a_repair_picks_the_nearest_untried_config_as_double_precision_would(study: str) -> None:
    """The repair's distances are taken in single precision first: its pick is the pool's
    first config at the least L1 distance in double precision, never tried."""
    resolved = _bench(study, "tpe")
    strategy = make_strategy(resolved)
    configs, index, pos = strategy._valid_pool()
    rng = np.random.default_rng(3)
    draws = resolved.space.sample(rng, 40, resolved.context)
    seen = {config_key(c) for c in configs[::7]}
    for draw in draws:
        point = {}
        for p in resolved.space.parameters:  # an inactive knob's default: its first choice
            v = draw[p.name] if p.contains(draw[p.name]) else p.to_python(p.grid())[0]
            point[p.name] = p.array([v])
        dist = np.abs(pos - strategy.positions(point)).sum(axis=1)
        dist[[index[k] for k in seen if k in index]] = np.inf
        want = configs[int(np.argmin(dist))]
        got = strategy._nearest_valid(draw, seen)
        assert got == want and config_key(got) not in seen
    everything = {config_key(c) for c in configs}
    assert strategy._nearest_valid(draws[0], everything) is None


def test_tpe_keeps_each_shared_trials_row_per_search_space() -> None:
    """The rows equal Optuna's for shared and unshared trials, a trial without one of the
    space's knobs (an inactive conditional one) gives none, and a new space is derived
    anew."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from cubic.strategies import samplers

    dists = {"tp": CategoricalDistribution([1, 2, 4]), "vp": IntDistribution(1, 4)}
    both = samplers._shared(
        optuna.trial.create_trial(params={"tp": 4, "vp": 3}, distributions=dists, value=1.0)
    )
    only_tp = samplers._shared(
        optuna.trial.create_trial(params={"tp": 2}, distributions={"tp": dists["tp"]}, value=2.0)
    )
    plain = optuna.trial.create_trial(params={"tp": 1, "vp": 1}, distributions=dists, value=3.0)
    trials = [both, only_tp, plain]
    study = optuna.create_study()
    ours = samplers._RoundTPE(multivariate=True)
    optunas = optuna.samplers.TPESampler(multivariate=True)
    for space in (dists, {"tp": dists["tp"]}, dists):
        want = optunas._get_internal_repr(trials, space, study)
        for _ in range(2):  # derived, then kept
            got = ours._get_internal_repr(trials, space, study)
            assert list(got) == list(want)
            assert all(np.array_equal(got[k], want[k]) for k in want)
    assert both.memo["repr_of"] == ("tp", "vp") and only_tp.memo["repr"] is None
    assert not hasattr(plain, "memo")

"""Pruning rules: progress reports, the threshold rule's confidence bound, and Optuna's
median and percentile rules."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from scipy.stats import t as student_t

from cubic.errors import InvalidInput
from cubic.job import StepTimer
from cubic.pruning import Progress, judge, upper_bound
from cubic.study import PruningSpec, parse_spec

RULE = PruningSpec(enabled=True)  # threshold, 0.8 of the best, 95 %, 5 timed steps


def _progress(mean: float, cv: float, n: int, *, units: float = 1000.0, seed: int = 0) -> Progress:
    """A job whose ``n`` timed steps (after 3 warm-up steps) have mean ``mean`` seconds."""
    rng = np.random.default_rng(seed)
    times = mean * rng.lognormal(0.0, cv, size=n + 3)
    times[:3] *= 3.0
    return Progress.of_times(times, 3, units)


def test_progress_summarises_the_steps_after_warm_up() -> None:
    times = [3.0, 3.0, 1.0, 1.2, 0.8, 1.0]
    p = Progress.of_times(times, 2, 500.0)
    assert (p.steps, p.timed_steps) == (6, 4)
    assert p.step_time_s == pytest.approx(1.0)
    assert p.step_time_std_s == pytest.approx(np.std([1.0, 1.2, 0.8, 1.0], ddof=1))
    assert p.throughput == pytest.approx(500.0)
    assert p.elapsed_s == pytest.approx(sum(times))
    assert Progress.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"timed_steps": 1, "step_time_s": 1.0}, "progress.steps"),
        ({"steps": -1}, "progress.steps"),
        ({"steps": True}, "progress.steps"),
        ({"steps": 3, "timed_steps": 4, "step_time_s": 1.0}, "progress.timed_steps"),
        ({"steps": 3, "timed_steps": 2}, "progress.step_time_s"),
        ({"steps": 3, "timed_steps": 2, "step_time_s": math.nan}, "progress.step_time_s"),
        ({"steps": 3, "throughput": -5.0}, "progress.throughput"),
        ({"steps": 3, "step_time_std_s": "big"}, "progress.step_time_std_s"),
        ({"steps": 3, "elapsed_s": 1e12}, "progress.elapsed_s"),
    ],
)
def test_a_bad_progress_report_is_refused_naming_the_field(data: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        Progress.from_dict(data)
    assert err.value.field == field


def test_the_step_timer_keeps_the_progress_a_runner_reads(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    timer = StepTimer(warmup=2, progress_path=path)
    times = [2.0, 1.5, 1.0, 1.1, 0.9]
    for i, s in enumerate(times):
        timer._written = -math.inf  # every step written, whatever the clock says
        timer.record(s, tokens=100.0)
        seen = Progress.from_dict(json.loads(path.read_text())).to_dict()
        assert seen == pytest.approx(Progress.of_times(times[: i + 1], 2, 100.0).to_dict())
    assert timer.progress().throughput == pytest.approx(timer.metrics()["tokens_per_s"])
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, then renamed


def test_only_rank_zero_writes_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBIC_PROGRESS", str(tmp_path / "progress.json"))
    monkeypatch.setenv("RANK", "1")
    StepTimer(warmup=0).record(1.0, tokens=1.0)
    assert not (tmp_path / "progress.json").exists()
    monkeypatch.setenv("RANK", "0")
    StepTimer(warmup=0).record(1.0, tokens=1.0)
    assert (tmp_path / "progress.json").exists()


def test_the_upper_bound_is_the_one_sided_student_t_bound_of_the_step_time() -> None:
    p = Progress(steps=13, timed_steps=10, step_time_s=2.0, step_time_std_s=0.3, throughput=50.0)
    low = 2.0 - student_t.ppf(0.95, 9) * 0.3 / math.sqrt(10)
    assert upper_bound(p, 0.95) == pytest.approx(50.0 * 2.0 / low)
    assert upper_bound(p, 0.99) > upper_bound(p, 0.95) > 50.0
    wild = Progress(steps=5, timed_steps=2, step_time_s=1.0, step_time_std_s=5.0, throughput=9.0)
    assert upper_bound(wild, 0.95) == math.inf  # the step time's lower bound is not positive


def test_threshold_prunes_a_clearly_slow_trial_and_keeps_a_close_one() -> None:
    best = 1000.0  # units per second
    slow = _progress(mean=2.0, cv=0.03, n=6)  # 500/s: half the best
    close = _progress(mean=1.15, cv=0.03, n=6)  # ~870/s: above 0.8 of the best
    v = judge(RULE, slow, [best, 700.0])
    assert v is not None and v.prune
    assert v.bound < v.limit == pytest.approx(0.8 * best) and v.best == best
    assert v.timed_steps == 6 and v.trials == 2
    assert "pruned (threshold)" in v.reason and "95% confidence" in v.reason
    keep = judge(RULE, close, [best])
    assert keep is not None and not keep.prune


def test_threshold_waits_until_the_noise_allows_a_verdict() -> None:
    """A trial at 0.7 of the best with noisy steps: a few steps cannot tell, more can."""
    best = 1000.0
    few = _progress(mean=1 / 0.7, cv=0.5, n=5, seed=3)
    many = _progress(mean=1 / 0.7, cv=0.5, n=400, seed=3)
    assert upper_bound(few, 0.95) > 0.8 * best  # could still be fast enough
    assert not judge(RULE, few, [best]).prune
    assert judge(RULE, many, [best]).prune


def test_no_verdict_while_it_is_too_early() -> None:
    slow = _progress(mean=2.0, cv=0.03, n=6)
    assert judge(RULE, slow, []) is None  # nothing complete to compare with
    assert judge(RULE.model_copy(update={"startup_trials": 3}), slow, [1000.0, 900.0]) is None
    assert judge(RULE.model_copy(update={"min_steps": 7}), slow, [1000.0]) is None
    assert judge(RULE.model_copy(update={"warmup_steps": 9}), slow, [1000.0]) is None
    assert judge(RULE.model_copy(update={"warmup_steps": 8}), slow, [1000.0]).prune
    blind = Progress(steps=9, timed_steps=6, step_time_s=2.0, step_time_std_s=0.1)
    assert judge(RULE, blind, [1000.0]) is None  # no throughput measured


@pytest.mark.parametrize("method", ["median", "percentile"])
def test_median_and_percentile_follow_optunas_pruners(method: str) -> None:
    """The same verdict as Optuna's pruner given the complete trials' throughputs as their
    intermediate values at the trial's step, over many random cases."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(7)
    dist = optuna.distributions.FloatDistribution(0.0, 1.0)
    verdicts = set()
    for _ in range(60):
        percentile = float(rng.choice([10.0, 25.0, 50.0, 75.0]))
        startup = int(rng.integers(1, 6))
        warmup = int(rng.integers(0, 12))
        rule = PruningSpec(
            enabled=True,
            method=method,
            percentile=percentile,
            startup_trials=startup,
            warmup_steps=warmup,
            min_steps=2,
        )
        n_done = int(rng.integers(0, 9))
        done = rng.uniform(100.0, 1000.0, n_done).tolist()
        p = _progress(mean=1.0, cv=0.05, n=int(rng.integers(2, 12)), units=rng.uniform(100, 1000))
        step = p.steps - 1  # Optuna counts steps from 0
        pruner = (
            optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
            if method == "median"
            else optuna.pruners.PercentilePruner(
                percentile, n_startup_trials=startup, n_warmup_steps=warmup
            )
        )
        study = optuna.create_study(direction="maximize", pruner=pruner)
        study.add_trials(
            [
                optuna.trial.create_trial(
                    params={"x": 0.5},
                    distributions={"x": dist},
                    value=v,
                    intermediate_values={step: v},
                )
                for v in done
            ]
        )
        running = optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING,
            params={"x": 0.5},
            distributions={"x": dist},
            intermediate_values={step: p.throughput},
        )
        ours = judge(rule, p, done)
        assert bool(ours and ours.prune) == pruner.prune(study, running)
        verdicts.add(bool(ours and ours.prune))
    assert verdicts == {True, False}  # both answers came up


def test_the_spec_section_is_off_by_default_and_validated() -> None:
    base = {"name": "s", "workload": "llama3_8b", "space": "llm_pretrain.yaml"}
    assert not parse_spec(base).pruning.enabled
    on = parse_spec({**base, "pruning": {"enabled": True, "method": "median"}}).pruning
    assert on.method == "median" and on.fraction == 0.8 and on.confidence == 0.95
    with pytest.raises(InvalidInput) as err:
        parse_spec({**base, "objective": "cost", "pruning": {"enabled": True}})
    assert err.value.field == "pruning" and "throughput objective" in str(err.value)
    for bad, field in [
        ({"fraction": 1.5}, "pruning.fraction"),
        ({"confidence": 1.0}, "pruning.confidence"),
        ({"method": "hyperband"}, "pruning.method"),
        ({"min_steps": 1}, "pruning.min_steps"),
        ({"enable": True}, "pruning.enable"),
    ]:
        with pytest.raises(InvalidInput) as err:
            parse_spec({**base, "pruning": bad})
        assert err.value.field == field

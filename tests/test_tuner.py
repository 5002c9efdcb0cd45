"""The study lifecycle over a real store and real Optuna samplers.

The jobs here are small black-box functions, as every job is to the tuner: what is tested is
how the tuner proposes, leases, retries and learns, not a performance model.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cubic.errors import Conflict, InvalidInput, LeaseLost
from cubic.outcome import Outcome
from cubic.store import Store, schema
from cubic.store.engine import make_engine
from cubic.store.objects import StudyState, TrialState
from cubic.study import parse_spec
from cubic.tuner import Tuner

# Half of this space is "out of memory": every config with x >= 10.
HALF_OOM_SPACE = {
    "name": "half_oom",
    "parameters": {
        "x": {"type": "int", "low": 0, "high": 19},
        "y": {"type": "int", "low": 0, "high": 19},
    },
}
WORKLOAD = {"preset": "llama3_8b"}


def _spec(**kw: Any) -> Any:
    base = {
        "name": "t",
        "workload": WORKLOAD,
        "space": HALF_OOM_SPACE,
        "objective": "throughput",
        "budget": {"max_trials": 60, "max_parallel": 4},
        "strategy": {"name": "tpe", "seed": 2},
    }
    base.update(kw)
    return parse_spec(base)


def _job(params: dict[str, Any]) -> Outcome:
    x, y = params["x"], params["y"]
    if x >= 10:
        return Outcome("infeasible", error="CUDA out of memory")
    return Outcome("complete", {"throughput": 1000.0 - 30 * (x - 4) ** 2 - 3 * (y - 7) ** 2})


@pytest.fixture
def tuner(store: Store) -> Tuner:
    return Tuner(store)


def _run(tuner: Tuner, sid: int, worker: str = "w", batch: int = 1) -> list[Any]:
    """Run the study to its end; returns the trials in the order they were leased."""
    order = []
    while True:
        leased = tuner.ask(sid, worker, batch)
        if not leased:
            return order
        for t in leased:
            order.append(t)
            tuner.tell(t.id, t.lease_token, _job(t.params))


def test_infeasible_region_is_avoided(tuner: Tuner) -> None:
    first = last = 0
    for seed in (1, 2, 3):
        sid = tuner.create_study(_spec(strategy={"name": "tpe", "seed": seed})).id
        order = _run(tuner, sid, batch=4)
        assert len(order) == 60
        assert tuner.store.get_study(sid).state == StudyState.COMPLETED
        infeasible = [t.params["x"] >= 10 for t in order]
        first += sum(infeasible[:20])
        last += sum(infeasible[40:])
    # Random proposals put about half of each third in the out-of-memory half.
    assert first >= 15
    assert last <= first / 2.5, (first, last)


def test_finds_a_good_config_and_never_repeats_one(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec()).id
    order = _run(tuner, sid, batch=4)
    keys = [(t.params["x"], t.params["y"]) for t in order]
    assert len(set(keys)) == len(keys)
    best = tuner.best(sid)
    assert best is not None and best.value >= 1000 - 30 - 12  # within one step of (4, 7)


@pytest.mark.parametrize("strategy", ["random", "qmc", "grid", "tpe", "gp"])
def test_every_strategy_proposes_valid_distinct_configs(tuner: Tuner, strategy: str) -> None:
    if strategy == "gp":
        pytest.importorskip("torch", reason="strategy 'gp' needs PyTorch (pip install cubic[gp])")
    spec = _spec(
        strategy={"name": strategy, "seed": 3}, budget={"max_trials": 12, "max_parallel": 12}
    )
    sid = tuner.create_study(spec).id
    leased = tuner.ask(sid, "w", 12)
    assert len(leased) == 12
    assert len({(t.params["x"], t.params["y"]) for t in leased}) == 12
    assert all(0 <= t.params["x"] < 20 for t in leased)


def test_space_constraints_are_respected_by_the_sampler(tuner: Tuner) -> None:
    space = {
        **HALF_OOM_SPACE,
        "constraints": [{"expr": "(x + y) % 3 == 0", "message": "x + y must be a multiple of 3"}],
    }
    sid = tuner.create_study(_spec(space=space, budget={"max_trials": 30, "max_parallel": 30})).id
    leased = tuner.ask(sid, "w", 30)
    assert len(leased) == 30
    assert all((t.params["x"] + t.params["y"]) % 3 == 0 for t in leased)


def test_same_worker_gets_same_trial_back(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec()).id
    a = tuner.ask(sid, "w1", 1)
    again = tuner.ask(sid, "w1", 1)
    assert [t.id for t in again] == [t.id for t in a]
    other = tuner.ask(sid, "w2", 1)
    assert other[0].id != a[0].id


def test_repeated_report_changes_nothing(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec()).id
    (t,) = tuner.ask(sid, "w", 1)
    out = Outcome("complete", {"throughput": 123.0})
    first = tuner.tell(t.id, t.lease_token, out)
    events = tuner.store.trial_events(t.id)
    second = tuner.tell(t.id, t.lease_token, out)
    assert second == first
    assert tuner.store.trial_events(t.id) == events
    with pytest.raises(Exception):  # noqa: B017 - a finished trial never changes
        tuner.tell(t.id, t.lease_token, Outcome("failed", error="late"))
    assert tuner.store.get_trial(t.id).metrics == {"throughput": 123.0}


def test_failed_trials_are_retried_up_to_the_cap(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec(max_retries=2, budget={"max_trials": 1, "max_parallel": 1})).id
    attempts = []
    while leased := tuner.ask(sid, "w", 1):
        (t,) = leased
        attempts.append(t)
        tuner.tell(t.id, t.lease_token, Outcome("failed", error="node lost"))
    assert [t.attempt for t in attempts] == [1, 2, 3]
    assert len({str(t.params) for t in attempts}) == 1
    trials = tuner.store.list_trials(sid)
    assert [t.state for t in trials] == [TrialState.FAILED] * 3
    assert tuner.store.get_study(sid).state == StudyState.COMPLETED


def test_infeasible_trials_are_not_retried(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec(budget={"max_trials": 1, "max_parallel": 1})).id
    (t,) = tuner.ask(sid, "w", 1)
    tuner.tell(t.id, t.lease_token, Outcome("infeasible", error="CUDA out of memory"))
    assert tuner.ask(sid, "w", 1) == []
    assert tuner.store.count_trials(sid)[TrialState.INFEASIBLE] == 1


def test_expired_lease_is_reaped_and_retried(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec(budget={"max_trials": 1, "max_parallel": 1})).id
    (t,) = tuner.ask(sid, "w", 1, lease_seconds=0.01)
    later = datetime.now(UTC) + timedelta(seconds=5)
    reaped = tuner.store.reap_expired(now=later)
    assert [r.id for r in reaped] == [t.id]
    assert tuner.store.get_trial(t.id).state == TrialState.FAILED
    with pytest.raises(LeaseLost):
        tuner.tell(t.id, t.lease_token, Outcome("complete", {"throughput": 1.0}))
    (retry,) = tuner.ask(sid, "w2", 1)
    assert retry.params == t.params and retry.attempt == 2


def test_budget_caps_parallel_trials(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec(budget={"max_trials": 10, "max_parallel": 3})).id
    assert len(tuner.ask(sid, "w", 8)) == 3


def test_baseline_runs_first_and_speedup_is_reported(tuner: Tuner) -> None:
    sid = tuner.create_study(
        _spec(baseline={"x": 2, "y": 2}, budget={"max_trials": 20, "max_parallel": 4})
    ).id
    (first,) = tuner.ask(sid, "w", 1)
    assert first.source == "baseline" and first.params["x"] == 2
    tuner.tell(first.id, first.lease_token, _job(first.params))
    _run(tuner, sid)
    best = tuner.best(sid)
    assert best is not None
    assert best.baseline_value == pytest.approx(1000 - 120 - 75)
    assert best.speedup == pytest.approx(best.value / best.baseline_value)
    assert best.speedup > 1.0


def test_constraint_violating_trial_never_counts_as_best(tuner: Tuner) -> None:
    sid = tuner.create_study(
        _spec(constraints={"max_error_score": 0.5}, budget={"max_trials": 2, "max_parallel": 2})
    ).id
    a, b = tuner.ask(sid, "w", 2)
    tuner.tell(a.id, a.lease_token, Outcome("complete", {"throughput": 9e9, "error_score": 2}))
    tuner.tell(b.id, b.lease_token, Outcome("complete", {"throughput": 10.0, "error_score": 0}))
    assert "numerical-error score" in (tuner.store.get_trial(a.id).error or "")
    assert tuner.best(sid).trial.id == b.id


def test_best_reads_the_kept_history_and_sees_what_another_process_finished(
    store: Store,
) -> None:
    from cubic import tuner as tuner_module

    reader, writer = Tuner(store), Tuner(store)  # two processes on one store
    sid = writer.create_study(_spec(budget={"max_trials": 4, "max_parallel": 2})).id
    a, _ = writer.ask(sid, "w", 2)
    writer.tell(a.id, a.lease_token, Outcome("complete", {"throughput": 10.0}))
    assert reader.best(sid).trial.id == a.id
    (b,) = [t for t in writer.ask(sid, "w", 2) if t.id != a.id][:1]
    writer.tell(b.id, b.lease_token, Outcome("complete", {"throughput": 20.0}))
    assert reader.best(sid).trial.id == b.id  # the kept history caught up
    assert [t.state for t in reader.finished(sid)] == [TrialState.COMPLETE] * 2
    others = [
        reader.create_study(_spec(budget={"max_trials": 2, "max_parallel": 1})).id
        for _ in range(tuner_module.MAX_READ_HISTORIES + 2)
    ]
    for other in others:
        reader.finished(other)
    assert len(reader._histories) <= tuner_module.MAX_READ_HISTORIES
    assert others[-1] in reader._histories and sid not in reader._histories


def test_bad_baseline_and_missing_metric_are_clear_errors(tuner: Tuner) -> None:
    with pytest.raises(InvalidInput, match="baseline"):
        tuner.create_study(_spec(baseline={"x": 99, "y": 0}))
    sid = tuner.create_study(_spec()).id
    (t,) = tuner.ask(sid, "w", 1)
    with pytest.raises(InvalidInput, match="throughput"):
        tuner.tell(t.id, t.lease_token, Outcome("complete", {"mfu": 0.5}))
    assert tuner.store.get_trial(t.id).state == TrialState.RUNNING


def test_paused_study_proposes_nothing(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec()).id
    tuner.store.set_study_state(sid, StudyState.PAUSED)
    assert tuner.ask(sid, "w", 2) == []


# -- study states, imported history, concurrency ----------------------------------------------


def test_study_state_rules(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec()).id
    assert tuner.set_state(sid, "paused").state == StudyState.PAUSED
    assert tuner.set_state(sid, "paused").state == StudyState.PAUSED  # a repeat is harmless
    assert tuner.set_state(sid, "running").state == StudyState.RUNNING
    assert tuner.set_state(sid, "stopped").state == StudyState.STOPPED
    with pytest.raises(Conflict, match="only from: paused"):
        tuner.set_state(sid, "running")
    with pytest.raises(InvalidInput):
        tuner.set_state(sid, "completed")
    assert tuner.set_state(sid, "archived").state == StudyState.ARCHIVED
    for state in ("running", "paused", "stopped"):
        with pytest.raises(Conflict, match="archived"):
            tuner.set_state(sid, state)


def test_resuming_a_study_whose_last_trials_finished_while_paused_completes_it(
    tuner: Tuner,
) -> None:
    sid = tuner.create_study(_spec(budget={"max_trials": 1, "max_parallel": 1})).id
    (t,) = tuner.ask(sid, "w", 1)
    tuner.set_state(sid, "paused")
    tuner.tell(t.id, t.lease_token, _job(t.params))
    assert tuner.store.get_study(sid).state == StudyState.PAUSED
    assert tuner.set_state(sid, "running").state == StudyState.COMPLETED


def test_imported_history_is_checked_and_uses_no_budget(tuner: Tuner) -> None:
    sid = tuner.create_study(
        _spec(constraints={"max_error_score": 0.5}, budget={"max_trials": 2, "max_parallel": 2})
    ).id
    done = tuner.import_history(
        sid,
        [
            ({"x": 4, "y": 7}, "complete", {"throughput": 1000.0}),
            ({"x": 12, "y": 0}, "infeasible", None),
            ({"x": 5, "y": 7}, "complete", {"throughput": 5000.0, "error_score": 3.0}),
        ],
    )
    assert [t.state for t in done] == [
        TrialState.COMPLETE,
        TrialState.INFEASIBLE,
        TrialState.INFEASIBLE,
    ]
    assert done[1].params == {"x": 12, "y": 0} and {t.source for t in done} == {"imported"}
    assert tuner.best(sid).trial.id == done[0].id  # the constraint breaker never counts
    assert len(tuner.ask(sid, "w", 5)) == 2  # the budget is intact
    with pytest.raises(InvalidInput, match=r"trials\.0\.params") as info:
        tuner.import_history(sid, [({"x": 99, "y": 0}, "complete", {"throughput": 1.0})])
    assert info.value.field == "trials.0.params"
    # A misspelt knob is refused, not dropped: it would stand for another config.
    with pytest.raises(InvalidInput, match=r"'yy' \(did you mean 'y'\?\)") as info:
        tuner.import_history(sid, [({"x": 4, "yy": 7}, "complete", {"throughput": 1.0})])
    assert info.value.field == "trials.0.params"
    with pytest.raises(InvalidInput, match="throughput") as info:
        tuner.import_history(sid, [({"x": 1, "y": 1}, "complete", {"mfu": 0.4})])
    assert info.value.field == "trials.0.metrics"
    with pytest.raises(InvalidInput) as info:
        tuner.import_history(sid, [({"x": 1, "y": 1}, "running", None)])
    assert info.value.field == "trials.0.state"
    tuner.set_state(sid, "archived")
    with pytest.raises(Conflict):
        tuner.import_history(sid, [({"x": 1, "y": 1}, "failed", None)])


def test_an_incomplete_enqueued_config_is_invalid_input(tuner: Tuner) -> None:
    sid = tuner.create_study(_spec()).id
    with pytest.raises(InvalidInput, match=r"missing parameter\(s\) y") as info:
        tuner.enqueue(sid, [{"x": 1, "y": 1}, {"x": 1}])
    assert info.value.field == "configs.1"


def test_a_burst_of_asks_does_not_starve_the_connection_pool(db_url: str) -> None:
    # Two pooled connections for sixteen threads: waiting for the study's proposal lock
    # must not hold a connection, or the lock's holder could never get one.
    schema.upgrade(db_url)
    engine = make_engine(db_url, pool_size=2, max_overflow=0, pool_timeout=10)
    try:
        tuner = Tuner(Store(engine))
        sid = tuner.create_study(_spec(budget={"max_trials": 40, "max_parallel": 40})).id
        with ThreadPoolExecutor(16) as pool:
            leased = list(pool.map(lambda i: tuner.ask(sid, f"w{i}", 2), range(16)))
        # Every ask answered (none timed out waiting for a connection), no trial twice. An
        # ask may get fewer than it wanted: another's fast path can take what it proposed.
        ids = [t.id for batch in leased for t in batch]
        assert ids and len(ids) == len(set(ids))
        running = tuner.store.list_trials(sid, states=[TrialState.RUNNING])
        assert sorted(ids) == [t.id for t in running]
    finally:
        engine.dispose()


def test_the_service_fits_each_study_s_own_model_ahead_of_demand(store: Store) -> None:
    """With background fitting, the strategy still proposes with its own per-study model
    (the one the benchmark fits): prefit fits it once the warm-up has finished, and the next
    round proposes from it however fast the jobs came back."""
    from cubic.sim.job import NoiseModel, run_job
    from cubic.study import load_spec

    root = Path(__file__).resolve().parents[1]
    spec, base = load_spec(root / "search_spaces" / "bench" / "dlrm_dot_a100x8.study.yaml")
    tuner = Tuner(store, background_fit=True)
    sid = tuner.create_study(spec, base).id
    assert tuner.prefit() == []  # nothing finished: nothing to fit
    wl = tuner.resolved(sid).workload
    done = 0
    while done < 9:  # the baseline and the warm-up batch, each reported at once
        for t in tuner.ask(sid, "w", 1):
            tuner.tell(t.id, t.lease_token, run_job(wl, t.params, noise=NoiseModel.off()))
            done += 1
    assert tuner.prefit() == [sid]
    strategy = tuner._strategies[sid]
    fitted = strategy._model
    assert fitted is not None
    assert tuner.prefit() == []  # up to date: not refitted
    leased = tuner.ask(sid, "w", 1)
    assert leased and leased[0].predicted["phase"] == "model"
    assert strategy._model is fitted  # the round used the model fitted ahead of it


def test_of_two_processes_only_the_latest_proposer_fits_ahead(store: Store) -> None:
    """Each API process's background process fits ahead the studies it proposes for: of
    several, only the one that proposed last does (it is the likeliest to propose next),
    instead of every one of them fitting the same model."""
    from cubic.sim.job import NoiseModel, run_job
    from cubic.study import load_spec

    root = Path(__file__).resolve().parents[1]
    spec, base = load_spec(root / "search_spaces" / "bench" / "dlrm_dot_a100x8.study.yaml")
    a = Tuner(store, background_fit=True)
    b = Tuner(store, background_fit=True)  # another API process on the same database
    sid = a.create_study(spec, base).id
    wl = a.resolved(sid).workload

    def run(tuner: Tuner, n: int) -> None:
        done = 0
        while done < n:
            for t in tuner.ask(sid, "w", 1):
                tuner.tell(t.id, t.lease_token, run_job(wl, t.params, noise=NoiseModel.off()))
                done += 1

    run(a, 9)  # the baseline and the warm-up, proposed by a
    assert b.fill(sid) > 0  # b proposes the next round (and fits for it)
    assert a.prefit() == []  # b proposed since: a leaves the study to b
    run(b, 8)
    assert b.prefit() == [sid]
    assert a.prefit() == []


def test_the_pruner_never_stops_the_baseline_not_even_its_retry(tuner: Tuner) -> None:
    from cubic.pruning import Progress

    spec = _spec(
        baseline={"x": 1, "y": 1},
        budget={"max_trials": 4, "max_parallel": 1},
        pruning={"enabled": True},
    )
    sid = tuner.create_study(spec).id
    tuner.enqueue(sid, [{"x": 4, "y": 7}])
    slow = Progress(steps=10, timed_steps=8, step_time_s=1.0, step_time_std_s=0.01, throughput=9.0)
    (base,) = tuner.ask(sid, "w")
    assert base.source == "baseline"
    assert tuner.judge(base, slow) is None  # nothing complete yet, and the baseline anyway
    tuner.tell(base.id, base.lease_token, Outcome("failed", error="node lost"))
    (good,) = tuner.ask(sid, "w")
    tuner.tell(good.id, good.lease_token, _job(good.params))
    (retry,) = tuner.ask(sid, "w")
    assert retry.source == "retry" and retry.retry_of == base.id
    assert tuner.judge(retry, slow) is None
    tuner.tell(retry.id, retry.lease_token, _job(retry.params))
    (other,) = tuner.ask(sid, "w")
    assert other.source == "strategy"
    verdict = tuner.judge(other, slow)
    assert verdict is not None and verdict.prune and verdict.best == 1000.0
    fast = Progress(steps=10, timed_steps=8, step_time_s=1.0, throughput=990.0)
    assert not tuner.judge(other, fast).prune
    metrics = {"throughput": 9.0, **verdict.metrics()}
    done = tuner.tell(other.id, other.lease_token, Outcome("pruned", metrics, verdict.reason))
    assert done.state == TrialState.PRUNED and tuner.best(sid).trial.id == good.id
    off = tuner.create_study(_spec(budget={"max_trials": 2, "max_parallel": 1})).id
    (t,) = tuner.ask(off, "w")
    assert tuner.judge(t, slow) is None  # pruning is off by default


def test_a_report_costs_the_same_statements_whatever_the_history(tuner: Tuner) -> None:
    """Constant work per call: a report is one transaction whose statements do not grow
    with the study (the checks run on the row it locks, the counts come back with the
    change), at 4 finished trials as at 40."""
    from sqlalchemy import event

    sid = tuner.create_study(
        _spec(
            space={"name": "s", "parameters": {"x": {"type": "int", "low": 0, "high": 9},
                                                "y": {"type": "int", "low": 0, "high": 19}}},
            strategy={"name": "random", "seed": 0},
        )
    ).id  # fmt: skip
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = tuner.store._engine
    event.listen(engine, "before_cursor_execute", record)
    per_report: list[int] = []
    try:
        while len(per_report) < 44:
            leased = tuner.ask(sid, "w", 4)
            assert leased
            for t in leased[:-1]:  # the batch's last report may complete a round
                seen.clear()
                tuner.tell(t.id, t.lease_token, _job(t.params))
                per_report.append(len(seen))
            last = leased[-1]
            tuner.tell(last.id, last.lease_token, _job(last.params))
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(set(per_report)) == 1, per_report
    # Lock and read the trial, update it, log the event, move the counts (SQLite also
    # begins its write transaction by hand); a report read the trial twice and the counts
    # in a transaction of their own before (9 on SQLite).
    assert per_report[0] <= 5, per_report


def test_a_short_lease_says_to_wait_about_one_proposal_round(store: Store) -> None:
    """With a background proposer, a lease that finds nothing waiting tells the worker to
    come back after about one round of that process's proposer (bounded), not a fixed time:
    a study whose rounds take seconds is not polled many times in each."""
    tuner = Tuner(store, background_propose=True)
    sid = tuner.create_study(_spec()).id

    def hint() -> float | None:
        got = tuner.lease(sid, "w", 1)
        assert got.trials == [] and tuner.wake.is_set()  # nothing proposed: the proposer woken
        return got.retry_after_s

    untimed = hint()
    assert untimed is not None and untimed > 0
    for _ in range(30):
        tuner.observe_round(1.5)
    assert hint() == pytest.approx(1.5, rel=0.01)
    tuner.observe_round(0.001)
    assert 1.0 < hint() < 1.5  # a running average: one quick round moves it a little
    for _ in range(60):
        tuner.observe_round(0.001)
    assert hint() == pytest.approx(0.1)  # bounded below: workers do not spin
    for _ in range(60):
        tuner.observe_round(600.0)
    assert hint() == pytest.approx(2.0)  # nor wait long for a round that may end at once


@pytest.mark.parametrize(("gap_s", "ahead"), [(0.0, 2), (600.0, 0)])
def test_a_learning_strategy_keeps_waiting_the_slots_that_free_up_during_its_rounds(
    store: Store, gap_s: float, ahead: int
) -> None:
    """A background proposer of a learning strategy proposes for the free slots and, once
    it has measured the study's pace, for the slots expected to free up during two of its
    rounds (at most an eighth of ``max_parallel``): a few when trials end as fast as its
    rounds run, none when they run for minutes. Rounds take 0.2 s on a clock of the test's;
    ``gap_s`` passes between the rounds, while the workers run every trial."""
    from cubic.tuner import _Pace

    now = [0.0]

    def clock() -> float:  # each reading is 0.1 s later: a round reads it twice
        now[0] += 0.1
        return now[0]

    tuner = Tuner(store, background_propose=True)
    sid = tuner.create_study(_spec(budget={"max_trials": 200, "max_parallel": 16})).id
    tuner._pace[sid] = _Pace(clock=clock)
    waiting = []
    for _ in range(5):
        now[0] += gap_s
        tuner.fill(sid)
        counts = tuner.store.study_counts(sid)
        waiting.append(counts.waiting)
        got = tuner.lease(sid, "w", 32)
        assert len(got.trials) == 16  # never more than max_parallel run at once
        for t in got.trials:
            tuner.tell(t.id, t.lease_token, _job(t.params))
    assert waiting[:2] == [16, 16]  # two rounds measure the pace: it counts from the third
    assert waiting[-1] == 16 + ahead, waiting


def test_a_studys_pace_counts_each_freed_slot_once() -> None:
    """A round that found no room moves the mark the next round counts from."""
    from cubic.tuner import _Pace

    now = [0.0]
    pace = _Pace(clock=lambda: now[0])
    pace.observe(0)
    pace.done(64, 0.5)
    for active in (60, 56):  # two looks 1 s apart, the first without a round
        now[0] += 1.0
        pace.observe(active)
    pace.done(64, 0.5)
    assert [f for _, f in pace.freed] == [4, 4]
    assert pace.ahead(100) == 4  # 4 slots a second, over two rounds of 0.5 s
    assert pace.ahead(3) == 3
    now[0] += 100.0  # nothing measured for a while: the old pace no longer counts
    pace.observe(64)
    assert pace.ahead(100) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_each_study_is_proposed_for_by_one_background_process(store: Store, db_url: str) -> None:
    """Of two processes proposing in the background, the first to look takes a study and
    keeps it (its model stays in one process), takes one new study per look so that studies
    created at once are shared, lets a study go once it stops running, and takes over the
    studies of a process that ended."""
    first = Tuner(store, background_propose=True)
    a = first.create_study(_spec(name="a")).id
    b = first.create_study(_spec(name="b")).id
    with Store(db_url) as elsewhere:
        second = Tuner(elsewhere, background_propose=True)
        first.claims.retry_s = second.claims.retry_s = 0.0  # each look tries again at once
        try:
            assert first.to_fill() == [a]  # one new study per look
            assert second.to_fill() == [b]  # the other is the second process's
            assert first.to_fill() == [a] and second.to_fill() == [b]  # each keeps its own
            assert first.fill(a) > 0 and first.to_fill() == [] and first.claims.held == {a}
            second.claims.close()  # the second process ends
            assert first.to_fill() == [b] and first.claims.held == {a, b}
            first.set_state(a, "paused")
            assert first.to_fill() == [b] and first.claims.held == {b}  # a let go
            assert second.to_fill() == []  # a is paused, b the first's
        finally:
            second.claims.close()
            first.claims.close()

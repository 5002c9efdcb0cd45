"""The store contract, run unchanged against every backend (see ``conftest.db_url``)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import text

from cubic.errors import (
    Conflict,
    InvalidInput,
    LeaseLost,
    NotFound,
    StorageError,
    TrialFinished,
)
from cubic.store import LEASE_EXPIRED, Store, StudyState, Trial, TrialState
from cubic.store.engine import temporary_schema
from tests.store.backends import PG_ENV

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SPEC = {"workload": {"kind": "llm", "params": 7e9}, "objective": "tokens_per_s"}
R = TypeVar("R")


def params(i: int) -> dict[str, Any]:
    return {"tp": 2 ** (i % 3), "micro_batch": i, "recompute": i % 2 == 0}


def in_threads(n: int, fn: Callable[[int], R]) -> list[R]:
    """Run fn(0..n-1) in n threads released together, so their transactions collide."""
    barrier = threading.Barrier(n)

    def run(i: int) -> R:
        barrier.wait()
        return fn(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def event_pairs(store: Store, trial_id: int) -> list[tuple[str | None, str]]:
    return [
        (None if e.from_state is None else str(e.from_state), str(e.to_state))
        for e in store.trial_events(trial_id)
    ]


class TestStudies:
    def test_create_get_list_count(self, store: Store) -> None:
        a = store.create_study("a", SPEC, "llm")
        b = store.create_study("b", {}, "dlrm", max_attempts=1)
        c = store.create_study("c", {}, "llm")
        assert a.state is StudyState.RUNNING
        assert a.max_attempts == 3
        assert a.created_at.tzinfo is not None and a.created_at.utcoffset() == timedelta(0)
        assert store.get_study(a.id) == a
        assert store.get_study(a.id).spec == SPEC
        assert [s.id for s in store.list_studies()] == [a.id, b.id, c.id]
        assert [s.id for s in store.list_studies(workload_kind="llm")] == [a.id, c.id]
        assert [s.id for s in store.list_studies(limit=1, offset=1)] == [b.id]
        assert store.count_studies() == 3
        assert store.count_studies(workload_kind="llm") == 2
        store.set_study_state(b.id, "paused")
        assert [s.id for s in store.list_studies(state=StudyState.PAUSED)] == [b.id]
        assert store.count_studies(state="running") == 2

    def test_missing_study_is_not_found(self, store: Store) -> None:
        for call in (
            lambda: store.get_study(999),
            lambda: store.set_study_state(999, "paused"),
            lambda: store.add_trials(999, [{}]),
            lambda: store.lease_trials(999, "w", 1, 60),
            lambda: store.list_trials(999),
            lambda: store.count_trials(999),
        ):
            with pytest.raises(NotFound, match="study 999"):
                call()

    def test_invalid_input(self, store: Store) -> None:
        with pytest.raises(InvalidInput):
            store.create_study("", {}, "llm")
        with pytest.raises(InvalidInput):
            store.create_study("x", {}, "llm", max_attempts=0)
        with pytest.raises(InvalidInput, match="JSON"):
            store.create_study("x", {"bad": float("nan")}, "llm")
        study = store.create_study("x", {}, "llm")
        with pytest.raises(InvalidInput, match="unknown study state"):
            store.set_study_state(study.id, "sleeping")
        assert store.count_studies() == 1

    def test_archived_study_cannot_be_resumed(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        paused = store.set_study_state(study.id, StudyState.PAUSED)
        assert paused.state is StudyState.PAUSED
        assert paused.updated_at >= study.updated_at
        assert store.set_study_state(study.id, "running").state is StudyState.RUNNING
        store.set_study_state(study.id, "archived")
        with pytest.raises(Conflict, match="archived"):
            store.set_study_state(study.id, "running")
        with pytest.raises(Conflict, match="archived"):
            store.add_trials(study.id, [{}])
        assert store.set_study_state(study.id, "archived").state is StudyState.ARCHIVED

    def test_snapshots_are_immutable_copies(self, store: Store) -> None:
        spec = {"nested": {"a": [1, 2]}}
        study = store.create_study("a", spec, "llm")
        spec["nested"]["a"].append(3)  # the caller's dict is not the stored one
        study.spec["nested"]["a"].append(4)  # nor is the snapshot's
        assert store.get_study(study.id).spec == {"nested": {"a": [1, 2]}}
        with pytest.raises(dataclasses.FrozenInstanceError):
            study.name = "b"  # type: ignore[misc]


class TestTrials:
    def test_numbering_and_creation(self, store: Store) -> None:
        s1 = store.create_study("a", {}, "llm")
        s2 = store.create_study("b", {}, "llm")
        first = store.add_trials(s1.id, [params(0), params(1), params(2)])
        other = store.add_trials(s2.id, [params(9)])
        more = store.add_trials(
            s1.id, [params(3), params(4)], source="baseline", predicted=[{"tps": 1.5}, None]
        )
        assert [t.number for t in first + more] == [0, 1, 2, 3, 4]
        assert [t.number for t in other] == [0]
        assert all(t.state is TrialState.WAITING and t.attempt == 1 for t in first + more)
        assert more[0].source == "baseline" and more[0].predicted == {"tps": 1.5}
        assert more[1].predicted is None
        assert store.get_trial(first[1].id) == first[1]
        assert store.get_trial(first[1].id).params == params(1)
        assert event_pairs(store, first[0].id) == [(None, "waiting")]
        assert store.add_trials(s1.id, []) == []
        with pytest.raises(NotFound, match="trial 12345"):
            store.get_trial(12345)
        with pytest.raises(InvalidInput, match="source"):
            store.add_trials(s1.id, [{}], source="magic")
        with pytest.raises(InvalidInput, match="predicted"):
            store.add_trials(s1.id, [{}, {}], predicted=[None])
        assert len(store.list_trials(s1.id)) == 5

    def test_concurrent_add_trials_number_uniquely(self, store: Store, db_url: str) -> None:
        study = store.create_study("a", {}, "llm")

        def add(i: int) -> list[int]:
            with Store(db_url) as own:
                return [t.number for t in own.add_trials(study.id, [params(i)] * 5)]

        numbers = [n for batch in in_threads(8, add) for n in batch]
        assert sorted(numbers) == list(range(40))
        for batch in (numbers[i : i + 5] for i in range(0, 40, 5)):
            assert batch == list(range(batch[0], batch[0] + 5))  # each batch is contiguous

    def test_list_and_count(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(i) for i in range(5)])
        leased = store.lease_trials(study.id, "w", 2, 60, now=T0)
        store.finish_trial(leased[0].id, leased[0].lease_token or "", "complete", metrics={"t": 1})
        assert [t.number for t in store.list_trials(study.id, order="-number")] == [4, 3, 2, 1, 0]
        assert [t.number for t in store.list_trials(study.id, limit=2, offset=1)] == [1, 2]
        assert [t.number for t in store.list_trials(study.id, states=["waiting"])] == [2, 3, 4]
        assert [
            t.number for t in store.list_trials(study.id, states=[TrialState.RUNNING, "complete"])
        ] == [0, 1]
        assert store.list_trials(study.id, order="finished_at")[0].number == 0
        counts = store.count_trials(study.id)
        assert counts == {
            TrialState.WAITING: 3,
            TrialState.RUNNING: 1,
            TrialState.COMPLETE: 1,
            TrialState.INFEASIBLE: 0,
            TrialState.FAILED: 0,
            TrialState.PRUNED: 0,
        }
        with pytest.raises(InvalidInput):
            store.list_trials(study.id, order="params")
        with pytest.raises(InvalidInput):
            store.list_trials(study.id, states=["done"])

    def test_add_finished_trials(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        imported = store.add_finished_trials(
            study.id,
            [
                (params(0), "complete", {"tokens_per_s": 1000.0}),
                (params(1), TrialState.INFEASIBLE, None),
            ],
        )
        assert [(t.number, t.state, t.source) for t in imported] == [
            (0, TrialState.COMPLETE, "imported"),
            (1, TrialState.INFEASIBLE, "imported"),
        ]
        assert imported[0].metrics == {"tokens_per_s": 1000.0}
        assert imported[0].finished_at is not None
        assert event_pairs(store, imported[0].id) == [(None, "complete")]
        assert store.lease_trials(study.id, "w", 5, 60) == []
        with pytest.raises(InvalidInput, match="finished"):
            store.add_finished_trials(study.id, [(params(2), "waiting", None)])
        with pytest.raises(InvalidInput, match="metrics"):
            store.add_finished_trials(study.id, [(params(2), "complete", None)])

    def test_add_finished_trials_with_predictions_and_errors(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        done = store.add_finished_trials(
            study.id,
            [(params(0), "complete", {"gpu_hours": 2.0}), (params(1), "infeasible", None)],
            source="strategy",
            predicted=[{"value": 9.0}, None],
            errors=[None, "out of memory"],
        )
        assert [(t.predicted, t.error) for t in done] == [
            ({"value": 9.0}, None),
            (None, "out of memory"),
        ]
        assert store.study_counts(study.id).gpu_hours == 2.0  # not imported: it cost GPU time
        with pytest.raises(InvalidInput, match="one entry per record"):
            store.add_finished_trials(study.id, [(params(2), "complete", {})], predicted=[])
        with pytest.raises(InvalidInput, match="strings"):
            store.add_finished_trials(study.id, [(params(2), "failed", None)], errors=[3])  # type: ignore[list-item]

    def test_latest_proxy_version(self, store: Store) -> None:
        assert store.latest_proxy_version("llm") is None
        for _ in range(2):
            store.save_proxy_model("llm", {"format": "x"}, ["a"], {}, 1)
        store.save_proxy_model("dlrm", {"format": "x"}, ["a"], {}, 1)
        assert store.latest_proxy_version("llm") == 2
        assert store.latest_proxy_version("dlrm") == 1

    def test_set_predicted_changes_only_the_prediction(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        (trial,) = store.add_trials(study.id, [params(0)])
        (leased,) = store.lease_trials(study.id, "w", 1, 60, now=T0)
        done, _ = store.finish_trial(trial.id, leased.lease_token or "", "complete", metrics={})
        updated = store.set_predicted(trial.id, {"tokens_per_s": 10.0, "std": 1.0})
        assert updated.predicted == {"tokens_per_s": 10.0, "std": 1.0}
        assert dataclasses.replace(updated, predicted=None) == dataclasses.replace(
            done, predicted=None
        )
        with pytest.raises(NotFound):
            store.set_predicted(999, {})

    def test_history_for_kind(self, store: Store) -> None:
        a = store.create_study("a", {}, "llm")
        b = store.create_study("b", {}, "llm")
        c = store.create_study("c", {}, "dlrm")
        store.add_finished_trials(a.id, [(params(0), "complete", {"t": 1})])
        store.add_finished_trials(b.id, [(params(1), "infeasible", None)])
        store.add_trials(b.id, [params(2)])
        store.add_finished_trials(c.id, [(params(3), "complete", {"t": 3})])
        history = store.history_for_kind("llm")
        assert [(t.study_id, t.number) for t in history] == [(a.id, 0), (b.id, 0), (b.id, 1)]
        assert [t.study_id for t in store.history_for_kind("llm", exclude_study=a.id)] == [
            b.id,
            b.id,
        ]
        finished = store.history_for_kind("llm", states=["complete", "infeasible"])
        assert [t.params for t in finished] == [params(0), params(1)]
        assert store.history_for_kind("vision") == []

    def test_history_for_kind_reads_only_the_newest_when_limited(self, store: Store) -> None:
        a = store.create_study("a", {}, "llm")
        b = store.create_study("b", {}, "llm")
        store.add_finished_trials(a.id, [(params(i), "complete", {"t": i}) for i in range(3)])
        store.add_finished_trials(b.id, [(params(9), "complete", {"t": 9})])
        store.add_finished_trials(a.id, [(params(3), "infeasible", None)])
        newest = store.history_for_kind("llm", limit=3)  # the last three stored, in order
        assert [(t.study_id, t.number) for t in newest] == [(a.id, 2), (a.id, 3), (b.id, 0)]
        done = store.history_for_kind("llm", states=["complete"], limit=2)
        assert [t.params for t in done] == [params(2), params(9)]
        assert store.history_for_kind("llm", limit=0) == []
        assert len(store.history_for_kind("llm", limit=100)) == 5
        with pytest.raises(InvalidInput, match="limit"):
            store.history_for_kind("llm", limit=-1)


class TestLeases:
    def test_a_lease_with_nothing_to_hand_out_is_one_read(self, store: Store) -> None:
        """Nothing waiting, the study at its running cap, or not running, and the worker
        holding nothing: the lease answers from one statement (no lock, no write) with the
        study's counts; with a trial waiting or held it leases as ever."""
        from sqlalchemy import event

        study = store.create_study("a", {}, "llm")
        seen: list[str] = []

        def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if not statement.lstrip().upper().startswith("BEGIN"):  # SQLite begins by hand
                seen.append(statement)

        def lease(worker: str, cap: int | None = None) -> tuple[list[Trial], Any, int]:
            seen.clear()
            got, counts = store.lease(study.id, worker, 1, 60, max_running=cap)
            return got, counts, len(seen)

        event.listen(store._engine, "before_cursor_execute", record)
        try:
            got, counts, statements = lease("w1")
            assert got == [] and counts.waiting == 0 and statements == 1
            store.add_trials(study.id, [params(0), params(1)])
            (mine,), counts, statements = lease("w1", cap=1)
            assert counts.running == 1 and counts.waiting == 1 and statements > 1
            (again,), _, _ = lease("w1", cap=1)  # held trials come back, under the cap too
            assert again.id == mine.id
            got, counts, statements = lease("w2", cap=1)  # one waits, but the cap is reached
            assert got == [] and (counts.running, counts.waiting) == (1, 1) and statements == 1
            (theirs,), _, _ = lease("w2", cap=2)
            assert theirs.id != mine.id
            store.set_study_state(study.id, StudyState.PAUSED)
            got, counts, statements = lease("w3")
            assert got == [] and counts.state == StudyState.PAUSED and statements == 1
        finally:
            event.remove(store._engine, "before_cursor_execute", record)
        with pytest.raises(NotFound):
            store.lease(999, "w1", 1, 60)

    def test_a_lease_that_looked_before_a_change_still_keeps_the_cap_and_the_state(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The look before a lease reads without a lock; what changes between it and the
        lease (another lease reaching the cap, a pause) is caught by the counts' update,
        and the lease is made again on the locked row: no cap broken, no trial of a paused
        study handed out, every count still right."""
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(i) for i in range(3)])
        look = store._look_before_lease
        stale = look(study.id, "w2")  # running, nothing running, three waiting
        monkeypatch.setattr(store, "_look_before_lease", lambda sid, worker: stale)
        (first,), _ = store.lease(study.id, "w1", 1, 60, max_running=1)
        got, counts = store.lease(study.id, "w2", 2, 60, max_running=1)
        assert got == [] and (counts.running, counts.waiting) == (1, 2)
        got, counts = store.lease(study.id, "w2", 2, 60, max_running=2)  # room for one
        assert len(got) == 1 and (counts.running, counts.waiting) == (2, 1)
        store.set_study_state(study.id, StudyState.PAUSED)
        got, counts = store.lease(study.id, "w3", 1, 60)
        assert got == [] and counts.state == StudyState.PAUSED
        monkeypatch.setattr(store, "_look_before_lease", look)  # w1's own: it holds one
        (again,), _ = store.lease(study.id, "w1", 1, 60)  # a paused study hands back
        assert again.id == first.id
        assert store.study_counts(study.id).running == 2
        assert {t.state for t in store.list_trials(study.id)} == {
            TrialState.RUNNING,
            TrialState.WAITING,
        }

    def test_a_lease_on_postgresql_is_a_look_and_one_statement_that_commits(
        self, store: Store
    ) -> None:
        """Every lease and report of a study writes its row (the counts): in a transaction
        the row would stay locked across each round trip after the write, and the study's
        other workers would queue behind it. On PostgreSQL a lease that hands a trial out is
        a read and one statement run outside a transaction block (see
        cubic.store.one_statement)."""
        from sqlalchemy import event

        if store.engine.dialect.name != "postgresql":
            pytest.skip("SQLite's writer lock covers the whole database: no row lock to narrow")
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(0)])
        seen: list[tuple[str, Any]] = []

        def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            level = conn.get_execution_options().get("isolation_level")
            seen.append((" ".join(statement.split()).upper(), level))

        event.listen(store._engine, "before_cursor_execute", record)
        try:
            (trial,), counts = store.lease(study.id, "w1", 1, 60, max_running=4)
        finally:
            event.remove(store._engine, "before_cursor_execute", record)
        assert trial.state == TrialState.RUNNING and (counts.running, counts.waiting) == (1, 0)
        assert len(seen) == 2, seen
        (look, look_level), (lease, lease_level) = seen
        assert look.startswith("SELECT") and look_level == "AUTOCOMMIT"
        assert lease.startswith("WITH ") and lease_level == "AUTOCOMMIT"

    def test_lease_is_idempotent_per_worker(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        trials = store.add_trials(study.id, [params(i) for i in range(4)])
        (mine,) = store.lease_trials(study.id, "w1", 1, 60, now=T0)
        assert mine.id == trials[0].id
        assert mine.state is TrialState.RUNNING and mine.worker_id == "w1"
        assert mine.lease_token and len(mine.lease_token) == 32
        assert mine.lease_deadline == T0 + timedelta(seconds=60)
        assert mine.started_at == T0

        (again,) = store.lease_trials(study.id, "w1", 1, 60, now=T0 + timedelta(seconds=30))
        assert again.id == mine.id and again.lease_token == mine.lease_token
        assert again.lease_deadline == T0 + timedelta(seconds=90)

        (theirs,) = store.lease_trials(study.id, "w2", 1, 60, now=T0)
        assert theirs.id == trials[1].id

        both = store.lease_trials(study.id, "w1", 2, 60, now=T0)
        assert [t.id for t in both] == [trials[0].id, trials[2].id]
        assert both[0].lease_token == mine.lease_token
        # Asking for fewer than it holds still returns everything the worker holds.
        assert len(store.lease_trials(study.id, "w1", 0, 60, now=T0)) == 2
        assert event_pairs(store, mine.id) == [(None, "waiting"), ("waiting", "running")]

    def test_two_workers_never_overlap(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(i) for i in range(5)])
        first = store.lease_trials(study.id, "w1", 3, 60)
        second = store.lease_trials(study.id, "w2", 3, 60)
        assert [t.number for t in first] == [0, 1, 2]
        assert [t.number for t in second] == [3, 4]
        assert store.lease_trials(study.id, "w3", 3, 60) == []
        assert len({t.lease_token for t in first + second}) == 5

    def test_concurrent_leasing_never_double_leases(self, store: Store, db_url: str) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(i) for i in range(40)])

        def work(i: int) -> list[int]:
            got: list[int] = []
            with Store(db_url) as own:
                while batch := own.lease_trials(study.id, f"w{i}", 2, 60):
                    for trial in batch:
                        got.append(trial.id)
                        own.finish_trial(
                            trial.id, trial.lease_token or "", "complete", metrics={"w": i}
                        )
            return got

        leased = [tid for got in in_threads(8, work) for tid in got]
        assert len(leased) == 40 and len(set(leased)) == 40
        assert store.count_trials(study.id)[TrialState.COMPLETE] == 40
        for tid in leased[:5]:
            assert event_pairs(store, tid) == [
                (None, "waiting"),
                ("waiting", "running"),
                ("running", "complete"),
            ]

    def test_paused_study_leases_nothing_new(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(i) for i in range(3)])
        (held,) = store.lease_trials(study.id, "w1", 1, 60)
        store.set_study_state(study.id, "paused")
        assert [t.id for t in store.lease_trials(study.id, "w1", 3, 60)] == [held.id]
        assert store.lease_trials(study.id, "w2", 3, 60) == []
        store.set_study_state(study.id, "running")
        assert len(store.lease_trials(study.id, "w2", 3, 60)) == 2

    def test_heartbeat_extends_the_lease(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(0)])
        (trial,) = store.lease_trials(study.id, "w", 1, 60, now=T0)
        token = trial.lease_token or ""
        beat = store.heartbeat(trial.id, token, 120, now=T0 + timedelta(seconds=50))
        assert beat.lease_deadline == T0 + timedelta(seconds=170)
        assert beat.state is TrialState.RUNNING and beat.lease_token == token
        # The extended lease survives a reap that would have caught the original one.
        assert store.reap_expired(now=T0 + timedelta(seconds=100)) == []
        with pytest.raises(LeaseLost):
            store.heartbeat(trial.id, "0" * 32, 60)
        with pytest.raises(NotFound):
            store.heartbeat(999, token, 60)
        with pytest.raises(InvalidInput):
            store.heartbeat(trial.id, token, 0)
        with pytest.raises(InvalidInput, match="timezone"):
            store.heartbeat(trial.id, token, 60, now=datetime(2030, 1, 1))
        assert event_pairs(store, trial.id) == [(None, "waiting"), ("waiting", "running")]

    def test_release_returns_the_trial_to_the_queue(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(0)])
        (trial,) = store.lease_trials(study.id, "w1", 1, 60)
        released = store.release_trial(trial.id, trial.lease_token or "")
        assert released.state is TrialState.WAITING
        assert released.worker_id is None and released.lease_token is None
        (again,) = store.lease_trials(study.id, "w2", 1, 60)
        assert again.id == trial.id and again.lease_token != trial.lease_token
        # The first worker's token is stale now.
        for stale in (
            lambda: store.heartbeat(trial.id, trial.lease_token or "", 60),
            lambda: store.finish_trial(trial.id, trial.lease_token or "", "complete", metrics={}),
            lambda: store.release_trial(trial.id, trial.lease_token or ""),
        ):
            with pytest.raises(LeaseLost):
                stale()
        assert store.get_trial(trial.id).worker_id == "w2"
        assert event_pairs(store, trial.id) == [
            (None, "waiting"),
            ("waiting", "running"),
            ("running", "waiting"),
            ("waiting", "running"),
        ]


class TestFinishing:
    def _leased(self, store: Store, max_attempts: int = 3) -> Trial:
        study = store.create_study("a", {}, "llm", max_attempts=max_attempts)
        store.add_trials(study.id, [params(0)])
        (trial,) = store.lease_trials(study.id, "w", 1, 60, now=T0)
        return trial

    def test_finish_is_applied_once(self, store: Store) -> None:
        trial = self._leased(store)
        token = trial.lease_token or ""
        done, retry = store.finish_trial(
            trial.id,
            token,
            "complete",
            metrics={"tokens_per_s": 1234.5},
            log_tail="ok",
            now=T0 + timedelta(seconds=10),
        )
        assert retry is None
        assert done.state is TrialState.COMPLETE
        assert done.metrics == {"tokens_per_s": 1234.5}
        assert done.finished_at == T0 + timedelta(seconds=10)
        assert done.lease_deadline is None and done.worker_id == "w"
        events = store.trial_events(trial.id)
        assert events[-1].to_state is TrialState.COMPLETE and events[-1].worker_id == "w"

        repeat, repeat_retry = store.finish_trial(
            trial.id, token, "complete", metrics={"tokens_per_s": 1.0}, now=T0 + timedelta(hours=1)
        )
        assert repeat == done and repeat_retry is None
        assert store.get_trial(trial.id) == done
        assert store.trial_events(trial.id) == events

    def test_a_report_whose_lease_is_lost_while_it_is_checked_changes_nothing(
        self, store: Store
    ) -> None:
        """A report's checks run on the trial as read; should its lease expire meanwhile
        (reaped, its retry created), the report is refused and writes nothing."""
        if store.engine.dialect.name != "postgresql":
            pytest.skip("SQLite checks a report inside its write transaction: none comes between")
        trial = self._leased(store)
        counts = store.study_counts(trial.study_id)

        def check(t: Trial) -> None:
            assert t.id == trial.id and t.state == TrialState.RUNNING
            store.reap_expired(now=T0 + timedelta(hours=1))

        with pytest.raises(LeaseLost):
            store.finish_trial(
                trial.id, trial.lease_token or "", "complete", metrics={"t": 1.0}, check=check
            )
        reaped = store.get_trial(trial.id)
        assert reaped.state == TrialState.FAILED and reaped.metrics is None
        assert [e.to_state for e in store.trial_events(trial.id)][-1] == TrialState.FAILED
        after = store.study_counts(trial.study_id)
        assert (after.running, after.waiting) == (counts.running - 1, counts.waiting + 1)
        assert after.gpu_hours == counts.gpu_hours

    def test_a_report_without_metrics_stores_sql_null(self, store: Store) -> None:
        """Not JSON ``null``: a query for trials without metrics finds it on every path."""
        trial = self._leased(store)
        store.finish_trial(trial.id, trial.lease_token or "", "infeasible", error="oom")
        with store.engine.connect() as conn:
            found = conn.execute(
                text("SELECT metrics IS NULL, log_tail IS NULL FROM cubic_trial WHERE id = :i"),
                {"i": trial.id},
            ).one()
        assert tuple(found) == (True, True)

    def test_finished_trial_cannot_change(self, store: Store) -> None:
        trial = self._leased(store)
        token = trial.lease_token or ""
        done, _ = store.finish_trial(trial.id, token, "infeasible", error="CUDA out of memory")
        with pytest.raises(TrialFinished, match="infeasible"):
            store.finish_trial(trial.id, token, "complete", metrics={"t": 1})
        with pytest.raises(LeaseLost):
            store.finish_trial(trial.id, "f" * 32, "infeasible")
        with pytest.raises(LeaseLost):
            store.heartbeat(trial.id, token, 60)
        with pytest.raises(LeaseLost):
            store.release_trial(trial.id, token)
        assert store.get_trial(trial.id) == done
        assert store.lease_trials(trial.study_id, "w2", 1, 60) == []
        assert issubclass(TrialFinished, Conflict) and issubclass(LeaseLost, Conflict)

    def test_finish_needs_a_valid_report(self, store: Store) -> None:
        trial = self._leased(store)
        token = trial.lease_token or ""
        with pytest.raises(InvalidInput):
            store.finish_trial(trial.id, token, "running")
        with pytest.raises(InvalidInput, match="metrics"):
            store.finish_trial(trial.id, token, "complete")
        with pytest.raises(InvalidInput, match="JSON"):
            store.finish_trial(trial.id, token, "complete", metrics={"t": float("inf")})
        with pytest.raises(NotFound):
            store.finish_trial(999, token, "pruned")
        assert store.get_trial(trial.id).state is TrialState.RUNNING

    def test_waiting_trial_cannot_be_finished(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        (trial,) = store.add_trials(study.id, [params(0)])
        with pytest.raises(LeaseLost):
            store.finish_trial(trial.id, "", "complete", metrics={})

    def test_failed_trials_are_retried_up_to_the_cap(self, store: Store) -> None:
        trial = self._leased(store, max_attempts=3)
        study_id = trial.study_id
        chain = [trial]
        retries: list[Trial | None] = []
        for _ in range(3):
            (current,) = store.lease_trials(study_id, "w", 1, 60)
            assert current.id == chain[-1].id
            failed, retry = store.finish_trial(
                current.id, current.lease_token or "", "failed", error="NCCL timeout"
            )
            assert failed.state is TrialState.FAILED and failed.error == "NCCL timeout"
            retries.append(retry)
            if retry is not None:
                chain.append(retry)
        assert [t.attempt for t in chain] == [1, 2, 3]
        assert retries[2] is None
        for previous, retry in itertools.pairwise(chain):
            assert retry.retry_of == previous.id
            assert retry.source == "retry"
            assert retry.params == trial.params
            assert retry.number > previous.number
        assert store.lease_trials(study_id, "w", 1, 60) == []
        assert store.count_trials(study_id)[TrialState.FAILED] == 3
        assert len(store.list_trials(study_id)) == 3
        assert store.trial_events(chain[0].id)[-1].detail["retry_trial_id"] == chain[1].id
        assert event_pairs(store, chain[1].id)[0] == (None, "waiting")

    def test_repeated_failure_report_returns_the_same_retry(self, store: Store) -> None:
        trial = self._leased(store)
        token = trial.lease_token or ""
        first = store.finish_trial(trial.id, token, "failed", error="node lost")
        again = store.finish_trial(trial.id, token, "failed", error="node lost")
        assert first == again and first[1] is not None
        assert len(store.list_trials(trial.study_id)) == 2

    def test_infeasible_and_pruned_are_not_retried(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        store.add_trials(study.id, [params(0), params(1)])
        a, b = store.lease_trials(study.id, "w", 2, 60)
        assert store.finish_trial(a.id, a.lease_token or "", "infeasible")[1] is None
        assert store.finish_trial(b.id, b.lease_token or "", "pruned")[1] is None
        assert len(store.list_trials(study.id)) == 2


class TestReaping:
    def test_expired_leases_fail_and_retry(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm", max_attempts=2)
        store.add_trials(study.id, [params(0), params(1)])
        short, long_ = store.lease_trials(study.id, "w", 2, 60, now=T0)
        store.heartbeat(long_.id, long_.lease_token or "", 600, now=T0)

        assert store.reap_expired(now=T0 + timedelta(seconds=59)) == []
        (reaped,) = store.reap_expired(now=T0 + timedelta(seconds=61))
        assert reaped.id == short.id
        assert reaped.state is TrialState.FAILED and reaped.error == LEASE_EXPIRED
        assert reaped.lease_token is None and reaped.worker_id == "w"
        assert store.get_trial(long_.id).state is TrialState.RUNNING

        (retry,) = store.list_trials(study.id, states=["waiting"])
        assert (retry.retry_of, retry.attempt, retry.params) == (short.id, 2, short.params)
        assert event_pairs(store, short.id)[-1] == ("running", "failed")
        assert store.trial_events(short.id)[-1].detail["reason"] == LEASE_EXPIRED

        with pytest.raises(LeaseLost):
            store.finish_trial(short.id, short.lease_token or "", "complete", metrics={"t": 1})
        with pytest.raises(LeaseLost):
            store.finish_trial(short.id, short.lease_token or "", "failed")
        with pytest.raises(LeaseLost):
            store.heartbeat(short.id, short.lease_token or "", 60)
        assert store.reap_expired(now=T0 + timedelta(seconds=61)) == []

        # The retry is the last attempt: when it expires too, nothing more is created.
        (last,) = store.lease_trials(study.id, "w2", 1, 60, now=T0 + timedelta(seconds=62))
        assert last.id == retry.id
        reaped = store.reap_expired(now=T0 + timedelta(hours=1))
        assert {t.id for t in reaped} == {retry.id, long_.id}
        assert store.count_trials(study.id)[TrialState.FAILED] == 3
        assert store.count_trials(study.id)[TrialState.WAITING] == 1  # long_'s retry

    def test_concurrent_reapers_reap_each_trial_once(self, store: Store, db_url: str) -> None:
        studies = [store.create_study(f"s{i}", {}, "llm") for i in range(3)]
        for study in studies:
            store.add_trials(study.id, [params(i) for i in range(6)])
            store.lease_trials(study.id, "w", 6, 60, now=T0)

        def reap(_: int) -> list[int]:
            with Store(db_url) as own:
                return [t.id for t in own.reap_expired(now=T0 + timedelta(minutes=5))]

        reaped = [tid for ids in in_threads(4, reap) for tid in ids]
        assert len(reaped) == 18 and len(set(reaped)) == 18
        for study in studies:
            counts = store.count_trials(study.id)
            assert counts[TrialState.FAILED] == 6 and counts[TrialState.WAITING] == 6
            numbers = [t.number for t in store.list_trials(study.id)]
            assert numbers == list(range(12))


def recounted(store: Store, study_id: int) -> tuple[int, int, int, float]:
    """The counts the store keeps, recomputed from the study's trials."""
    trials = store.list_trials(study_id)
    own = [t for t in trials if t.source != "imported"]
    hours = sum(
        float(v)
        for t in own
        for v in [(t.metrics or {}).get("gpu_hours")]
        if isinstance(v, int | float) and v > 0
    )
    return (
        sum(1 for t in own if t.attempt == 1),
        sum(1 for t in trials if t.state is TrialState.WAITING),
        sum(1 for t in trials if t.state is TrialState.RUNNING),
        hours,
    )


def kept(store: Store, study_id: int) -> tuple[int, int, int, float]:
    c = store.study_counts(study_id)
    assert c.active == c.waiting + c.running
    return (c.proposed, c.waiting, c.running, c.gpu_hours)


class TestCounts:
    """The counts a lease and a report decide with are kept with each state change."""

    def test_every_transition_keeps_the_counts(self, store: Store) -> None:
        import random

        rnd = random.Random(0)
        a = store.create_study("a", {}, "llm", max_attempts=2)
        b = store.create_study("b", {}, "llm", max_attempts=3)
        now = T0
        for step in range(120):
            sid = rnd.choice((a.id, b.id))
            op = rnd.choice(("add", "lease", "finish", "fail", "release", "reap", "import"))
            now += timedelta(seconds=7)
            running = store.list_trials(sid, states=["running"])
            if op == "add":
                store.add_trials(sid, [params(step), params(step + 1)], source="strategy")
            elif op == "lease":
                store.lease_trials(sid, f"w{rnd.randrange(3)}", rnd.randrange(1, 4), 20, now=now)
            elif op in ("finish", "fail") and running:
                t = rnd.choice(running)
                if op == "finish":
                    metrics = {"tokens_per_s": 1.0, "gpu_hours": rnd.choice((0.5, 2, None))}
                    store.finish_trial(t.id, t.lease_token or "", "complete", metrics=metrics)
                else:
                    store.finish_trial(t.id, t.lease_token or "", "failed", now=now)
            elif op == "release" and running:
                t = rnd.choice(running)
                store.release_trial(t.id, t.lease_token or "")
            elif op == "reap":
                store.reap_expired(now=now)
            elif op == "import":
                store.add_finished_trials(sid, [(params(step), "complete", {"gpu_hours": 9.0})])
            for study_id in (a.id, b.id):
                assert kept(store, study_id) == pytest.approx(recounted(store, study_id)), op
        assert kept(store, a.id)[0] > 0 and kept(store, b.id)[0] > 0

    def test_concurrent_leases_and_reports_keep_the_counts(self, store: Store, db_url: str) -> None:
        study = store.create_study("a", {}, "llm", max_attempts=2)
        store.add_trials(study.id, [params(i) for i in range(60)])

        def work(i: int) -> None:
            with Store(db_url) as own:
                while batch := own.lease_trials(study.id, f"w{i}", 2, 60):
                    for k, trial in enumerate(batch):
                        state = "failed" if (trial.id + k) % 5 == 0 else "complete"
                        metrics = {"gpu_hours": 0.25} if state == "complete" else None
                        own.finish_trial(trial.id, trial.lease_token or "", state, metrics=metrics)

        in_threads(8, work)
        assert kept(store, study.id) == pytest.approx(recounted(store, study.id))
        assert kept(store, study.id)[1:3] == (0, 0)

    def test_a_reader_gets_only_the_trials_that_changed(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        other = store.create_study("b", {}, "llm")
        assert store.last_event_id(study.id) == 0
        assert store.trials_changed(study.id, 0) == ([], 0)
        first = store.add_trials(study.id, [params(i) for i in range(4)])
        store.add_trials(other.id, [params(0)])
        changed, mark = store.trials_changed(study.id, 0)
        assert [t.id for t in changed] == [t.id for t in first]
        assert mark == store.last_event_id(study.id)
        (leased,) = store.lease_trials(study.id, "w", 1, 60)
        store.lease_trials(other.id, "w", 1, 60)
        changed, mark2 = store.trials_changed(study.id, mark)
        assert [(t.id, t.state) for t in changed] == [(leased.id, TrialState.RUNNING)]
        assert mark2 > mark
        assert store.trials_changed(study.id, mark2) == ([], mark2)


class TestEvents:
    def test_every_transition_is_recorded_in_order(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        (trial,) = store.add_trials(study.id, [params(0)])
        (leased,) = store.lease_trials(study.id, "w1", 1, 60, now=T0)
        store.release_trial(trial.id, leased.lease_token or "")
        (leased,) = store.lease_trials(study.id, "w2", 1, 60, now=T0 + timedelta(seconds=5))
        store.heartbeat(trial.id, leased.lease_token or "", 60)
        store.finish_trial(
            trial.id, leased.lease_token or "", "pruned", now=T0 + timedelta(seconds=9)
        )
        events = store.trial_events(trial.id)
        assert [(e.from_state, e.to_state, e.worker_id) for e in events] == [
            (None, TrialState.WAITING, None),
            (TrialState.WAITING, TrialState.RUNNING, "w1"),
            (TrialState.RUNNING, TrialState.WAITING, "w1"),
            (TrialState.WAITING, TrialState.RUNNING, "w2"),
            (TrialState.RUNNING, TrialState.PRUNED, "w2"),
        ]
        assert events[-1].at == T0 + timedelta(seconds=9)
        assert all(e.trial_id == trial.id for e in events)
        assert [e.id for e in events] == sorted(e.id for e in events)
        with pytest.raises(NotFound):
            store.trial_events(999)


class TestProxyModels:
    def test_versions_increment_per_kind(self, store: Store) -> None:
        assert store.latest_proxy_model("llm") is None
        booster = {"learner": {"trees": [[0, 1, 2]]}, "version": [2, 1, 0]}
        v1 = store.save_proxy_model("llm", booster, ["tp", "pp"], {"mape": 0.2}, n_train=10)
        v2 = store.save_proxy_model("llm", {"b": 2}, ["tp"], {"mape": 0.1}, n_train=20)
        d1 = store.save_proxy_model("dlrm", {"b": 3}, ["tables"], {}, n_train=5)
        assert (v1.version, v2.version, d1.version) == (1, 2, 1)
        latest = store.latest_proxy_model("llm")
        assert latest == v2
        assert store.get_proxy_model("llm", 1).model == booster
        assert store.get_proxy_model("llm", 1).features == ["tp", "pp"]
        assert [m.version for m in store.list_proxy_models("llm")] == [1, 2]
        assert store.list_proxy_models("vision") == []
        with pytest.raises(NotFound):
            store.get_proxy_model("llm", 3)
        with pytest.raises(InvalidInput):
            store.save_proxy_model("llm", {}, "tp", {}, n_train=1)

    def test_concurrent_saves_get_distinct_versions(self, store: Store, db_url: str) -> None:
        def save(i: int) -> int:
            with Store(db_url) as own:
                return own.save_proxy_model("llm", {"i": i}, ["x"], {}, n_train=i).version

        assert sorted(in_threads(6, save)) == [1, 2, 3, 4, 5, 6]


class TestStudyLock:
    def test_lock_serialises_holders_across_stores(self, store: Store, db_url: str) -> None:
        study = store.create_study("a", {}, "llm")
        other = store.create_study("b", {}, "llm")
        inside = 0
        overlaps: list[int] = []
        guard = threading.Lock()

        def hold(_: int) -> None:
            nonlocal inside
            with Store(db_url) as own, own.study_lock(study.id):
                with guard:
                    inside += 1
                    overlaps.append(inside)
                time.sleep(0.05)
                with guard:
                    inside -= 1

        in_threads(4, hold)
        assert overlaps == [1, 1, 1, 1]

        # Another study's lock is independent.
        acquired = threading.Event()

        def other_study() -> None:
            with Store(db_url) as own, own.study_lock(other.id):
                acquired.set()

        with store.study_lock(study.id):
            thread = threading.Thread(target=other_study)
            thread.start()
            assert acquired.wait(5)
            thread.join()
        with pytest.raises(NotFound), store.study_lock(999):
            pass

    def test_lock_is_shared_with_other_processes(self, store: Store, db_url: str) -> None:
        """Another process (the service's background one) holding a study's lock keeps
        this one out until it lets go; a kind's proxy-fit lock likewise."""
        study = store.create_study("a", {}, "llm")
        other = store.create_study("b", {}, "llm")
        holder = textwrap.dedent(
            f"""
            import sys
            from cubic.store import Store
            with Store({db_url!r}) as s, s.try_study_lock({study.id}) as a:
                with s.try_proxy_fit_lock("llm") as b:
                    print(a and b, flush=True)
                    sys.stdin.readline()
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "True"
            with store.try_study_lock(study.id) as held:
                assert not held
            with store.try_proxy_fit_lock("llm") as held:
                assert not held
            with store.try_study_lock(other.id) as held, store.try_proxy_fit_lock("dlrm") as b:
                assert held and b  # other keys are free
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(60) == 0
        finally:
            proc.kill()
            proc.wait()
        with store.try_study_lock(study.id) as held, store.try_proxy_fit_lock("llm") as b:
            assert held and b

    @pytest.mark.postgres
    @pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
    def test_another_schema_of_the_database_has_locks_of_its_own(
        self, store: Store, db_url: str
    ) -> None:
        """PostgreSQL's advisory locks are per database: a deployment (or a test run) in
        another schema, whose study has the same id, does not share this one's locks."""
        study = store.create_study("a", {}, "llm")
        with (
            temporary_schema(os.environ[PG_ENV], prefix="cubic_test") as url,
            Store.create(url) as elsewhere,
        ):
            twin = elsewhere.create_study("b", {}, "llm")
            assert twin.id == study.id  # the same lock key in each schema
            with store.try_study_lock(study.id) as a, store.try_proxy_fit_lock("llm") as b:
                assert a and b
                with (
                    elsewhere.try_study_lock(twin.id) as c,
                    elsewhere.try_proxy_fit_lock("llm") as d,
                ):
                    assert c and d
                with Store(db_url) as same, same.try_study_lock(study.id) as e:
                    assert not e  # within one schema the lock is still shared

    def test_a_study_has_one_proposer_until_it_lets_go_or_its_connection_goes(
        self, store: Store, db_url: str
    ) -> None:
        """Of two processes' claims on PostgreSQL one proposes for a study, across rounds,
        until it gives the study up (no longer running) or its session ends; on SQLite (one
        proposing process) every claim is granted."""
        a_study = store.create_study("a", {}, "llm")
        b_study = store.create_study("b", {}, "llm")
        with Store(db_url) as other_process:
            mine, theirs = store.claims(), other_process.claims()
            mine.retry_s = theirs.retry_s = 0.0  # each try asks (the back-off: below)
            try:
                assert mine.claim(a_study.id) and mine.claim(a_study.id)  # kept, not re-taken
                if not db_url.startswith("postgresql"):
                    assert theirs.claim(a_study.id)
                    return
                assert not theirs.claim(a_study.id)
                assert theirs.claim(b_study.id) and not mine.claim(b_study.id)
                mine.keep_only({b_study.id})  # a is no longer running: given up
                assert mine.held == set() and theirs.claim(a_study.id)
                theirs.close()  # the process ends: its studies are free
                assert mine.claim(a_study.id) and mine.claim(b_study.id)
                assert mine._conn is not None
                pid = mine._conn.execute(text("SELECT pg_backend_pid()")).scalar()
                mine._conn.commit()
                with other_process._engine.connect() as conn:  # the session is lost ...
                    conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                with pytest.raises(StorageError):  # ... and its claims with it
                    mine.claim(999)
                assert mine.held == set()
                assert theirs.claim(a_study.id)  # ... on the server too
                assert mine.claim(b_study.id)  # and it claims again on a new session
            finally:
                mine.close()
                theirs.close()

    def test_a_study_held_elsewhere_is_tried_again_only_after_a_while(
        self, store: Store, db_url: str
    ) -> None:
        """A process that found a study held by another leaves it alone for ``retry_s``,
        without a statement, then takes it if it is free."""
        from sqlalchemy import event

        if not db_url.startswith("postgresql"):
            pytest.skip("SQLite grants every claim: nothing is held elsewhere")
        study = store.create_study("a", {}, "llm")
        with Store(db_url) as other_process:
            mine, theirs = store.claims(), other_process.claims()
            try:
                assert mine.claim(study.id) and not theirs.claim(study.id)
                mine.close()  # free now, but the other process does not look yet
                seen: list[str] = []

                def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
                    seen.append(statement)

                event.listen(other_process._engine, "before_cursor_execute", record)
                try:
                    assert not theirs.claim(study.id)
                finally:
                    event.remove(other_process._engine, "before_cursor_execute", record)
                assert seen == []
                theirs._elsewhere[study.id] -= theirs.retry_s  # as if a while had passed
                assert theirs.claim(study.id) and theirs.held == {study.id}
                theirs.keep_only(set())  # no longer running: nothing remembered of it
                assert theirs._elsewhere == {} and theirs.held == set()
            finally:
                mine.close()
                theirs.close()

    def test_lock_is_released_after_an_error(self, store: Store) -> None:
        study = store.create_study("a", {}, "llm")
        with pytest.raises(RuntimeError), store.study_lock(study.id):
            raise RuntimeError("proposal failed")
        with store.study_lock(study.id):
            pass


def test_counter_of_sources_and_states(store: Store) -> None:
    """Numbers stay dense and sources are recorded across mixed creation paths."""
    study = store.create_study("a", {}, "llm", max_attempts=2)
    store.add_trials(study.id, [params(0)], source="baseline")
    store.add_finished_trials(study.id, [(params(1), "complete", {"t": 2})])
    (trial,) = store.lease_trials(study.id, "w", 1, 60)
    store.finish_trial(trial.id, trial.lease_token or "", "failed")
    trials = store.list_trials(study.id)
    assert [t.number for t in trials] == [0, 1, 2]
    assert Counter(t.source for t in trials) == {"baseline": 1, "imported": 1, "retry": 1}


def test_a_worker_binding_is_kept_once_read(store: Store, db_url: str) -> None:
    """A worker id belongs to the first token that used it, for good: a store answers
    later lookups from memory (a lease and a report each ask), and another store (another
    API process) reads the same binding from the database."""
    from sqlalchemy import event

    a, _ = store.create_token("a", "worker")
    b, _ = store.create_token("b", "worker")
    assert store.worker_token("w-1") is None
    assert store.bind_worker("w-1", a.id) == a.id
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(store._engine, "before_cursor_execute", record)
    try:
        assert store.bind_worker("w-1", b.id) == a.id  # taken: b may not act as w-1
        assert store.worker_token("w-1") == a.id
    finally:
        event.remove(store._engine, "before_cursor_execute", record)
    assert seen == []
    with Store(db_url) as other:
        assert other.bind_worker("w-1", b.id) == a.id
        assert other.worker_token("w-2") is None


def test_a_token_is_read_again_only_after_a_while(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every authenticated request looks its token up: a store trusts what it read for
    ``TOKEN_CACHE_S``; a revocation reaches the revoking store at once and another store
    (another API process) once that time is up."""
    from sqlalchemy import event

    from cubic.store import repository

    tok, secret = store.create_token("w", "worker")
    first = store.token_for(secret)
    assert first is not None and first.id == tok.id
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(store._engine, "before_cursor_execute", record)
    try:
        again = store.token_for(secret)
    finally:
        event.remove(store._engine, "before_cursor_execute", record)
    assert again is not None and again.id == tok.id and seen == []
    assert store.token_for("not-a-token") is None
    with Store(db_url) as other:
        cached = other.token_for(secret)
        assert cached is not None and cached.revoked_at is None
        store.revoke_token(tok.id)
        revoked = store.token_for(secret)
        assert revoked is not None and revoked.revoked_at is not None
        monkeypatch.setattr(repository, "TOKEN_CACHE_S", 0.0)
        later = other.token_for(secret)
        assert later is not None and later.revoked_at is not None

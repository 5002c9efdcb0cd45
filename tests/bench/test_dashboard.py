"""The dashboard benchmark's store: a finished study written straight through the store."""

from __future__ import annotations

from pathlib import Path

from cubic.bench.dashboard import fill_store
from cubic.store import Store, TrialState


def test_fill_store_writes_a_finished_study_and_a_proxy_model(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    sid = fill_store(db, trials=300)
    with Store.create(db) as store:
        study = store.get_study(sid)
        assert study.state == "completed"
        counts = store.count_trials(sid)
        assert sum(counts.values()) == 300 and counts[TrialState.COMPLETE] > 100
        assert counts[TrialState.WAITING] == counts[TrialState.RUNNING] == 0
        trials = store.list_trials(sid)
        assert all(t.error for t in trials if t.state == TrialState.INFEASIBLE)
        assert any(t.predicted for t in trials if t.state == TrialState.COMPLETE)
        assert store.latest_proxy_version(study.workload_kind) == 1
        assert store.study_counts(sid).gpu_hours > 0

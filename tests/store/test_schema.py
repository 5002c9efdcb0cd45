"""Migrations: explicit, idempotent, matching the ORM models, and enforced at start-up."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from cubic.errors import SchemaOutOfDate, StorageError
from cubic.store import Store, check_schema, current_revision, downgrade, head_revision, upgrade
from cubic.store.engine import make_engine
from cubic.store.models import Base
from cubic.store.schema import MIGRATIONS_DIR, VERSION_TABLE

CUBIC_TABLES = {
    "cubic_study",
    "cubic_trial",
    "cubic_trial_event",
    "cubic_proxy_model",
    "cubic_api_token",
    "cubic_worker_identity",
}


def test_head_revision_is_the_initial_migration() -> None:
    assert head_revision() == "0003"
    assert (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert (MIGRATIONS_DIR / "env.py").is_file()


def test_upgrade_reaches_head_and_matches_models(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) is None
        upgrade(db_url)
        upgrade(db_url)  # a second run is a no-op
        assert current_revision(engine) == head_revision()
        check_schema(engine)
        tables = set(inspect(engine).get_table_names())
        assert CUBIC_TABLES | {VERSION_TABLE} <= tables
        assert "alembic_version" not in tables
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_empty_database_is_refused(db_url: str) -> None:
    with pytest.raises(SchemaOutOfDate, match="run `cubic db upgrade`") as info:
        Store(db_url)
    assert "cubic needs 0003" in str(info.value)
    assert info.value.status_code == 503


def test_downgraded_database_is_refused(db_url: str) -> None:
    Store.create(db_url).close()
    downgrade(db_url, "base")
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) is None
        assert not CUBIC_TABLES & set(inspect(engine).get_table_names())
        with pytest.raises(SchemaOutOfDate, match="cubic db upgrade"):
            check_schema(engine)
    finally:
        engine.dispose()
    with pytest.raises(SchemaOutOfDate, match="cubic db upgrade"):
        Store(db_url)


def test_unknown_revision_is_refused(db_url: str) -> None:
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '0000'")
        with pytest.raises(SchemaOutOfDate, match="schema is at 0000, cubic needs 0003"):
            Store(engine)
    finally:
        engine.dispose()


def test_sql_failures_are_wrapped(db_url: str) -> None:
    with Store(db_url, check_schema=False) as store:
        with pytest.raises(StorageError) as info:
            store.get_study(1)
        assert info.value.status_code == 503
        assert info.value.__cause__ is not None


def test_upgrade_counts_the_trials_of_existing_studies(db_url: str) -> None:
    """0003 adds the per-study counts: studies stored before it are counted from their trials."""
    from tests.store.test_store_contract import kept, params, recounted

    with Store.create(db_url) as store:
        study = store.create_study("a", {}, "llm", max_attempts=2)
        store.add_trials(study.id, [params(i) for i in range(5)])
        a, b, _ = store.lease_trials(study.id, "w", 3, 60)
        store.finish_trial(a.id, a.lease_token or "", "complete", metrics={"gpu_hours": 1.5})
        store.finish_trial(b.id, b.lease_token or "", "failed")
        store.add_finished_trials(study.id, [(params(9), "complete", {"gpu_hours": 4.0})])
        expected = recounted(store, study.id)
    downgrade(db_url, "0002")
    upgrade(db_url)
    with Store(db_url) as store:
        assert kept(store, study.id) == pytest.approx(expected)
        assert expected == (5, 3, 1, 1.5)
        changed, _ = store.trials_changed(study.id, 0)
        assert len(changed) == 7  # the old events belong to their study too (retry, import)

"""Database fixtures: SQLite always, PostgreSQL when ``CUBIC_TEST_DATABASE_URL`` is set.

A pytest plugin (``pytest_plugins`` in ``tests/conftest.py``) so every test folder can use
``db_url`` and ``store``; it is not named ``conftest`` because a conftest module listed in
``pytest_plugins`` would be registered twice.

Each test gets a database of its own: a temporary SQLite file, or a fresh PostgreSQL schema
(selected through ``search_path``) that is dropped afterwards, so runs never see each
other's rows, even when several run against the same server at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cubic.store import Store
from cubic.store.engine import temporary_schema
from tests.requirements import need

PG_ENV = "CUBIC_TEST_DATABASE_URL"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh, empty (not migrated) database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cubic.db'}"
        return
    base = os.environ.get(PG_ENV)
    need("postgres", bool(base), f"{PG_ENV} not set: PostgreSQL contract tests skipped")
    assert base is not None
    with temporary_schema(base, prefix="cubic_test") as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A store over a freshly migrated database."""
    with Store.create(db_url) as opened:
        yield opened

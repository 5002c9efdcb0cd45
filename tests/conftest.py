"""Fixtures shared by every test folder: a store over SQLite, and over PostgreSQL when set;
a real API server for the tests of workers and runners."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest_plugins = ["tests.store.backends"]


@pytest.fixture(autouse=True, scope="session")
def _private_outbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers of the tests keep unreported outcomes under the test run's folder, never in
    the user's own outbox (:mod:`cubic.outbox`)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUBIC_OUTBOX", str(tmp_path_factory.mktemp("outbox")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a real uvicorn serving cubic on a fresh SQLite file, one per module."""
    from cubic.bench.service import api_server
    from cubic.store.schema import upgrade

    db = f"sqlite:///{tmp_path_factory.mktemp('api') / 'cubic.db'}"
    upgrade(db)
    with api_server(db, 1) as base:
        yield base

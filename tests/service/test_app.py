"""Health and readiness of the API over a real SQLite database."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from cubic.config import Settings
from cubic.store.schema import upgrade
from service.app import create_app


def test_ready_only_with_a_current_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    with TestClient(create_app(Settings(database_url=url))) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}


def test_app_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    app = create_app(Settings(database_url=url))
    try:
        with TestClient(app):
            raise AssertionError("the app started on a database without a schema")
    except Exception as exc:
        assert "cubic db upgrade" in str(exc)

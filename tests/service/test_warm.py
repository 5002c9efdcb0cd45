"""An API process warms up before it serves, and each worker call makes one thread hop."""

from __future__ import annotations

import gc
import logging
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from cubic.store.models import StudyRow, TrialEventRow, TrialRow
from service import warm
from service.app import create_app
from service.metrics import LEASE_LATENCY, REPORT_LATENCY
from tests.service.conftest import create, lease_answer, service_settings, simulate


def _count(metric: Any) -> float:
    return next(s.value for m in metric.collect() for s in m.samples if s.name.endswith("_count"))


def test_an_api_process_is_warm_before_it_serves(migrated_url: str) -> None:
    gc.unfreeze()
    counted = _count(LEASE_LATENCY), _count(REPORT_LATENCY)
    settings = service_settings(migrated_url, db_pool_size=8)
    with TestClient(create_app(settings)) as client:
        store = client.app.state.store  # type: ignore[attr-defined]
        # the pool holds the connections the first burst of requests will use (some may be
        # in the background proposer's hands now)
        pool = store.engine.pool
        assert pool.checkedin() + pool.checkedout() >= 8
        # what start-up made is out of the garbage collector's full collections
        assert gc.get_freeze_count() > 0
        # the warm-up's calls wrote nothing and counted nothing
        with store.engine.connect() as conn:
            for table in (StudyRow, TrialRow, TrialEventRow):
                assert conn.scalar(select(func.count()).select_from(table)) == 0
        assert (_count(LEASE_LATENCY), _count(REPORT_LATENCY)) == counted
    # once the app has stopped, what it held is collectable again
    assert gc.get_freeze_count() == 0


def test_an_api_process_whose_warm_up_fails_serves_cold(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_: Any) -> None:
        raise RuntimeError("no connection for the warm-up")

    monkeypatch.setattr(warm, "open_connections", refuse)
    app = create_app(service_settings(migrated_url))
    with caplog.at_level(logging.WARNING, logger="cubic.service"), TestClient(app) as client:
        study = create(client)
        assert lease_answer(client, study["id"], "w", 1)["trials"]
    assert "warming the API process failed" in caplog.text


@pytest.mark.parametrize("auth", [False, True])
def test_a_worker_call_makes_one_thread_hop(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch, auth: bool
) -> None:
    """A plain ``def`` handler costs FastAPI a hop for the handler and another for its
    answer's validation, and a plain ``def`` dependency one more each: on a loaded machine
    every hop is a wait for the event loop and a thread to be scheduled again."""
    settings = service_settings(migrated_url, auth=auth, reap_interval_s=3600)  # no reaper's hops
    with TestClient(create_app(settings)) as client:
        if auth:
            store = client.app.state.store  # type: ignore[attr-defined]
            secret = store.create_token("ops", "admin")[1]
            client.headers["Authorization"] = f"Bearer {secret}"
        study = create(client)
        t = lease_answer(client, study["id"], "w", 1)["trials"][0]
        hops: list[str] = []
        real = anyio.to_thread.run_sync

        async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
            hops.append(getattr(fn, "__name__", repr(fn)))
            return await real(fn, *args, **kwargs)

        monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
        lookups = 1 if auth else 0  # the token's lookup reads the database
        resp = client.post(
            f"/v1/studies/{study['id']}/trials:lease", json={"worker_id": "v", "count": 1}
        )
        assert resp.status_code == 200, resp.text
        assert len(hops) == 1 + lookups, hops
        hops.clear()
        body = {"lease_token": t["lease_token"], **simulate(study, t["params"])}
        resp = client.post(f"/v1/trials/{t['id']}:report", json=body)
        assert resp.status_code == 200, resp.text
        assert len(hops) == 1 + lookups, hops

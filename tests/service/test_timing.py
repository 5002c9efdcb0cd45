"""The ``Server-Timing`` header: the service's own share of each call's time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.timing import ServerTiming, app_ms
from tests.service.conftest import create


async def _slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await asyncio.sleep(0.2)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"server-timing", b"stale;dur=1")],
        }
    )
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_header_counts_the_time_the_app_held_the_request() -> None:
    """An app that takes 200 ms before it answers is timed at 200 ms or more, in one header
    of ours (one the app set itself is replaced, not repeated)."""
    resp = TestClient(ServerTiming(_slow)).get("/")  # no lifespan: the app has none
    headers = resp.headers.get_list("server-timing")
    assert len(headers) == 1, headers
    ms = app_ms(headers[0])
    assert ms is not None and ms >= 200, headers


def test_every_answer_of_the_service_carries_it(client: TestClient) -> None:
    """Leases, reports, errors and refused bodies alike: a client can always tell the
    service's share of a slow call."""
    study = create(client)
    lease = client.post(
        f"/v1/studies/{study['id']}/trials:lease", json={"worker_id": "w", "count": 1}
    )
    missing = client.get("/v1/studies/999999")
    too_big = client.post("/v1/studies", content=b"x" * (64 << 20))
    for resp, status in ((lease, 200), (missing, 404), (too_big, 413)):
        assert resp.status_code == status, resp.text
        ms = app_ms(resp.headers.get("server-timing"))
        assert ms is not None and ms >= 0, (status, resp.headers)


@pytest.mark.parametrize(
    ("header", "ms"),
    [
        ("app;dur=12.5", 12.5),
        ('db;dur=3, app;desc="cubic";dur="7"', 7.0),
        ("app", None),
        ("app;dur=soon", None),
        ("db;dur=3", None),
        (None, None),
    ],
)
def test_the_app_duration_is_read_from_a_header(header: str | None, ms: float | None) -> None:
    assert app_ms(header) == ms

"""The service benchmark's measurements of a real API server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cubic.bench.service import api_rss_mib, api_server, bench_service
from cubic.store.schema import upgrade


@pytest.mark.parametrize("workers", [1, 2])
def test_rss_is_read_for_each_api_process_and_its_background_process(
    tmp_path: Path, workers: int
) -> None:
    """Each API process starts one background process (proposing and fitting) beside it:
    the benchmark reports both, so that memory held off the request path is seen too."""
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    with api_server(db, workers, {"CUBIC_BACKGROUND": "process"}) as url:
        api = api_rss_mib(url)
        # Each starts its background process once serving; that one then imports cubic.
        deadline = time.monotonic() + 120
        while True:
            background = api_rss_mib(url, background=True)
            if len(background) == workers and all(m > 30 for m in background):
                break
            assert time.monotonic() < deadline, background
            time.sleep(0.5)
    assert len(api) == workers and all(m > 30 for m in api), api
    assert api_rss_mib("http://127.0.0.1:1") == []


PG = os.environ.get("CUBIC_TEST_DATABASE_URL")


@pytest.mark.skipif(not PG, reason="CUBIC_TEST_DATABASE_URL not set: needs PostgreSQL")
@pytest.mark.xdist_group("many-processes")
def test_jobs_that_take_time_hold_their_workers_in_both_systems() -> None:
    """With ``job_s`` each trial holds its worker that long in cubic and in the Optuna
    reference alike: neither can finish more than ``workers / job_s`` trials a second (one
    here; with instant jobs either runs several a second even on a loaded machine). Both
    systems' clients run ``client_nice`` levels below the servers."""
    job_s, workers = 2.0, 2
    base = os.nice(0)
    res = bench_service(
        PG, trials=8, workers=workers, api_workers=1, strategy="random", job_s=job_s, client_nice=3
    )
    assert res["settings"]["job_s"] == job_s
    inv = res["invariants"]
    assert inv["study_state"] == "completed" and inv["lost_reports"] == []
    for system in ("cubic", "optuna"):
        r = res[system]
        assert r["trials"] >= 8, r
        assert 0 < r["trials_per_s"] <= workers / job_s, r
        assert r["client_nice"] == [min(19, base + 3)], r
    # The service's own time of each call (Server-Timing) is part of the worker's.
    c = res["cubic"]
    for kind in ("lease", "report"):
        for q in (50, 95, 99):
            assert 0 <= c[f"{kind}_server_p{q}_ms"] <= c[f"{kind}_p{q}_ms"], c

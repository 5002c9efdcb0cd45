"""64 worker processes against ``uvicorn --workers 4`` on PostgreSQL, 500 simulated trials.

What users rely on when they scale out: every trial is leased exactly once per attempt, no
report is lost, and the study completes.
"""

from __future__ import annotations

import os

import pytest

from cubic.bench.service import bench_service

PG = os.environ.get("CUBIC_TEST_DATABASE_URL")

pytestmark = [
    pytest.mark.skipif(
        not PG, reason="CUBIC_TEST_DATABASE_URL not set: the PostgreSQL scale test is skipped"
    ),
    # About 50 connections to the shared server (which allows 100 by default) and 64
    # processes: not beside the other tests that open tens of either.
    pytest.mark.xdist_group("many-processes"),
]


def test_64_workers_4_api_processes_500_trials() -> None:
    res = bench_service(PG, trials=500, workers=64, api_workers=4, reference=False)
    assert res["invariants"]["counts_match"]
    inv = res["invariants"]
    assert inv["study_state"] == "completed"
    assert inv["unfinished"] == []
    assert inv["lost_reports"] == []
    assert inv["trials_leased_not_once"] == {}
    # Every proposal ran to an end: 500 proposals, plus one retry per failed attempt.
    cubic = res["cubic"]
    assert cubic["trials"] == inv["trials"] >= 500
    print(f"\n{cubic}")

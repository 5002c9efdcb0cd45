"""The API as it is deployed: ``uvicorn`` processes, real sockets, workers on threads.

A small study is driven to completion over HTTP by several worker threads at once, against
one process on a SQLite file and against four processes sharing PostgreSQL (where row locks
and the advisory proposal lock must keep the processes from handing out a trial twice or
proposing past the budget).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from cubic.store.schema import upgrade
from tests.service.conftest import BASELINE, REPO, SPACES, simulate, spec

READY_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def uvicorn(db_url: str, tmp_path: Path, workers: int = 1) -> Iterator[str]:
    """``uvicorn service.app:create_app --factory`` on a free port; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "CUBIC_DATABASE_URL": db_url,
        "CUBIC_SPACES_DIR": str(SPACES),
        "CUBIC_REAP_INTERVAL_S": "0.5",
    }
    log = (tmp_path / "uvicorn.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "service.app:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert proc.poll() is None, (tmp_path / "uvicorn.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not become ready"
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            # A graceful stop: uvicorn re-raises the signal once it has shut down.
            assert proc.wait(timeout=20) in (0, -signal.SIGTERM), (
                tmp_path / "uvicorn.log"
            ).read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()


def tokens(db_url: str) -> dict[str, dict[str, str]]:
    """Authorization headers of a submitter and a worker token, as an operator makes them:
    the API is deployed as users run it, with authentication on."""
    from cubic.store import Store

    with Store(db_url) as store:
        return {
            role: {"Authorization": f"Bearer {store.create_token(role, role)[1]}"}
            for role in ("submitter", "worker")
        }


def worker(url: str, study: dict[str, Any], name: str, headers: dict[str, str]) -> list[int]:
    """A worker's loop: lease two, run them, report; stop when the study says so."""
    done: list[int] = []
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        while True:
            resp = http.post(
                f"/v1/studies/{study['id']}/trials:lease",
                json={"worker_id": name, "count": 2, "lease_seconds": 60},
            )
            resp.raise_for_status()
            body = resp.json()
            if not body["trials"]:
                if body["study_state"] != "running":
                    return done
                time.sleep(0.05)  # the others hold the last trials: they may fail and retry
                continue
            for t in body["trials"]:
                report = {"lease_token": t["lease_token"], **simulate(study, t["params"])}
                http.post(f"/v1/trials/{t['id']}:report", json=report).raise_for_status()
                done.append(t["id"])


def drive(
    url: str, workers: int, max_trials: int, auth: dict[str, dict[str, str]]
) -> tuple[dict[str, Any], list[list[int]]]:
    """Create a study over HTTP (as YAML) and run it to its end with ``workers`` threads."""
    import yaml

    text = yaml.safe_dump(
        spec(
            name="uvicorn",
            baseline=BASELINE,
            budget={"max_trials": max_trials, "max_parallel": workers},
        )
    )
    resp = httpx.post(
        f"{url}/v1/studies",
        content=text,
        headers={"Content-Type": "application/yaml", **auth["submitter"]},
        timeout=30,
    )
    assert resp.status_code == 201, resp.text
    study = resp.json()
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(lambda i: worker(url, study, f"w{i}", auth["worker"]), range(workers)))
    return study, done


def check_finished(
    url: str,
    study: dict[str, Any],
    done: list[list[int]],
    max_trials: int,
    auth: dict[str, dict[str, str]],
) -> None:
    reported = [tid for batch in done for tid in batch]
    http = httpx.Client(base_url=url, headers=auth["submitter"], timeout=30)
    assert len(reported) == len(set(reported)), "a trial was run twice"
    got = http.get(f"/v1/studies/{study['id']}").json()
    assert got["state"] == "completed"
    trials = http.get(f"/v1/studies/{study['id']}/trials", params={"limit": 500}).json()["items"]
    assert sorted(t["id"] for t in trials) == sorted(reported)
    assert [t["number"] for t in trials] == list(range(len(trials)))
    assert sum(t["attempt"] == 1 for t in trials) == max_trials  # never past the budget
    best = http.get(f"/v1/studies/{study['id']}/best").json()
    assert best["speedup"] >= 1.0
    metrics = http.get("/metrics").text
    assert "cubic_lease_latency_seconds_bucket" in metrics
    assert httpx.get(f"{url}/metrics").status_code == 401  # nothing without a token
    http.close()


def test_one_process_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(url)
    auth = tokens(url)
    with uvicorn(url, tmp_path) as base:
        study, done = drive(base, workers=4, max_trials=16, auth=auth)
        check_finished(base, study, done, 16, auth)


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
@pytest.mark.xdist_group("many-processes")  # tens of connections to the shared server
def test_four_processes_share_postgresql(db_url: str, tmp_path: Path) -> None:
    # Only PostgreSQL: on SQLite the proposal lock is per process (see cubic.store).
    upgrade(db_url)
    auth = tokens(db_url)
    with uvicorn(db_url, tmp_path, workers=4) as base:
        study, done = drive(base, workers=8, max_trials=40, auth=auth)
        check_finished(base, study, done, 40, auth)

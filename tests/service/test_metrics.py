"""``/metrics`` under several API processes: any scrape adds up every process's counts.

``cubic serve --workers 3`` on a SQLite file; leases and reports go over fresh connections,
so that the kernel spreads them over the processes; every scrape, whichever process
answers it, must count all of them (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cubic.bench.service import free_port
from cubic.store.schema import upgrade
from tests.service.conftest import REPO, SPACES, simulate, spec
from tests.service.test_health import parse_exposition

pytestmark = pytest.mark.slow

API_WORKERS = 3
READY_S = 120.0
"""How long the processes may take to answer (generous: a loaded 2-core machine)."""


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while True:
        assert proc.poll() is None, f"cubic serve exited: {log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"not ready in {READY_S} s: {log.read_text()[-3000:]}"
        time.sleep(0.3)


def test_a_scrape_sums_the_counts_of_every_api_process(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    folder = tmp_path / "metrics"
    folder.mkdir()
    # What an earlier run left: counted as it stands, it would break (or inflate) the page.
    (folder / "counter_1.db").write_bytes(b"not a metrics file")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "CUBIC_DATABASE_URL": db,
        "CUBIC_SPACES_DIR": str(SPACES),
        "CUBIC_BACKGROUND": "thread",
        "PROMETHEUS_MULTIPROC_DIR": str(folder),
    }
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "cubic.cli", "serve", "--port", str(port)),
                *("--workers", str(API_WORKERS), "--no-auth"),
            ],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(url, proc, log)
        study = httpx.post(f"{url}/v1/studies", json=spec(budget={"max_trials": 12}), timeout=30)
        assert study.status_code == 201, study.text
        sid = study.json()["id"]
        leases = reports = 0
        deadline = time.monotonic() + 180
        while reports < 12:
            assert time.monotonic() < deadline, f"only {reports} trials reported in time"
            # a fresh connection each time: the kernel hands it to any of the processes
            answer = httpx.post(
                f"{url}/v1/studies/{sid}/trials:lease",
                json={"worker_id": f"w{leases % 4}", "count": 1},
                timeout=30,
            ).json()
            leases += 1
            for t in answer["trials"]:
                body = {"lease_token": t["lease_token"], **simulate(study.json(), t["params"])}
                r = httpx.post(f"{url}/v1/trials/{t['id']}:report", json=body, timeout=30)
                assert r.status_code == 200, r.text
                reports += 1
            if not answer["trials"]:
                time.sleep(min(answer.get("retry_after_s") or 0.2, 1.0))

        counted_by = {p.name.rsplit("_", 1)[-1] for p in folder.glob("histogram_*.db")}
        assert len(counted_by) >= 2, f"one process served everything: {sorted(counted_by)}"
        for _ in range(2 * API_WORKERS):  # whichever process answers, the same sums
            page = parse_exposition(httpx.get(f"{url}/metrics", timeout=30).text)
            assert page["cubic_lease_latency_seconds_count"] == leases
            assert page['cubic_lease_latency_seconds_bucket{le="+Inf"}'] == leases
            assert page["cubic_report_latency_seconds_count"] == reports
            assert page['cubic_studies{state="completed"}'] == 1  # read from the database
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert not (folder / "counter_1.db").exists()

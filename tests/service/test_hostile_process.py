"""Every hostile request of the threat list against a real API process, while a probe keeps
asking ``/healthz``: each gets a 4xx, the probe keeps being answered, and the process's
memory stays bounded. Times are reported (a loaded machine decides them), not asserted."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from cubic.store import Store
from cubic.store.schema import upgrade
from tests.service.conftest import lease_answer, spec
from tests.service.faults import api_process
from tests.service.test_hostile import _space

GIB = 1 << 30


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _cases(sid: int, trial: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(what, method, path, request keywords) of each hostile request."""
    tid, token = trial["id"], trial["lease_token"]
    report = f"/v1/trials/{tid}:report"

    def metrics(value: Any) -> dict[str, Any]:
        return {"json": {"lease_token": token, "state": "complete", "metrics": value}}

    return [
        ("grid over 10^30 points", "POST", "/v1/studies",
         {"json": spec(space=_space(30), strategy={"name": "grid"})}),
        ("round(x, -3000000)", "POST", "/v1/studies",
         {"json": spec(space=_space(2, constraint="round(p0, -3000000) == 0"))}),
        ("100 parameters", "POST", "/v1/studies", {"json": spec(space=_space(100))}),
        ("12 chained conditions", "POST", "/v1/studies",
         {"json": spec(space=_space(12, chain=True))}),
        ("100,000-level JSON", "POST", f"/v1/studies/{sid}/trials:lease",
         {"content": "[" * 100_000 + "]" * 100_000,
          "headers": {"Content-Type": "application/json"}}),
        ("10,000-level YAML", "POST", "/v1/studies",
         {"content": "a: " + "[" * 10_000 + "]" * 10_000,
          "headers": {"Content-Type": "application/yaml"}}),
        ("20 MB report", "POST", report,
         {"json": {"lease_token": token, "state": "failed", "log_tail": "x" * (20 << 20)}}),
        ("id 2^63", "GET", "/v1/studies/9223372036854775808", {}),
        ("offset 2^63", "GET", f"/v1/studies/{sid}/trials?offset=9223372036854775808", {}),
        ("NUL in a worker id", "POST", f"/v1/studies/{sid}/trials:lease",
         {"json": {"worker_id": "a\x00b"}}),
        ("metric 'abc'", "POST", report, metrics({"tokens_per_s": "abc"})),
        ("metric [1]", "POST", report, metrics({"tokens_per_s": [1]})),
        ("metric 'nan'", "POST", report, metrics({"tokens_per_s": "nan"})),
        ("metric 10^400", "POST", report,
         {"content": f'{{"lease_token": "{token}", "state": "complete", '
                     f'"metrics": {{"tokens_per_s": 1{"0" * 400}}}}}',
          "headers": {"Content-Type": "application/json"}}),
        ("gpu_hours 'x'", "POST", report, metrics({"tokens_per_s": 1.0, "gpu_hours": "x"})),
        ("a space file outside the spaces folder", "POST", "/v1/studies",
         {"json": spec(space="../pyproject.toml")}),
    ]  # fmt: skip


def test_hostile_requests_against_a_real_process(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    with Store(db) as store:
        _, admin = store.create_token("admin", "admin")
    headers = {"Authorization": f"Bearer {admin}"}
    with api_process(db, tmp_path / "api.log", CUBIC_AUTH="true") as api:
        assert api.proc is not None
        http = httpx.Client(base_url=api.url, headers=headers, timeout=120)
        study = http.post("/v1/studies", json=spec(budget={"max_trials": 8, "max_parallel": 4}))
        assert study.status_code == 201, study.text
        sid = study.json()["id"]
        (trial,) = lease_answer(http, sid)["trials"]

        probes: list[float] = []
        rss: list[int] = []
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=api.url, timeout=30) as c:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    c.get("/healthz")
                    probes.append(time.perf_counter() - t0)
                    rss.append(_rss(api.proc.pid))  # type: ignore[union-attr]
                    stop.wait(0.05)

        prober = threading.Thread(target=probe)
        prober.start()
        answers = []
        try:
            for what, method, path, kw in _cases(sid, trial):
                t0 = time.perf_counter()
                resp = http.request(method, path, **kw)
                answers.append((what, resp.status_code, time.perf_counter() - t0, resp.text[:200]))
        finally:
            stop.set()
            prober.join(timeout=60)
        # The study was not poisoned: the trial is still running and can be reported.
        assert http.get(f"/v1/trials/{trial['id']}").json()["state"] == "running"
        lease = http.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w2"})
        assert lease.status_code == 200
        http.close()
    print()
    for what, status, took, _ in answers:
        print(f"{what:42s} {status} in {took * 1e3:7.1f} ms")
    probes.sort()
    p99 = probes[int(0.99 * (len(probes) - 1))]
    print(f"/healthz meanwhile: {len(probes)} probes, p50 {probes[len(probes) // 2] * 1e3:.1f} ms,")
    print(f"p99 {p99 * 1e3:.1f} ms; API RSS peak {max(rss) / 2**20:.0f} MiB")
    bad = [(w, s, t) for w, s, _, t in answers if not 400 <= s < 500]
    assert bad == [], bad
    assert max(rss) < GIB

"""The worker pull loop and the Python client against a real uvicorn process."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from cubic.bench.service import study_spec
from cubic.client import CubicClient
from cubic.errors import InvalidInput, LeaseLost, NotFound, StorageError
from cubic.outcome import Outcome
from cubic.runners import make_runner
from cubic.runners.simulated import SimulatedRunner
from cubic.worker import MAX_POLL_ERRORS, Worker


def _study(client: CubicClient, trials: int, parallel: int = 4) -> int:
    return client.create_study(study_spec(trials, parallel, "random"))["id"]


def test_workers_run_a_study_to_completion(url: str) -> None:
    with CubicClient(url) as client:
        sid = _study(client, 12)
        workers = [
            Worker(
                CubicClient(url),
                sid,
                make_runner("simulated", seed=1),
                worker_id=f"w{i}",
                parallel=2,
                lease_seconds=30,
                idle_s=0.1,
            )
            for i in range(2)
        ]
        threads = [threading.Thread(target=w.run) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert client.get_study(sid)["state"] == "completed"
        trials = client.all_trials(sid)
        assert all(t["state"] not in ("waiting", "running") for t in trials)
        assert sum(w.reported for w in workers) == len(trials)
        assert {t["worker_id"] for t in trials} == {"w0", "w1"}
        assert client.best(sid)["value"] > 0


def test_stopped_worker_releases_its_trials_for_others(url: str) -> None:
    with CubicClient(url) as client:
        sid = _study(client, 4)
        # Jobs that take 20 s: the worker is stopped long before they end.
        w = Worker(
            CubicClient(url),
            sid,
            make_runner("simulated", time_scale=1.0),
            worker_id="slow",
            parallel=2,
            lease_seconds=60,
            grace_s=0.2,
        )
        threading.Timer(1.0, w.stop).start()
        assert w.run() == 0
        trials = client.all_trials(sid)
        assert {t["state"] for t in trials} == {"waiting"}
        again = client.lease(sid, "other", 2)
        assert len(again) == 2


def test_client_maps_errors_to_cubic_exceptions(url: str) -> None:
    with CubicClient(url) as client:
        with pytest.raises(NotFound):
            client.get_study(999_999)
        sid = _study(client, 2)
        with pytest.raises(InvalidInput) as err:
            client.lease(sid, "w", 0)
        assert err.value.field == "count"
        (t,) = client.lease(sid, "w", 1)
        client.report(
            t["id"], t["lease_token"], "complete", metrics={"tokens_per_s": 1.0, "throughput": 1.0}
        )
        with pytest.raises(LeaseLost):
            client.report(t["id"], "not-the-token", "complete", metrics={"tokens_per_s": 2.0})


def test_client_retries_idempotent_calls_on_5xx_only() -> None:
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            return httpx.Response(503, json={"detail": "database busy"})
        return httpx.Response(200, json={"status": "ok"})

    with CubicClient(
        "http://cubic.test", transport=httpx.MockTransport(flaky), backoff=0.0
    ) as client:
        assert client.healthz() == {"status": "ok"}
        assert calls["n"] == 3
        calls["n"] = -10  # creating a study is not idempotent: one try, then the error
        with pytest.raises(StorageError, match="database busy"):
            client.create_study({"name": "x"})
        assert calls["n"] == -9


def test_cli_submit_worker_best_against_the_service(url: str, tmp_path: Path) -> None:
    from tests.test_cli import SPACES, cubic

    study = tmp_path / "s.yaml"
    study.write_text(
        "name: cli-remote\nworkload: {preset: llama3_8b, cluster: {num_gpus: 16}}\n"
        f"space: {SPACES / 'llm_pretrain.yaml'}\nobjective: tokens_per_s\n"
        "budget: {max_trials: 6, max_parallel: 3}\nstrategy: {name: tpe, seed: 0}\n"
    )
    import json

    sid = str(json.loads(cubic("submit", str(study), "--url", url, "--json").stdout)["id"])
    out = cubic("worker", "--url", url, "--study", sid, "--parallel", "3").stdout
    assert "reported 6 trials" in out
    best = json.loads(cubic("best", sid, "--url", url, "--json").stdout)
    assert best["value"] > 0 and best["metric"] == "tokens_per_s"
    status = cubic("status", sid, "--url", url, "--no-follow").stdout
    assert "completed" in status


class _UnreachableScheduler(SimulatedRunner):
    """Answers polls with errors: ``flaky`` times per job, or always when ``flaky`` < 0."""

    def __init__(self, flaky: int) -> None:
        super().__init__(seed=3)
        self.flaky = flaky
        self.errors: dict[int, int] = {}
        self.cancelled = 0

    def poll(self, handle: Any) -> Outcome | None:
        key = id(handle[0])
        self.errors[key] = self.errors.get(key, 0) + 1
        if self.flaky < 0 or self.errors[key] <= self.flaky:
            raise ConnectionError("scheduler unreachable")
        return super().poll(handle)

    def cancel(self, handle: Any) -> None:
        self.cancelled += 1
        super().cancel(handle)


def test_poll_errors_are_retried_then_the_trial_fails(url: str) -> None:
    with CubicClient(url) as client:
        sid = _study(client, 2, parallel=2)
        flaky = _UnreachableScheduler(flaky=3)
        Worker(client, sid, flaky, parallel=2, poll_s=0.01, idle_s=0.05).run()
        assert {t["state"] for t in client.all_trials(sid)} <= {"complete", "infeasible"}
        assert all(n > 3 for n in flaky.errors.values())

        sid = _study(client, 1, parallel=1)
        down = _UnreachableScheduler(flaky=-1)
        Worker(client, sid, down, poll_s=0.01, idle_s=0.05).run(max_trials=1)
        trials = client.all_trials(sid)
        failed = [t for t in trials if t["state"] == "failed"]
        assert len(failed) == 1 and "lost track of the job" in failed[0]["error"]
        assert down.cancelled == 1
        assert list(down.errors.values()) == [MAX_POLL_ERRORS]

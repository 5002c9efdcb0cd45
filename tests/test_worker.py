"""The worker pull loop and the Python client against a real uvicorn process."""

from __future__ import annotations

import threading
import time
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
    """A random study, once the background proposer has stored its first batch."""
    sid = int(client.create_study(study_spec(trials, parallel, "random"))["id"])
    deadline = time.monotonic() + 120
    while not any(client.get_study(sid)["progress"]["counts"].values()):
        assert time.monotonic() < deadline, "the first batch was not proposed within 120 s"
        time.sleep(0.05)
    return sid


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
    assert "completed" in status and "6 trials (" in status
    assert f"best tokens_per_s {best['value']:,.4g}" in status
    assert "{" not in status  # no dict repr


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


def test_client_rides_through_an_outage_and_honours_retry_after(monkeypatch) -> None:
    import cubic.client

    waits: list[float] = []
    monkeypatch.setattr(cubic.client.time, "sleep", waits.append)
    calls = {"n": 0}

    def away(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] <= 30:  # the API restarting: nobody listens
            raise httpx.ConnectError("connection refused", request=request)
        if calls["n"] <= 32:  # back, its database not yet
            return httpx.Response(503, json={"detail": "db down"}, headers={"Retry-After": "2"})
        return httpx.Response(200, json={"status": "ok"})

    with CubicClient("http://cubic.test", transport=httpx.MockTransport(away)) as client:
        assert client.healthz() == {"status": "ok"}
    assert len(waits) == 32
    assert waits[-2:] >= [2.0, 2.0]  # Retry-After is a floor
    assert all(w <= 10.0 for w in waits[:30])  # backoff is capped
    assert len(set(waits[10:30])) == 20  # and jittered: no two workers in step

    # Beyond the budget: a one-line error that says so; creating something is not retried
    # once it may have reached the server.
    with CubicClient(
        "http://cubic.test", transport=httpx.MockTransport(away), outage_s=0.0
    ) as client:
        calls["n"] = 0
        with pytest.raises(StorageError, match="gave up after 0 s"):
            client.healthz()


def test_a_500_is_retried_a_few_times_only(monkeypatch) -> None:
    import cubic.client

    monkeypatch.setattr(cubic.client.time, "sleep", lambda s: None)
    calls = {"n": 0}

    def broken(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(500, json={"detail": "a bug"})

    client = CubicClient("http://cubic.test", transport=httpx.MockTransport(broken))
    with client, pytest.raises(StorageError, match="a bug"):
        client.healthz()
    assert calls["n"] == 4


def test_an_outcome_computed_while_the_service_is_away_is_reported_when_it_is_back(
    tmp_path: Path,
) -> None:
    """The worker's client gives up (a 1 s budget) while its job runs; the outcome stays in
    the outbox, and the next run of the worker reports it. One whose lease went to another
    worker meanwhile is refused and forgotten."""
    from cubic.outbox import Outbox
    from cubic.store.schema import upgrade
    from tests.service.faults import api_process, wait_for

    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    box = Outbox(tmp_path / "outbox")
    with api_process(db, tmp_path / "api.log") as api, CubicClient(api.url) as client:
        sid = _study(client, 2, parallel=2)
        worker = Worker(
            CubicClient(api.url, outage_s=1.0),
            sid,
            make_runner("simulated", time_scale=0.2),  # 4 s jobs
            worker_id="w",
            lease_seconds=300,
            outbox=box,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                worker.run(max_trials=1)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        wait_for("a running trial", lambda: bool(client.trials(sid, "running")["items"]), 60)
        (running,) = client.trials(sid, "running")["items"]
        api.kill()
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], StorageError)
        (kept,) = box.pending(sid)
        assert kept[0]["id"] == running["id"] and kept[1].state in ("complete", "infeasible")

        api.start()
        assert client.trial(running["id"])["state"] == "running"  # nothing lost, nothing done
        other = client.lease(sid, "someone-else", 1)[0]  # a second trial, leased elsewhere
        box.put(sid, {**other, "lease_token": "stale"}, Outcome("failed", error="x"))
        again = Worker(
            CubicClient(api.url),
            sid,
            make_runner("simulated"),
            worker_id="w",
            outbox=box,
        )
        assert again.run(max_trials=1) == 1
        stored = client.trial(running["id"])
        assert stored["state"] == kept[1].state
        assert (stored["metrics"] or {}) == kept[1].metrics
        assert client.trial(other["id"])["state"] == "running"  # the stale report refused
        assert box.pending(sid) == []


def test_study_commands_honour_the_service_url(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cubic study create/list/show` with CUBIC_URL talk to the service."""
    import json

    from tests.test_cli import SPACES, cubic

    study = tmp_path / "s.yaml"
    study.write_text(
        "name: via-url\nworkload: {preset: llama3_8b, cluster: {num_gpus: 16}}\n"
        f"space: {SPACES / 'llm_pretrain.yaml'}\nobjective: tokens_per_s\n"
        "budget: {max_trials: 2, max_parallel: 1}\nstrategy: {name: random, seed: 0}\n"
    )
    monkeypatch.setenv("CUBIC_URL", url)
    made = json.loads(cubic("study", "create", str(study), "--json").stdout)
    listed = json.loads(cubic("study", "list", "--json").stdout)
    assert made["id"] in [s["id"] for s in listed] and "via-url" in [s["name"] for s in listed]
    shown = json.loads(cubic("study", "show", str(made["id"]), "--json").stdout)
    assert shown["name"] == "via-url" and shown["state"] == "running"


def test_a_worker_without_a_study_serves_each_running_one_until_stopped(
    tmp_path: Path,
) -> None:
    """``cubic worker`` without ``--study`` (a pool's worker): the running studies in turn,
    then one created while it waits; a paused study is left alone."""
    from cubic.bench.service import api_server
    from cubic.store.schema import upgrade
    from cubic.worker import StudyLoop

    db = f"sqlite:///{tmp_path / 'pool.db'}"
    upgrade(db)
    with api_server(db, 1) as base, CubicClient(base) as client:
        first, second, paused = (_study(client, 4) for _ in range(3))
        client.pause(paused)
        loop = StudyLoop(
            CubicClient(base),
            make_runner("simulated", seed=1),
            idle_s=0.2,
            worker_id="pool-1",
            parallel=2,
            lease_seconds=30,
        )
        thread = threading.Thread(target=loop.run)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while client.get_study(second)["state"] != "completed":
                assert time.monotonic() < deadline, "the running studies were not served"
                time.sleep(0.2)
            assert client.get_study(first)["state"] == "completed"
            later = _study(client, 2)  # created while the worker waits for work
            while client.get_study(later)["state"] != "completed":
                assert time.monotonic() < deadline, "a study created later was not served"
                time.sleep(0.2)
        finally:
            loop.stop()
            thread.join(timeout=60)
        assert not thread.is_alive()
        assert loop.reported == 4 + 4 + 2
        for sid in (first, second, later):
            assert {t["worker_id"] for t in client.all_trials(sid)} == {"pool-1"}
        assert all(t["worker_id"] is None for t in client.all_trials(paused))
        assert client.get_study(paused)["state"] == "paused"

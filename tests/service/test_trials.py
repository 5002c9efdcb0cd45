"""The worker protocol over HTTP: lease, heartbeat, report, release; enqueue and import."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import BASELINE, assert_error, create, lease_answer, simulate


def lease(
    client: TestClient, sid: int, worker: str = "w", count: int = 1, **kw: Any
) -> list[dict[str, Any]]:
    return lease_answer(client, sid, worker, count, **kw)["trials"]


def report(client: TestClient, trial: dict[str, Any], **body: Any) -> Any:
    return client.post(
        f"/v1/trials/{trial['id']}:report", json={"lease_token": trial["lease_token"], **body}
    )


def test_bad_lease_requests_are_422_naming_the_field(client: TestClient) -> None:
    sid = create(client)["id"]
    url = f"/v1/studies/{sid}/trials:lease"
    assert_error(
        client.post(url, json={"worker_id": "w", "count": 0}),
        422,
        "RequestValidationError",
        "count",
    )
    assert_error(
        client.post(url, json={"worker_id": "w", "count": 65}),
        422,
        "RequestValidationError",
        "count",
    )
    body = assert_error(
        client.post(url, json={"count": 1}), 422, "RequestValidationError", "worker_id"
    )
    assert body["errors"][0]["loc"] == ["body", "worker_id"]  # FastAPI's list is kept
    assert_error(
        client.post(url, json={"worker_id": "x" * 201}), 422, "RequestValidationError", "worker_id"
    )
    assert_error(
        client.post(url, json={"worker_id": "w", "lease_seconds": 0}),
        422,
        "RequestValidationError",
        "lease_seconds",
    )
    assert_error(
        client.post(url, json={"worker_id": "w", "colour": "red"}),
        422,
        "RequestValidationError",
        "colour",
    )
    assert_error(
        client.post("/v1/studies/999/trials:lease", json={"worker_id": "w"}), 404, "NotFound"
    )


def test_lease_is_idempotent_per_worker(client: TestClient) -> None:
    sid = create(client)["id"]
    first = lease(client, sid, "w1", 2, lease_seconds=60)
    assert len(first) == 2
    assert all(t["study_id"] == sid and t["attempt"] == 1 and t["lease_token"] for t in first)
    again = lease(client, sid, "w1", 2)
    assert [(t["id"], t["lease_token"]) for t in again] == [
        (t["id"], t["lease_token"]) for t in first
    ]
    # The default lease (300 s) replaced the 60 s one.
    assert datetime.fromisoformat(again[0]["lease_deadline"]) > datetime.fromisoformat(
        first[0]["lease_deadline"]
    )
    other = lease(client, sid, "w2", 2)
    assert not {t["id"] for t in other} & {t["id"] for t in first}
    # Tokens are for the leasing worker only: listings never show them.
    listed = client.get(f"/v1/studies/{sid}/trials").json()["items"]
    assert all("lease_token" not in t for t in listed)
    assert {t["worker_id"] for t in listed if t["state"] == "running"} == {"w1", "w2"}
    # One more waits, proposed ahead of demand: 4 may run at once, the queue holds a fifth.
    assert [t["state"] for t in listed].count("waiting") == 1
    # With 4 running, nobody gets more until one ends, and is told to ask again later.
    resp = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w3", "count": 2})
    assert resp.json()["trials"] == [] and resp.json()["retry_after_s"] >= 1.0


def test_report_is_idempotent_per_token(client: TestClient) -> None:
    study = create(client)
    (t,) = lease(client, study["id"])
    outcome = simulate(study, t["params"])
    first = report(client, t, **outcome)
    assert first.status_code == 200, first.text
    assert first.json()["state"] == outcome["state"]
    events = client.get(f"/v1/trials/{t['id']}").json()["events"]
    second = report(client, t, **outcome)
    assert second.status_code == 200 and second.json() == first.json()
    assert client.get(f"/v1/trials/{t['id']}").json()["events"] == events
    # A different outcome for a finished trial is refused: a finished trial never changes.
    assert_error(
        report(client, t, state="pruned" if outcome["state"] != "pruned" else "failed"),
        409,
        "TrialFinished",
    )


def test_a_late_report_after_reap_and_re_lease_is_409(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 1, "max_parallel": 1})
    (t,) = lease(client, study["id"], "slow", lease_seconds=1)
    deadline = time.monotonic() + 10
    while client.get(f"/v1/trials/{t['id']}").json()["state"] != "failed":
        assert time.monotonic() < deadline, "the reaper did not fail the expired lease"
        time.sleep(0.1)
    trial = client.get(f"/v1/trials/{t['id']}").json()
    assert trial["error"] == "lease expired"
    assert [e["to_state"] for e in trial["events"]] == ["waiting", "running", "failed"]
    (retry,) = lease(client, study["id"], "fast")
    assert retry["params"] == t["params"] and retry["attempt"] == 2
    body = assert_error(report(client, t, **simulate(study, t["params"])), 409, "LeaseLost")
    assert str(t["id"]) in body["detail"]
    assert_error(
        client.post(f"/v1/trials/{t['id']}:heartbeat", json={"lease_token": t["lease_token"]}),
        409,
        "LeaseLost",
    )
    assert report(client, retry, **simulate(study, retry["params"])).status_code == 200
    reaped = re.search(r"^cubic_reaped_trials_total (\S+)$", client.get("/metrics").text, re.M)
    assert reaped and float(reaped[1]) >= 1


def test_heartbeat_and_release(client: TestClient) -> None:
    sid = create(client)["id"]
    (t,) = lease(client, sid, "w", lease_seconds=30)
    resp = client.post(
        f"/v1/trials/{t['id']}:heartbeat",
        json={"lease_token": t["lease_token"], "lease_seconds": 600},
    )
    assert resp.status_code == 200, resp.text
    assert datetime.fromisoformat(resp.json()["lease_deadline"]) > datetime.fromisoformat(
        t["lease_deadline"]
    )
    assert_error(
        client.post(f"/v1/trials/{t['id']}:heartbeat", json={"lease_token": "nope"}),
        409,
        "LeaseLost",
    )
    assert_error(
        client.post(f"/v1/trials/{t['id']}:release", json={"lease_token": "nope"}), 409, "LeaseLost"
    )

    released = client.post(f"/v1/trials/{t['id']}:release", json={"lease_token": t["lease_token"]})
    assert released.status_code == 200 and released.json()["state"] == "waiting"
    (again,) = lease(client, sid, "w2")
    assert again["id"] == t["id"] and again["lease_token"] != t["lease_token"]
    assert_error(report(client, t, state="failed", error="gone"), 409, "LeaseLost")


def test_bad_reports_are_refused_and_change_nothing(client: TestClient) -> None:
    study = create(client)
    (t,) = lease(client, study["id"])
    assert_error(report(client, t, state="exploded"), 422, "RequestValidationError", "state")
    body = assert_error(
        report(client, t, state="complete", metrics={"mfu": 0.5}), 422, "InvalidInput", "metrics"
    )
    assert "tokens_per_s" in body["detail"]
    assert_error(
        report(client, t, state="failed", log_tail="x" * (64 * 1024 + 1)),
        422,
        "RequestValidationError",
        "log_tail",
    )
    token = t["lease_token"]
    nan = f'{{"lease_token": "{token}", "state": "complete", "metrics": {{"tokens_per_s": NaN}}}}'
    assert_error(
        client.post(
            f"/v1/trials/{t['id']}:report",
            content=nan,
            headers={"Content-Type": "application/json"},
        ),
        422,
        "RequestValidationError",
        "metrics",
    )
    assert client.get(f"/v1/trials/{t['id']}").json()["state"] == "running"
    for action, body in [("report", {"state": "failed"}), ("heartbeat", {}), ("release", {})]:
        assert_error(
            client.post(f"/v1/trials/999:{action}", json={"lease_token": "x", **body}),
            404,
            "NotFound",
        )
    assert_error(client.get("/v1/trials/999"), 404, "NotFound")


def test_list_trials_filters_and_pages(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 6, "max_parallel": 6})
    sid = study["id"]
    leased = lease(client, sid, "w", 5)
    for t in leased[:3]:
        assert report(client, t, state="failed", error="node lost").status_code == 200
    # The lease proposed for all 6 parallel slots at once (5 leased, 1 waiting), and three
    # failures queued three retries (attempt 2): 9 trials in all.
    page = client.get(f"/v1/studies/{sid}/trials", params={"limit": 3, "offset": 3}).json()
    assert [t["number"] for t in page["items"]] == [3, 4, 5]
    assert page["total"] == 9
    failed = client.get(f"/v1/studies/{sid}/trials", params={"state": "failed"}).json()
    assert failed["total"] == 3 and {t["state"] for t in failed["items"]} == {"failed"}
    both = client.get(
        f"/v1/studies/{sid}/trials", params=[("state", "running"), ("state", "waiting")]
    ).json()
    assert both["total"] == 6
    trial = client.get(f"/v1/trials/{leased[0]['id']}").json()
    assert [e["to_state"] for e in trial["events"]] == ["waiting", "running", "failed"]
    assert trial["events"][-1]["detail"]["error"] == "node lost"
    assert_error(
        client.get(f"/v1/studies/{sid}/trials", params={"state": "lost"}),
        422,
        "RequestValidationError",
        "state.0",
    )


def test_enqueue_runs_given_configs_first(client: TestClient) -> None:
    sid = create(client)["id"]
    url = f"/v1/studies/{sid}/trials:enqueue"
    # A key that is no knob is refused with the nearest knob, not dropped.
    typo = {**BASELINE, "micro_bach": 2}
    body = assert_error(client.post(url, json={"configs": [typo]}), 422, "InvalidInput")
    assert "'micro_bach' (did you mean 'micro_batch'?)" in body["detail"]
    mine = {**BASELINE, "micro_batch": 2}
    resp = client.post(url, json={"configs": [mine]})
    assert resp.status_code == 201, resp.text
    (queued,) = resp.json()["trials"]
    assert queued["source"] == "enqueued" and queued["state"] == "waiting"
    assert queued["params"]["micro_batch"] == 2
    assert queued["params"]["dp"] == 8  # derived values are filled in
    assert lease(client, sid)[0]["id"] == queued["id"]

    body = assert_error(
        client.post(url, json={"configs": [BASELINE, {**BASELINE, "tp": 3}]}),
        422,
        "InvalidInput",
        "configs.1",
    )
    assert "tp" in body["detail"]
    missing = {k: v for k, v in BASELINE.items() if k != "recompute"}
    assert_error(client.post(url, json={"configs": [missing]}), 422, "InvalidInput", "configs.0")
    assert_error(client.post(url, json={"configs": []}), 422, "RequestValidationError", "configs")
    items = client.get(f"/v1/studies/{sid}/trials").json()["items"]
    assert [t["id"] for t in items if t["source"] == "enqueued"] == [queued["id"]]
    client.post(f"/v1/studies/{sid}:archive")
    assert_error(client.post(url, json={"configs": [BASELINE]}), 409, "Conflict")


def test_import_adds_finished_history_outside_the_budget(client: TestClient) -> None:
    study = create(
        client, constraints={"memory_headroom": 0.05}, budget={"max_trials": 3, "max_parallel": 3}
    )
    sid = study["id"]
    url = f"/v1/studies/{sid}/trials:import"
    fast = {"tokens_per_s": 2.0e5, "peak_memory_gb": 60.0}
    too_big = {"tokens_per_s": 9.9e9, "peak_memory_gb": 83.0}  # 80 GiB = 85.9 GB, less 5 %
    records = [
        {"params": BASELINE, "state": "complete", "metrics": fast},
        {"params": {**BASELINE, "micro_batch": 8}, "state": "infeasible"},
        {"params": {**BASELINE, "micro_batch": 2}, "state": "complete", "metrics": too_big},
        {"params": {**BASELINE, "micro_batch": 4}, "state": "failed"},
    ]
    resp = client.post(url, json={"trials": records})
    assert resp.status_code == 201, resp.text
    imported = resp.json()["trials"]
    assert [t["state"] for t in imported] == ["complete", "infeasible", "infeasible", "failed"]
    assert {t["source"] for t in imported} == {"imported"}
    assert client.get(f"/v1/studies/{sid}/best").json()["value"] == 2.0e5
    # Past runs do not use the budget: three new trials still run.
    assert len(lease(client, sid, "w", 8)) == 3

    bad = [{"params": {**BASELINE, "tp": 3}, "state": "complete", "metrics": fast}]
    assert_error(client.post(url, json={"trials": bad}), 422, "InvalidInput", "trials.0.params")
    no_metric = [records[1], {"params": BASELINE, "state": "complete", "metrics": {"mfu": 1}}]
    assert_error(
        client.post(url, json={"trials": no_metric}), 422, "InvalidInput", "trials.1.metrics"
    )
    assert_error(
        client.post(url, json={"trials": [{**records[0], "state": "running"}]}),
        422,
        "RequestValidationError",
        "trials.0.state",
    )
    assert_error(client.post(url, json={"trials": []}), 422, "RequestValidationError", "trials")
    assert (
        client.get(f"/v1/studies/{sid}/trials", params={"state": "complete"}).json()["total"] == 1
    )  # nothing of the refused imports was kept
    assert_error(
        client.post("/v1/studies/999/trials:import", json={"trials": records}), 404, "NotFound"
    )


def _progress(throughput: float, steps: int = 12, std: float = 0.01) -> dict[str, Any]:
    """A job's progress: ``steps`` steps (3 of warm-up) at ``throughput`` tokens/s."""
    return {
        "steps": steps,
        "timed_steps": steps - 3,
        "step_time_s": 1.0,
        "step_time_std_s": std,
        "throughput": throughput,
        "elapsed_s": steps + 6.0,
    }


def _beat(client: TestClient, t: dict[str, Any], progress: dict[str, Any]) -> Any:
    resp = client.post(
        f"/v1/trials/{t['id']}:heartbeat",
        json={"lease_token": t["lease_token"], "progress": progress},
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_heartbeat_with_progress_says_when_to_prune(client: TestClient) -> None:
    study = create(
        client,
        baseline=BASELINE,
        budget={"max_trials": 3, "max_parallel": 1},
        pruning={"enabled": True},
    )
    (base,) = lease(client, study["id"])
    assert base["number"] == 0  # the baseline runs first
    assert _beat(client, base, _progress(1.0))["prune"] is None  # the baseline: never
    done = simulate(study, base["params"])
    assert report(client, base, **done).status_code == 200
    best = done["metrics"]["tokens_per_s"]

    (t,) = lease(client, study["id"])
    assert _beat(client, t, _progress(0.9 * best))["prune"] is None
    assert _beat(client, t, _progress(0.3 * best, steps=6))["prune"] is None  # 3 timed steps
    answer = _beat(client, t, _progress(0.3 * best))
    verdict = answer["prune"]
    assert answer["state"] == "running" and verdict["method"] == "threshold"
    assert verdict["best"] == pytest.approx(best) and verdict["trials"] == 1
    assert verdict["bound"] < verdict["limit"] == pytest.approx(0.8 * best)
    assert verdict["reason"].startswith("pruned (threshold)")
    metrics = {"tokens_per_s": verdict["throughput"], "throughput": verdict["throughput"]}
    pruned = report(client, t, state="pruned", metrics=metrics, error=verdict["reason"])
    assert pruned.status_code == 200 and pruned.json()["state"] == "pruned"
    assert client.get(f"/v1/studies/{study['id']}/best").json()["trial"]["id"] == base["id"]


def test_without_pruning_progress_is_only_checked(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 2, "max_parallel": 1})
    (t,) = lease(client, study["id"])
    assert report(client, t, **simulate(study, t["params"])).status_code == 200
    (t,) = lease(client, study["id"])
    assert _beat(client, t, _progress(1.0))["prune"] is None


def test_bad_progress_is_422_naming_the_field(client: TestClient) -> None:
    study = create(client)
    (t,) = lease(client, study["id"])
    url = f"/v1/trials/{t['id']}:heartbeat"
    for progress, field in [
        ({"steps": -1}, "progress.steps"),
        ({"steps": 2, "throughput": 1e30}, "progress.throughput"),
        ({"steps": 2, "colour": "red"}, "progress.colour"),
        ({"timed_steps": 1}, "progress.steps"),
        ({"steps": 2, "timed_steps": 5, "step_time_s": 1.0}, "progress"),
    ]:
        body = {"lease_token": t["lease_token"], "progress": progress}
        resp = assert_error(client.post(url, json=body), 422, "RequestValidationError", field)
        if field == "progress":
            assert "timed_steps" in resp["detail"]

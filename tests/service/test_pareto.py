"""The Pareto front over HTTP: a small simulated study of throughput against peak memory."""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from cubic.pareto import non_dominated, oriented
from tests.service.conftest import assert_error, create, run_study, spec

OBJECTIVES = [
    {"metric": "tokens_per_s", "direction": "maximize"},
    {"metric": "peak_memory_gb"},  # minimised by default
]


def test_pareto_of_a_two_objective_study(client: TestClient) -> None:
    body = spec(name="memory-vs-speed", objectives=OBJECTIVES, budget={"max_trials": 12})
    del body["objective"]
    resp = client.post("/v1/studies", json=body)
    assert resp.status_code == 201, resp.text
    study = resp.json()
    sid = study["id"]
    empty = client.get(f"/v1/studies/{sid}/pareto")
    assert empty.status_code == 200, empty.text
    assert empty.json()["points"] == [] and empty.json()["n_measured"] == 0

    assert run_study(client, study) == 12
    front = client.get(f"/v1/studies/{sid}/pareto").json()
    assert front["objectives"] == [
        {"metric": "tokens_per_s", "direction": "maximize"},
        {"metric": "peak_memory_gb", "direction": "minimize"},
    ]
    # The front is exactly the non-dominated set of the complete trials' reports.
    trials = client.get(f"/v1/studies/{sid}/trials", params={"limit": 100}).json()["items"]
    done = [t for t in trials if t["state"] == "complete" and not t["error"]]
    vals = [[t["metrics"]["tokens_per_s"], t["metrics"]["peak_memory_gb"]] for t in done]
    on = non_dominated(oriented(vals, ["maximize", "minimize"]))
    expected = {t["id"] for t, keep in zip(done, on, strict=True) if keep}
    assert {p["trial"]["id"] for p in front["points"]} == expected
    assert front["n_measured"] == len({str(sorted(t["params"].items())) for t in done})
    got = [p["values"]["tokens_per_s"] for p in front["points"]]
    assert got == sorted(got, reverse=True)  # best first by the first objective
    for p in front["points"]:
        m = p["trial"]["metrics"]
        assert p["values"] == {
            "tokens_per_s": m["tokens_per_s"],
            "peak_memory_gb": m["peak_memory_gb"],
        }
    # Along the front, faster costs memory.
    mem = [p["values"]["peak_memory_gb"] for p in front["points"]]
    assert np.all(np.diff(mem) <= 0)

    # The history the dashboard plots the front over: both objectives of every trial.
    h = client.get(f"/v1/studies/{sid}/history").json()
    assert h["trials"]["number"] == [t["number"] for t in trials]
    plane = {
        n: (v, w)
        for n, v, w in zip(h["trials"]["number"], h["trials"]["value"], h["value2"], strict=True)
    }
    for t in trials:
        m = t["metrics"] or {}
        want = (m["tokens_per_s"], m["peak_memory_gb"]) if t in done else (None, None)
        assert plane[t["number"]] == want


def test_pareto_of_a_single_objective_study_is_its_best(client: TestClient) -> None:
    study = create(client)
    run_study(client, study)
    best = client.get(f"/v1/studies/{study['id']}/best").json()
    front = client.get(f"/v1/studies/{study['id']}/pareto").json()
    assert [p["trial"]["id"] for p in front["points"]] == [best["trial"]["id"]]


def test_pareto_of_an_unknown_study_is_404(client: TestClient) -> None:
    body = assert_error(client.get("/v1/studies/999/pareto"), 404, "NotFound")
    assert "999" in body["detail"]


def test_pareto_is_in_the_openapi_document(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/studies/{study_id}/pareto"]["get"]
    assert "404" in op["responses"]
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ParetoOut")
    assert "points" in doc["components"]["schemas"]["ParetoOut"]["properties"]

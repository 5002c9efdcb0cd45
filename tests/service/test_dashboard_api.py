"""The read-only endpoints the dashboard plots from: a study's history, the proxy models,
trials in another order; and the dashboard's static files."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import assert_error, create, run_study


def test_history_is_every_trial_compactly(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 12, "max_parallel": 4})
    run_study(client, study)
    sid = study["id"]
    h = client.get(f"/v1/studies/{sid}/history").json()
    trials = client.get(f"/v1/studies/{sid}/trials", params={"limit": 500}).json()["items"]
    assert h["metric"] == "tokens_per_s" and h["direction"] == "maximize"
    cols = h["trials"]  # one list per field: lean, 10,000 trials are plotted
    assert set(cols) == {"number", "state", "source", "value", "predicted", "gpu_hours"}
    assert h["value2"] is None  # one objective: no plane for a Pareto front
    points = [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]
    assert [p["number"] for p in points] == [t["number"] for t in trials]
    for p, t in zip(points, trials, strict=True):
        assert p["state"] == t["state"] and p["source"] == t["source"]
        if t["state"] == "complete":
            assert p["value"] == t["metrics"]["tokens_per_s"]
            assert p["gpu_hours"] == t["metrics"]["gpu_hours"]
        else:
            assert p["value"] is None
    best = client.get(f"/v1/studies/{sid}/best").json()
    assert max(p["value"] for p in points if p["value"] is not None) == best["value"]
    assert h["n_predicted"] == 0 and h["kendall_tau"] is None  # random proposes no predictions

    # the best configurations, best first, with their params
    complete = sorted(
        (t for t in trials if t["state"] == "complete"), key=lambda t: -t["metrics"]["tokens_per_s"]
    )
    assert [c["number"] for c in h["top"]] == [t["number"] for t in complete[:50]]
    assert h["top"][0]["params"] == best["trial"]["params"]
    two = client.get(f"/v1/studies/{sid}/history", params={"top": 2}).json()["top"]
    assert [c["number"] for c in two] == [t["number"] for t in complete[:2]]

    # infeasible trials per knob value and their errors, counted over finished trials
    finished = [t for t in trials if t["state"] in ("complete", "infeasible")]
    infeasible = [t for t in finished if t["state"] == "infeasible"]
    assert sum(g["trials"] for g in h["errors"]) == len(infeasible)
    for c in h["infeasible_by_value"]:
        same = [t for t in finished if t["params"].get(c["knob"]) == c["value"]]
        assert c["finished"] == len(same) and c["infeasible"] > 0
        assert c["infeasible"] == sum(t["state"] == "infeasible" for t in same)
    assert client.get("/v1/studies/999/history").status_code == 404


def test_history_refuses_a_bad_top(client: TestClient) -> None:
    sid = create(client)["id"]
    for bad in (0, 501, "many"):
        r = client.get(f"/v1/studies/{sid}/history", params={"top": bad})
        assert_error(r, 422, "RequestValidationError", "top")


def test_error_groups_ignore_numbers() -> None:
    from service.routes.dashboard import error_group

    a = error_group("CUDA out of memory: tried 3.5 GiB on rank 7\ntraceback")
    assert a == error_group("CUDA out of memory: tried 12 GiB on rank 0")
    assert a == "CUDA out of memory: tried # GiB on rank #"


def test_importance_without_a_model_is_an_empty_answer(client: TestClient) -> None:
    sid = create(client)["id"]
    r = client.get(f"/v1/studies/{sid}/importance")
    assert r.status_code == 200
    body = r.json()
    assert body["knobs"] == [] and body["model_version"] is None and body["other_share"] is None
    assert "no llm proxy model" in body["reason"]
    assert body["workload_kind"] == "llm" and body["strategy"] == "random"
    assert client.get("/v1/studies/999/importance").status_code == 404
    assert "/v1/studies/{study_id}/importance" in client.get("/openapi.json").json()["paths"]


def _store_model(store: Any, trials: list[Any], workload: Any) -> int:
    """Fit a small proxy model on ``trials`` and store it as the newest llm version."""
    from cubic.proxy.model import ProxyModel
    from cubic.proxy.training import training_set

    X, y, feasible, _ = training_set(trials, lambda _: workload, "llm")
    model = ProxyModel(kind="llm", n_members=2, n_estimators=20, gp_weight=0).fit(X, y, feasible)
    return store.save_proxy_model(
        "llm", model.save(), model.feature_names_, {}, n_train=len(y)
    ).version


def test_importance_of_the_newest_stored_model(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 24, "max_parallel": 4})
    run_study(client, study)
    sid = study["id"]
    store = client.app.state.store  # type: ignore[attr-defined]
    tuner = client.app.state.tuner  # type: ignore[attr-defined]
    done = store.list_trials(sid, states=["complete", "infeasible"])
    workload = tuner.resolved(sid).workload
    version = _store_model(store, done, workload)
    body = client.get(f"/v1/studies/{sid}/importance").json()
    assert body["model_version"] == version and body["reason"] is None
    assert body["n_train"] == len(done)
    knobs = {k["knob"]: k for k in body["knobs"]}
    assert set(knobs) == set(tuner.resolved(sid).space.names)  # every knob of the space
    assert sum(k["share"] for k in body["knobs"]) == pytest.approx(1.0)
    shares = [k["share"] for k in body["knobs"]]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0
    assert "log2_tp" in knobs["tp"]["features"] or knobs["tp"]["share"] == 0
    assert 0.0 <= body["other_share"] < 1.0
    # a newer version is read at the next request (the cache is by version)
    newer = _store_model(store, done[: len(done) // 2 + 4], workload)
    assert client.get(f"/v1/studies/{sid}/importance").json()["model_version"] == newer


def test_importance_of_an_unreadable_model_says_why(client: TestClient) -> None:
    sid = create(client)["id"]
    store = client.app.state.store  # type: ignore[attr-defined]
    store.save_proxy_model("llm", {"format": "x"}, ["a"], {}, 10)
    body = client.get(f"/v1/studies/{sid}/importance").json()
    assert body["knobs"] == [] and body["model_version"] == 1
    assert "cannot be read" in body["reason"]


def test_kendall_tau() -> None:
    from service.routes.dashboard import kendall_tau

    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2], [1, 2]) is None
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None  # constant: undefined


def test_trials_in_another_order(client: TestClient) -> None:
    study = create(client)
    run_study(client, study)
    url = f"/v1/studies/{study['id']}/trials"
    numbers = [t["number"] for t in client.get(url, params={"order": "-number"}).json()["items"]]
    assert numbers == sorted(numbers, reverse=True) and len(numbers) > 1
    finished = client.get(url, params={"order": "finished_at"}).json()["items"]
    stamps = [t["finished_at"] for t in finished]
    assert stamps == sorted(stamps)
    assert client.get(url, params={"order": "params"}).status_code == 422


def test_proxy_models_without_payload(client: TestClient) -> None:
    create(client)
    assert client.get("/v1/proxy-models").json() == {"models": []}
    store = client.app.state.store  # type: ignore[attr-defined]
    store.save_proxy_model("llm", {"format": "x"}, ["a", "b"], {"cv": {"kendall_tau": 0.5}}, 10)
    (m,) = client.get("/v1/proxy-models").json()["models"]
    assert m["workload_kind"] == "llm" and m["version"] == 1 and m["n_features"] == 2
    assert m["metrics"] == {"cv": {"kendall_tau": 0.5}} and "model" not in m
    assert client.get("/v1/proxy-models", params={"kind": "dlrm"}).json() == {"models": []}


def test_static_pages(client: TestClient) -> None:
    assert client.get("/ui", follow_redirects=False).status_code == 307
    for page in ("/ui/", "/ui/study.html", "/ui/proxy.html"):
        r = client.get(page)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        assert "http://" not in r.text and "https://" not in r.text  # nothing from outside
    for asset in ("common.js", "index.js", "study.js", "proxy.js", "style.css"):
        assert client.get(f"/ui/{asset}").status_code == 200
    js = client.get("/ui/assets/plotly.min.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert not any(p.startswith("/ui") for p in client.get("/openapi.json").json()["paths"])

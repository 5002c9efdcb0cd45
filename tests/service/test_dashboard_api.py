"""The read-only endpoints the dashboard plots from: a study's history, the proxy models,
trials in another order; and the dashboard's static files."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.service.conftest import create, run_study


def test_history_is_every_trial_compactly(client: TestClient) -> None:
    study = create(client)
    run_study(client, study)
    sid = study["id"]
    h = client.get(f"/v1/studies/{sid}/history").json()
    trials = client.get(f"/v1/studies/{sid}/trials", params={"limit": 500}).json()["items"]
    assert h["metric"] == "tokens_per_s" and h["direction"] == "maximize"
    assert [p["number"] for p in h["trials"]] == [t["number"] for t in trials]
    for p, t in zip(h["trials"], trials, strict=True):
        assert p["state"] == t["state"] and p["params"] == t["params"]
        if t["state"] == "complete":
            assert p["value"] == t["metrics"]["tokens_per_s"]
            assert p["gpu_hours"] == t["metrics"]["gpu_hours"]
        else:
            assert p["value"] is None
    best = client.get(f"/v1/studies/{sid}/best").json()
    assert max(p["value"] for p in h["trials"] if p["value"] is not None) == best["value"]
    assert h["n_predicted"] == 0 and h["kendall_tau"] is None  # random proposes no predictions
    assert client.get("/v1/studies/999/history").status_code == 404


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

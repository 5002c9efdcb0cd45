"""Studies over HTTP: create (JSON and YAML), list, read, state changes, best so far."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from service.app import create_app
from tests.service.conftest import (
    BASELINE,
    assert_error,
    create,
    first_batch,
    run_study,
    service_settings,
    spec,
)
from tests.test_study import NEVER


def test_create_returns_the_study_and_where_it_lives(client: TestClient) -> None:
    resp = client.post("/v1/studies", json=spec(name="json-study"))
    assert resp.status_code == 201, resp.text
    study = resp.json()
    assert resp.headers["location"] == f"/v1/studies/{study['id']}"
    assert study["name"] == "json-study" and study["state"] == "running"
    assert study["workload_kind"] == "llm"
    # The space file was found in the spaces folder and inlined: the study is self-contained.
    assert "tp" in study["spec"]["space"]["parameters"]

    got = first_batch(client, study["id"])
    assert got["id"] == study["id"]
    # Its first batch was proposed after it was created, before any lease: the parallel
    # room and one ahead.
    assert got["progress"] == {
        "counts": {
            "waiting": 5,
            "running": 0,
            "complete": 0,
            "infeasible": 0,
            "failed": 0,
            "pruned": 0,
        },
        "max_trials": 6,
        "best_value": None,
    }


@pytest.mark.parametrize("strategy", ["tpe", "cubic"])
def test_a_learning_strategy_proposes_no_trial_ahead_of_demand(
    client: TestClient, strategy: str
) -> None:
    """Each of its trials waits for a free slot, so that it sees every result in by then."""
    study = create(client, strategy={"name": strategy, "seed": 0})
    counts = client.get(f"/v1/studies/{study['id']}").json()["progress"]["counts"]
    assert counts["waiting"] == 4  # the parallel room, none ahead


@pytest.mark.parametrize("media", ["application/yaml", "text/yaml", "application/x-yaml"])
def test_create_from_yaml(client: TestClient, media: str) -> None:
    text = yaml.safe_dump(spec(name="yaml-study", baseline=BASELINE))
    resp = client.post("/v1/studies", content=text, headers={"Content-Type": media})
    assert resp.status_code == 201, resp.text
    study = resp.json()
    assert study["name"] == "yaml-study"
    first_batch(client, study["id"])
    # The baseline is queued as the first trial.
    first, *proposed = client.get(f"/v1/studies/{study['id']}/trials").json()["items"]
    assert first["source"] == "baseline" and first["params"]["tp"] == 2
    assert [t["source"] for t in proposed] == ["strategy"] * 4  # the rest of the first batch


def test_invalid_specs_are_422_naming_the_field(client: TestClient) -> None:
    bad = spec(budget={"max_trials": -1})
    assert_error(client.post("/v1/studies", json=bad), 422, "InvalidInput", "budget.max_trials")
    assert_error(
        client.post("/v1/studies", json=spec(strategy={"name": "annealing"})),
        422,
        "InvalidInput",
        "strategy.name",
    )
    assert_error(
        client.post("/v1/studies", json=spec(baseline={**BASELINE, "tp": 3})),
        422,
        "InvalidInput",
        "baseline",
    )
    assert_error(
        client.post(
            "/v1/studies", content="name: [unclosed", headers={"Content-Type": "application/yaml"}
        ),
        422,
        "InvalidInput",
        "body",
    )
    bomb = "a: &a [1, 1]\nb: &b [*a, *a]\nname: x\n"
    body = assert_error(
        client.post("/v1/studies", content=bomb, headers={"Content-Type": "application/yaml"}),
        422,
        "InvalidInput",
        "body",
    )
    assert "aliases" in body["detail"]
    assert_error(
        client.post(
            "/v1/studies", content="{not json", headers={"Content-Type": "application/json"}
        ),
        422,
        "InvalidInput",
        "body",
    )
    assert_error(
        client.post(
            "/v1/studies", content="- a list", headers={"Content-Type": "application/yaml"}
        ),
        422,
        "InvalidInput",
        "spec",
    )
    assert_error(
        client.post("/v1/studies", content="x", headers={"Content-Type": "text/csv"}),
        415,
        "HTTPException",
    )
    # Files outside the server's folders are refused, missing ones named.
    assert_error(
        client.post("/v1/studies", json=spec(space="../../etc/passwd.yaml")),
        422,
        "InvalidInput",
        "space",
    )
    assert_error(
        client.post("/v1/studies", json=spec(space="/etc/cubic/space.yaml")),
        422,
        "InvalidInput",
        "space",
    )
    body = assert_error(
        client.post("/v1/studies", json=spec(space="nope.yaml")), 422, "InvalidInput", "space"
    )
    assert "nope.yaml" in body["detail"]
    assert client.get("/v1/studies").json()["total"] == 0


def test_list_filters_and_pages(client: TestClient) -> None:
    ids = [create(client, name=f"s{i}")["id"] for i in range(3)]
    client.post(f"/v1/studies/{ids[1]}:pause")

    page = client.get("/v1/studies", params={"limit": 2}).json()
    assert [s["id"] for s in page["items"]] == ids[:2]
    assert (page["total"], page["limit"], page["offset"]) == (3, 2, 0)
    rest = client.get("/v1/studies", params={"limit": 2, "offset": 2}).json()
    assert [s["id"] for s in rest["items"]] == ids[2:]

    paused = client.get("/v1/studies", params={"state": "paused"}).json()
    assert [s["id"] for s in paused["items"]] == [ids[1]] and paused["total"] == 1
    assert client.get("/v1/studies", params={"kind": "llm"}).json()["total"] == 3
    assert client.get("/v1/studies", params={"kind": "dlrm"}).json()["items"] == []

    assert_error(client.get("/v1/studies", params={"limit": 501}), 422, "InvalidInput", "limit")
    assert_error(
        client.get("/v1/studies", params={"limit": 0}), 422, "RequestValidationError", "limit"
    )
    assert_error(
        client.get("/v1/studies", params={"offset": -1}), 422, "RequestValidationError", "offset"
    )
    assert_error(
        client.get("/v1/studies", params={"state": "sleeping"}),
        422,
        "RequestValidationError",
        "state",
    )


def test_unknown_study_is_404(client: TestClient) -> None:
    for method, path in [
        ("GET", "/v1/studies/999"),
        ("GET", "/v1/studies/999/best"),
        ("POST", "/v1/studies/999:pause"),
        ("POST", "/v1/studies/999:archive"),
        ("GET", "/v1/studies/999/trials"),
    ]:
        body = assert_error(client.request(method, path), 404, "NotFound")
        assert "999" in body["detail"]
    assert_error(client.get("/v1/nothing-here"), 404, "HTTPException")


def test_pause_resume_stop_archive(client: TestClient) -> None:
    sid = create(client)["id"]

    def act(action: str) -> object:
        return client.post(f"/v1/studies/{sid}:{action}")

    assert act("pause").json()["state"] == "paused"
    assert act("pause").json()["state"] == "paused"  # repeating is harmless
    lease = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w"}).json()
    assert lease == {"trials": [], "study_state": "paused", "retry_after_s": None}

    assert act("resume").json()["state"] == "running"
    assert (
        len(
            client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w"}).json()["trials"]
        )
        == 1
    )

    assert act("stop").json()["state"] == "stopped"
    body = assert_error(act("resume"), 409, "Conflict")
    assert "stopped" in body["detail"]
    assert_error(act("pause"), 409, "Conflict")

    assert act("archive").json()["state"] == "archived"
    assert act("archive").json()["state"] == "archived"
    for action in ("resume", "pause", "stop"):
        body = assert_error(act(action), 409, "Conflict")
        assert "archived" in body["detail"]
    assert client.get(f"/v1/studies/{sid}").json()["state"] == "archived"


def test_a_study_runs_to_completion_and_reports_its_best(client: TestClient) -> None:
    study = create(client, baseline=BASELINE, budget={"max_trials": 8, "max_parallel": 4})
    sid = study["id"]
    body = assert_error(client.get(f"/v1/studies/{sid}/best"), 404, "NotFound")
    assert "no complete trial" in body["detail"]

    assert run_study(client, study) == 8
    got = client.get(f"/v1/studies/{sid}").json()
    assert got["state"] == "completed"
    counts = got["progress"]["counts"]
    assert counts["complete"] + counts["infeasible"] + counts["failed"] == 8

    best = client.get(f"/v1/studies/{sid}/best").json()
    assert best["metric"] == "tokens_per_s" and best["direction"] == "maximize"
    assert best["value"] == best["trial"]["metrics"]["tokens_per_s"]
    assert got["progress"]["best_value"] == best["value"]
    baseline = client.get(f"/v1/studies/{sid}/trials", params={"limit": 1}).json()["items"][0]
    assert baseline["source"] == "baseline" and best["baseline_trial_id"] == baseline["id"]
    assert best["baseline_value"] == baseline["metrics"]["tokens_per_s"]
    assert best["speedup"] == pytest.approx(best["value"] / best["baseline_value"])
    assert best["speedup"] >= 1.0
    # Every trial finished: a worker asking again is told to stop.
    lease = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w"}).json()
    assert lease == {"trials": [], "study_state": "completed", "retry_after_s": None}


def test_a_space_where_nothing_fits_is_refused_and_nothing_is_stored(client: TestClient) -> None:
    tiny = {"preset": "llama3_405b", "cluster": {"gpu": "a100_40gb", "num_gpus": 16}}
    before = client.get("/v1/studies").json()
    body = assert_error(
        client.post("/v1/studies", json=spec(name="too-big", workload=tiny)),
        422,
        "InvalidInput",
        "space",
    )
    assert "GiB per GPU" in body["detail"] and "allow_unfit" in body["detail"]
    assert client.get("/v1/studies").json() == before
    forced = client.post("/v1/studies", json=spec(name="forced", workload=tiny, allow_unfit=True))
    assert forced.status_code == 201, forced.text


def test_a_space_with_no_valid_configuration_is_422_naming_its_constraints(
    client: TestClient,
) -> None:
    body = assert_error(
        client.post("/v1/studies", json=spec(space=NEVER, allow_unfit=True)),
        422,
        "InvalidInput",
        "space",
    )
    assert body["detail"].startswith("space: no valid configuration for this workload;")
    assert "'num_gpus % tp == 0' (tp must divide the GPUs) removes 6 (100%)" in body["detail"]
    assert "'micro_batch > 1' removes 3 (50%)" in body["detail"]
    assert client.get("/v1/studies").json()["total"] == 0


def test_a_server_started_anywhere_knows_the_shipped_spaces(
    migrated_url: str, tmp_path: Path
) -> None:
    """Its own spaces folder first, then the spaces cubic ships; nothing outside either."""
    with TestClient(create_app(service_settings(migrated_url, spaces_dir=tmp_path))) as c:
        made = c.post("/v1/studies", json=spec(name="shipped"))
        assert made.status_code == 201, made.text
        assert "tp" in made.json()["spec"]["space"]["parameters"]
        (tmp_path / "llm_pretrain.yaml").write_text(
            "parameters: {tp: {type: categorical, choices: [1, 2]}}\n"
        )
        own = c.post("/v1/studies", json=spec(name="own"))
        assert own.status_code == 201, own.text
        assert list(own.json()["spec"]["space"]["parameters"]) == ["tp"]
        for space in ("../llm_pretrain.yaml", "../pyproject.toml", "bench"):
            assert_error(
                c.post("/v1/studies", json=spec(space=space)), 422, "InvalidInput", "space"
            )

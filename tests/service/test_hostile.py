"""Bad input is a 4xx naming the field, never a 500 or a retryable 503, and never poisons a
study: ids beyond the databases' integers, NUL characters, metrics that are not numbers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import assert_error, create, simulate


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/studies/9223372036854775808", "study_id"),
        ("/v1/studies/2147483648/best", "study_id"),
        ("/v1/trials/18446744073709551616", "trial_id"),
        ("/v1/studies/1/trials?offset=9223372036854775808", "offset"),
        ("/v1/studies?offset=2147483648", "offset"),
        ("/v1/studies?kind=ll%00m", "kind"),
    ],
)
def test_ids_and_offsets_beyond_the_database_are_422(
    client: TestClient, path: str, field: str
) -> None:
    create(client)
    assert_error(client.get(path), 422, "RequestValidationError", field)


def test_nul_characters_are_refused(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 4, "max_parallel": 2})
    sid = study["id"]
    resp = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w\x00x"})
    assert_error(resp, 422, "RequestValidationError")
    assert "NUL" in resp.json()["detail"]
    resp = client.post("/v1/studies", json={**study["spec"], "name": "a\x00b"})
    assert_error(resp, 422, "InvalidInput", "spec")
    (t,) = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w"}).json()["trials"]
    bad = {"lease_token": t["lease_token"], "state": "failed", "error": "oom\x00"}
    assert_error(
        client.post(f"/v1/trials/{t['id']}:report", json=bad), 422, "RequestValidationError"
    )
    assert client.get(f"/v1/trials/{t['id']}").json()["state"] == "running"


def _report(client: TestClient, t: dict[str, Any], metrics: Any, raw: str | None = None) -> Any:
    if raw is not None:
        token = t["lease_token"]
        body = f'{{"lease_token": "{token}", "state": "complete", "metrics": {raw}}}'
        return client.post(
            f"/v1/trials/{t['id']}:report",
            content=body,
            headers={"Content-Type": "application/json"},
        )
    body = {"lease_token": t["lease_token"], "state": "complete", "metrics": metrics}
    return client.post(f"/v1/trials/{t['id']}:report", json=body)


@pytest.mark.parametrize(
    ("metrics", "raw", "field"),
    [
        ({"tokens_per_s": "abc"}, None, "metrics.tokens_per_s"),
        ({"tokens_per_s": [1]}, None, "metrics.tokens_per_s"),
        ({"tokens_per_s": "nan"}, None, "metrics.tokens_per_s"),
        ({"tokens_per_s": "1e400"}, None, "metrics.tokens_per_s"),
        ({"tokens_per_s": True}, None, "metrics.tokens_per_s"),
        (None, '{"tokens_per_s": 1' + "0" * 400 + "}", "metrics.tokens_per_s"),
        ({"tokens_per_s": 1.0e4, "gpu_hours": "x"}, None, "metrics.gpu_hours"),
        ({"tokens_per_s": 1.0e4, "gpu_hours": -1}, None, "metrics.gpu_hours"),
        ({"tokens_per_s": 1.0e4, "peak_memory_gib": {"a": 1}}, None, "metrics.peak_memory_gib"),
    ],
)
def test_metrics_that_are_not_numbers_are_refused_and_poison_nothing(
    client: TestClient, metrics: Any, raw: str | None, field: str
) -> None:
    study = create(
        client,
        budget={"max_trials": 4, "max_parallel": 2, "max_gpu_hours": 1e6},
    )
    sid = study["id"]
    (t,) = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w"}).json()["trials"]
    resp = _report(client, t, metrics, raw)
    assert resp.status_code == 422, resp.text
    assert resp.json()["field"] in (field, "metrics"), resp.text
    # Nothing stored, and the study goes on: the trial can still be reported properly.
    assert client.get(f"/v1/trials/{t['id']}").json()["state"] == "running"
    good = {"lease_token": t["lease_token"], **simulate(study, t["params"])}
    assert client.post(f"/v1/trials/{t['id']}:report", json=good).status_code == 200
    more = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w", "count": 2})
    assert more.status_code == 200 and more.json()["trials"]
    imported = {"trials": [{"params": t["params"], "state": "complete", "metrics": metrics or {}}]}
    if metrics is not None:
        assert client.post(f"/v1/studies/{sid}/trials:import", json=imported).status_code == 422


def test_bodies_too_large_or_too_deep_are_refused(client: TestClient) -> None:
    study = create(client, budget={"max_trials": 4, "max_parallel": 2})
    sid = study["id"]
    (t,) = client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w"}).json()["trials"]
    huge = {"lease_token": t["lease_token"], "state": "failed", "log_tail": "x" * (5 << 20)}
    resp = client.post(f"/v1/trials/{t['id']}:report", json=huge)
    assert_error(resp, 413, "BodyTooLarge", "body")
    assert "CUBIC_MAX_BODY_BYTES" in resp.json()["detail"]

    def chunks():  # no Content-Length: cut off as the stream passes the limit
        yield b'{"lease_token": "' + t["lease_token"].encode() + b'", "error": "'
        for _ in range(6):
            yield b"y" * (1 << 20)
        yield b'", "state": "failed"}'

    resp = client.post(
        f"/v1/trials/{t['id']}:report",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert_error(resp, 413, "BodyTooLarge", "body")
    deep_json = "[" * 100_000 + "]" * 100_000
    resp = client.post(
        f"/v1/studies/{sid}/trials:lease",
        content=deep_json,
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 422, resp.text
    deep_yaml = "a: " + "[" * 10_000 + "]" * 10_000
    resp = client.post(
        "/v1/studies", content=deep_yaml, headers={"Content-Type": "application/yaml"}
    )
    assert resp.status_code == 422, resp.text
    nested: Any = 1.0
    for _ in range(40):
        nested = {"k": nested}
    bad = {"lease_token": t["lease_token"], "state": "failed", "metrics": {"m": nested}}
    resp = client.post(f"/v1/trials/{t['id']}:report", json=bad)
    assert resp.status_code == 422 and "levels deep" in resp.json()["detail"], resp.text
    assert client.get(f"/v1/trials/{t['id']}").json()["state"] == "running"
    assert client.get("/healthz").status_code == 200


def _space(n: int, chain: bool = False, constraint: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for i in range(n):
        p: dict[str, Any] = {"type": "categorical", "choices": [0, 1] if chain else list(range(10))}
        if chain and i:
            p |= {"when": f"p{i - 1} == 1", "default": 0}
        params[f"p{i}"] = p
    space: dict[str, Any] = {"name": "hostile", "parameters": params}
    if constraint:
        space["constraints"] = [{"expr": constraint}]
    return space


@pytest.mark.parametrize(
    ("space", "strategy", "problem"),
    [
        (_space(30), "grid", "more than 1,000,000 configurations"),
        (_space(2, constraint="round(p0, -3000000) == 0"), "random", "at most 30 digits"),
        (_space(2, constraint="p0 ** 100000000 > 1"), "random", "exponent larger than"),
        (_space(100), "random", "at most 64"),
        (_space(12, chain=True), "random", "chain of more than 8 conditions"),
    ],
)
def test_spaces_whose_evaluation_would_not_end_are_refused(
    client: TestClient, space: dict[str, Any], strategy: str, problem: str
) -> None:
    import time

    from tests.service.conftest import spec

    t0 = time.perf_counter()
    resp = client.post("/v1/studies", json=spec(space=space, strategy={"name": strategy}))
    took = time.perf_counter() - t0
    body = assert_error(resp, 422, "InvalidInput")
    assert problem in body["detail"], body
    assert body["field"] in ("space", "strategy.name")
    print(f"\n{problem}: 422 in {took * 1e3:.0f} ms")
    assert client.get("/healthz").status_code == 200


def test_a_malformed_workload_is_422_naming_it(client: TestClient) -> None:
    from tests.service.conftest import spec

    for cluster, says in (
        ({"num_gpus": "sixteen"}, "num_gpus: expected int"),
        ({"gpu_per_node": 8}, "did you mean 'gpus_per_node'"),
    ):
        body = spec(workload={"preset": "llama3_8b", "cluster": cluster})
        err = assert_error(client.post("/v1/studies", json=body), 422, "InvalidInput", "workload")
        assert says in err["detail"]

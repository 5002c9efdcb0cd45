"""Fixtures of the API tests: the real app over a real, migrated database.

``client`` runs over SQLite and, when ``CUBIC_TEST_DATABASE_URL`` is set, over PostgreSQL
(the ``db_url`` fixture of :mod:`tests.store.backends`). Jobs are the simulated cluster's,
with the noise switched off so that results are reproducible.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cubic.sim.job import NoiseModel, run_job
from cubic.store.schema import upgrade
from cubic.workload import Workload
from service.app import create_app
from service.settings import ServiceSettings

REPO = Path(__file__).resolve().parents[2]
SPACES = REPO / "search_spaces"

WORKLOAD: dict[str, Any] = {
    "preset": "llama3_8b",
    "cluster": {"gpu": "h100_sxm", "num_gpus": 16, "gpus_per_node": 8},
}
BASELINE: dict[str, Any] = {
    "tp": 2,
    "pp": 1,
    "cp": 1,
    "micro_batch": 1,
    "zero_stage": 1,
    "recompute": "selective",
    "sequence_parallel": True,
    "tp_comm_overlap": False,
    "overlap_grad_reduce": True,
    "overlap_param_gather": False,
    "fp8_qkv": False,
    "fp8_attn_out": False,
    "fp8_mlp_in": False,
    "fp8_mlp_out": False,
    "fp8_lm_head": False,
}


def spec(**overrides: Any) -> dict[str, Any]:
    """A small study: Llama-3 8B on 16 H100s, the shipped LLM space, random proposals."""
    base: dict[str, Any] = {
        "name": "svc-test",
        "workload": copy.deepcopy(WORKLOAD),
        "space": "llm_pretrain.yaml",
        "objective": "tokens_per_s",
        "budget": {"max_trials": 6, "max_parallel": 4},
        "strategy": {"name": "random", "seed": 0},
    }
    base.update(overrides)
    return base


def service_settings(url: str, **overrides: Any) -> ServiceSettings:
    values: dict[str, Any] = {
        "database_url": url,
        "reap_interval_s": 0.2,
        "spaces_dir": SPACES,
        "auth": False,  # the role tests turn it on
        # one process: test_background.py covers the background process of production
        "background": "thread",
    }
    values.update(overrides)
    return ServiceSettings(**values)


@pytest.fixture
def migrated_url(db_url: str) -> str:
    upgrade(db_url)
    return db_url


@pytest.fixture
def client(migrated_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(service_settings(migrated_url))) as c:
        yield c


def create(client: TestClient, **overrides: Any) -> dict[str, Any]:
    """Create a study and wait (bounded) for its first batch, which the background proposer
    prepares off the request path."""
    resp = client.post("/v1/studies", json=spec(**overrides))
    assert resp.status_code == 201, resp.text
    study = resp.json()
    first_batch(client, study["id"])
    return study


def first_batch(client: Any, sid: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The study once its first proposals are stored (or it stopped running)."""
    deadline = time.monotonic() + LEASE_WAIT_S
    while True:
        got = client.get(f"/v1/studies/{sid}", headers=headers).json()
        counts, cap = got["progress"]["counts"], got["progress"]["max_trials"]
        baseline = 1 if got["spec"].get("baseline") else 0
        if got["state"] != "running" or sum(counts.values()) > min(baseline, cap - 1):
            return got
        assert time.monotonic() < deadline, "the first batch was not proposed in time"
        time.sleep(0.05)


_workloads: dict[str, Workload] = {}


def simulate(study: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """What a worker reports for ``params``: the body of a report, without the token."""
    key = json.dumps(study["spec"]["workload"], sort_keys=True)
    if key not in _workloads:
        _workloads[key] = Workload.from_dict(study["spec"]["workload"])
    out = run_job(_workloads[key], params, noise=NoiseModel.off())
    return {
        "state": out.state,
        "metrics": out.metrics,
        "error": out.error,
        "log_tail": out.log_tail,
    }


LEASE_WAIT_S = 120.0
"""How long a test waits for the background proposer to hand out trials (generous)."""


def lease_answer(
    client: Any,
    sid: int,
    worker: str = "w",
    count: int = 1,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> dict[str, Any]:
    """A lease answer with trials in it, as a worker would get by honouring
    ``retry_after_s``; an empty one only once the study hands out nothing more."""
    deadline = time.monotonic() + LEASE_WAIT_S
    while True:
        resp = client.post(
            f"/v1/studies/{sid}/trials:lease",
            json={"worker_id": worker, "count": count, **body},
            headers=headers,
        )
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        hint = answer.get("retry_after_s")
        if answer["trials"] or not hint or answer["study_state"] != "running":
            return answer
        assert time.monotonic() < deadline, "no trial was proposed in time"
        time.sleep(hint)


def run_study(client: Any, study: dict[str, Any], worker: str = "w", count: int = 2) -> int:
    """Lease, simulate and report until the study hands out nothing more; trials run."""
    n = 0
    while True:
        leased = lease_answer(client, study["id"], worker, count)["trials"]
        if not leased:
            return n
        for t in leased:
            body = {"lease_token": t["lease_token"], **simulate(study, t["params"])}
            r = client.post(f"/v1/trials/{t['id']}:report", json=body)
            assert r.status_code == 200, r.text
            n += 1


def assert_error(resp: Any, status: int, kind: str, field: str | None = None) -> dict[str, Any]:
    """The uniform error body: status, ``type`` and (when given) ``field``."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["type"] == kind, body
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        assert body["field"] == field, body
        assert field in body["detail"], body
    return body

"""The API fuzzed from its own OpenAPI document (schemathesis): whatever a client sends, the
answer is never a 5xx and always what the document says (status, body schema).

Requests carry an admin token (so they reach the handlers), over SQLite and PostgreSQL, with
a study and a few leased trials in the database so that ids sometimes hit something. Each of
the 22 operations gets ``EXAMPLES`` generated requests: over 2,000 per backend.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from typing import Any

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from service.app import create_app
from tests.service.conftest import create, service_settings


def _import_eagerly(*packages: str) -> None:
    """Import every module of these packages now, at a shallow stack.

    schemathesis imports many of its modules inside functions; one first imported deep in
    a Hypothesis draw is compiled there (pytest rewrites a plugin's modules), and CPython
    3.11's compiler can then fail with "AST constructor recursion depth mismatch".
    """
    for name in packages:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            with contextlib.suppress(Exception):  # an optional part this install lacks
                importlib.import_module(info.name)


_import_eagerly(
    "schemathesis.core",
    "schemathesis.generation",
    "schemathesis.specs.openapi",
    "schemathesis.python",
)

EXAMPLES = 130
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
"""What the document promises about answers. Not ``positive_data_acceptance``: a spec that
fits the JSON schema may still name an unknown preset, and is rightly a 422."""


def _fuzz(operation: Any, headers: dict[str, str], seen: list[str]) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case: schemathesis.Case) -> None:
        response = case.call(headers=headers)
        seen.append(f"{response.status_code}")
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
        )
        case.validate_response(response, checks=CHECKS)

    run()


def test_no_5xx_and_every_answer_as_documented(migrated_url: str) -> None:
    app = create_app(service_settings(migrated_url, auth=True))
    with TestClient(app) as client:
        _, secret = app.state.store.create_token("fuzz", "admin")
        headers = {"Authorization": f"Bearer {secret}"}
        client.headers.update(headers)
        study = create(client, budget={"max_trials": 8, "max_parallel": 4})
        client.post(f"/v1/studies/{study['id']}/trials:lease", json={"worker_id": "w", "count": 2})
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [r.ok() for r in schema.get_all_operations()]
        assert len(operations) == 26
        statuses: dict[str, list[str]] = {}
        for op in operations:
            _fuzz(op, headers, statuses.setdefault(op.label, []))
    cases = sum(len(v) for v in statuses.values())
    assert cases >= 2000, cases
    summary = {label: sorted(set(v)) for label, v in statuses.items()}
    print(f"\n{cases} cases; statuses per operation: {summary}")

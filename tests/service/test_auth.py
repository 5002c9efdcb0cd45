"""Tokens and roles: every endpoint against every kind of caller.

The app runs with authentication on over a real, migrated database. Callers: an admin, the
submitter who created the study and another one, the worker holding the lease and another
one, a reader, and requests with no token, a revoked token and a made-up token. Each
endpoint must answer 2xx to the callers its role admits, 401 to the unauthenticated and 403
to the rest; a lease token must never reach anyone but its holder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cubic.store import Store
from service.app import create_app
from tests.service.conftest import BASELINE, first_batch, service_settings, simulate, spec

UNAUTHENTICATED = ("none", "revoked", "wrong")
CALLERS = (
    "admin",
    "submitter_own",
    "submitter_other",
    "worker_own",
    "worker_other",
    "reader",
    *UNAUTHENTICATED,
)
ANY_ROLE = {"admin", "submitter_own", "submitter_other", "worker_own", "worker_other", "reader"}
OWNER = {"admin", "submitter_own"}
LEASE_HOLDER = {"admin", "worker_own"}
WORKERS = {"admin", "worker_own", "worker_other"}


@pytest.fixture
def app(migrated_url: str) -> Iterator[tuple[TestClient, Store]]:
    with TestClient(create_app(service_settings(migrated_url, auth=True))) as c:
        yield c, c.app.state.store  # type: ignore[attr-defined]


class World:
    """The tokens, a study of ``submitter_own`` and trials leased by ``worker_own``."""

    def __init__(self, client: TestClient, store: Store) -> None:
        self.client = client
        self.headers: dict[str, dict[str, str]] = {"none": {}}
        self.bodies: dict[str, list[str]] = {c: [] for c in CALLERS}
        for name in ("admin", "submitter_own", "submitter_other", "worker_own", "worker_other"):
            self._token(store, name, name.split("_")[0])
        self._token(store, "reader", "reader")
        revoked = self._token(store, "revoked", "admin")
        store.revoke_token(revoked)
        self.headers["wrong"] = {"Authorization": "Bearer cubic_not-a-token"}
        body = spec(name="auth", baseline=BASELINE, budget={"max_trials": 30, "max_parallel": 12})
        self.study = self.call("submitter_own", "POST", "/v1/studies", body).json()
        self.sid = self.study["id"]
        first_batch(client, self.sid, self.headers["admin"])
        leased = self.call(
            "worker_own",
            "POST",
            f"/v1/studies/{self.sid}/trials:lease",
            {"worker_id": "w-own", "count": 8},
        )
        assert leased.status_code == 200, leased.text
        self.leased = leased.json()["trials"]
        assert len(self.leased) == 8
        self.lease_tokens = {t["lease_token"] for t in self.leased}

    def _token(self, store: Store, name: str, role: str) -> int:
        record, secret = store.create_token(name, role)
        self.headers[name] = {"Authorization": f"Bearer {secret}"}
        return record.id

    def call(self, caller: str, method: str, path: str, body: Any = None) -> Any:
        resp = self.client.request(method, path, json=body, headers=self.headers[caller])
        self.bodies.setdefault(caller, []).append(resp.text)
        return resp


def _check(world: World, allowed: set[str], method: str, path: str, body: Any = None) -> None:
    """Everyone not allowed first (nothing may change), then the allowed callers."""
    denied = [c for c in CALLERS if c not in allowed]
    for caller in denied:
        resp = world.call(caller, method, path, body(caller) if callable(body) else body)
        want = 401 if caller in UNAUTHENTICATED else 403
        assert resp.status_code == want, f"{caller} {method} {path}: {resp.text}"
        assert resp.json()["type"] == ("Unauthorized" if want == 401 else "Forbidden")
    for caller in sorted(allowed):
        resp = world.call(caller, method, path, body(caller) if callable(body) else body)
        assert 200 <= resp.status_code < 300, f"{caller} {method} {path}: {resp.text}"


def test_every_endpoint_against_every_caller(app: tuple[TestClient, Store]) -> None:
    client, store = app
    w = World(client, store)
    sid, t = w.sid, w.leased
    everyone = set(CALLERS)

    # probes stay open; everything else needs a token
    _check(w, everyone, "GET", "/healthz")
    _check(w, everyone, "GET", "/readyz")
    _check(w, ANY_ROLE, "GET", "/metrics")
    # reading
    _check(w, ANY_ROLE, "GET", "/v1/studies")
    _check(w, ANY_ROLE, "GET", f"/v1/studies/{sid}")
    _check(w, ANY_ROLE, "GET", f"/v1/studies/{sid}/trials")
    _check(w, ANY_ROLE, "GET", f"/v1/trials/{t[0]['id']}")
    # creating and managing studies
    _check(
        w,
        {"admin", "submitter_own", "submitter_other"},
        "POST",
        "/v1/studies",
        lambda c: spec(name=f"by-{c}"),
    )
    _check(w, OWNER, "POST", f"/v1/studies/{sid}:pause")
    _check(w, OWNER, "POST", f"/v1/studies/{sid}:resume")
    _check(w, OWNER, "POST", f"/v1/studies/{sid}/trials:enqueue", {"configs": [BASELINE]})
    imported = {"trials": [{"params": BASELINE, **_imported(w.study)}]}
    _check(w, OWNER, "POST", f"/v1/studies/{sid}/trials:import", imported)
    # the worker protocol: a worker id is its first token's; a lease is its holder's
    _check(
        w,
        WORKERS,
        "POST",
        f"/v1/studies/{sid}/trials:lease",
        lambda c: {"worker_id": f"w-{c}", "count": 1},
    )
    stolen = w.call(
        "worker_other", "POST", f"/v1/studies/{sid}/trials:lease", {"worker_id": "w-own"}
    )
    assert stolen.status_code == 403 and "w-own" in stolen.json()["detail"]
    token = {"lease_token": t[0]["lease_token"], "lease_seconds": 60}
    _check(w, LEASE_HOLDER, "POST", f"/v1/trials/{t[0]['id']}:heartbeat", token)
    holders = iter(t[1:3])  # one trial per allowed caller: a report is final
    for caller in CALLERS:  # the denied callers all aim at t[3], which stays running
        trial = next(holders) if caller in LEASE_HOLDER else t[3]
        body = {"lease_token": trial["lease_token"], **simulate(w.study, trial["params"])}
        resp = w.call(caller, "POST", f"/v1/trials/{trial['id']}:report", body)
        want = 200 if caller in LEASE_HOLDER else 401 if caller in UNAUTHENTICATED else 403
        assert resp.status_code == want, f"{caller}: {resp.text}"
    assert (
        client.get(f"/v1/trials/{t[3]['id']}", headers=w.headers["admin"]).json()["state"]
        == "running"
    )
    releases = iter(t[4:6])
    for caller in CALLERS:
        target = next(releases) if caller in LEASE_HOLDER else t[6]
        resp = w.call(
            caller,
            "POST",
            f"/v1/trials/{target['id']}:release",
            {"lease_token": target["lease_token"]},
        )
        want = 200 if caller in LEASE_HOLDER else 401 if caller in UNAUTHENTICATED else 403
        assert resp.status_code == want, f"{caller}: {resp.text}"
    # best, once something is complete
    _check(w, ANY_ROLE, "GET", f"/v1/studies/{sid}/best")
    # tokens are the admins'
    _check(w, {"admin"}, "GET", "/v1/tokens")
    _check(w, {"admin"}, "POST", "/v1/tokens", {"name": "ci", "role": "reader"})
    extra = store.create_token("to-revoke", "reader")[0]
    _check(w, {"admin"}, "POST", f"/v1/tokens/{extra.id}:revoke")
    # stopping and archiving are final: last
    _check(w, OWNER, "POST", f"/v1/studies/{sid}:stop")
    _check(w, OWNER, "POST", f"/v1/studies/{sid}:archive")

    # No lease token of worker_own's reached anyone else, in any answer.
    for caller, bodies in w.bodies.items():
        if caller in LEASE_HOLDER:
            continue
        for text in bodies:
            assert not any(tok in text for tok in w.lease_tokens), (caller, text[:300])


def _imported(study: dict[str, Any]) -> dict[str, Any]:
    out = simulate(study, BASELINE)
    return {"state": out["state"], "metrics": out["metrics"]}


def test_tokens_last_use_scope_and_the_open_mode(app: tuple[TestClient, Store]) -> None:
    client, store = app
    w = World(client, store)
    listed = {t["name"]: t for t in w.call("admin", "GET", "/v1/tokens").json()["tokens"]}
    assert listed["worker_own"]["last_used_at"] is not None
    assert listed["reader"]["last_used_at"] is None
    assert listed["revoked"]["revoked_at"] is not None
    assert all("token" not in t and "digest" not in t for t in listed.values())
    # A token made over REST for one study sees that study only, and cannot create one.
    made = w.call(
        "admin", "POST", "/v1/tokens", {"name": "one", "role": "worker", "study_id": w.sid}
    ).json()
    assert made["token"].startswith("cubic_")
    one = {"Authorization": f"Bearer {made['token']}"}
    other = client.post("/v1/studies", json=spec(name="other"), headers=w.headers["admin"]).json()
    assert client.get(f"/v1/studies/{w.sid}", headers=one).status_code == 200
    assert client.get(f"/v1/studies/{other['id']}", headers=one).status_code == 403
    assert [s["id"] for s in client.get("/v1/studies", headers=one).json()["items"]] == [w.sid]
    lease = client.post(
        f"/v1/studies/{other['id']}/trials:lease", json={"worker_id": "x"}, headers=one
    )
    assert lease.status_code == 403
    # Revoked over REST: refused at once.
    w.call("admin", "POST", f"/v1/tokens/{made['id']}:revoke")
    resp = client.get(f"/v1/studies/{w.sid}", headers=one)
    assert resp.status_code == 401 and "revoked" in resp.json()["detail"]
    assert resp.headers.get("www-authenticate", "").lower().startswith("bearer")


def test_specs_read_only_the_spaces_folder(app: tuple[TestClient, Store]) -> None:
    client, store = app
    admin = {"Authorization": f"Bearer {store.create_token('a', 'admin')[1]}"}
    for space in ("Makefile", "../Makefile", "/etc/passwd", "../pyproject.toml", "bench"):
        resp = client.post("/v1/studies", json=spec(space=space), headers=admin)
        assert resp.status_code == 422, resp.text
        body = resp.json()
        assert body["field"] == "space" and "spaces folder" in body["detail"]
        assert "root:" not in body["detail"] and "install" not in body["detail"]
    resp = client.post("/v1/studies", json=spec(workload="pyproject.toml"), headers=admin)
    assert resp.status_code == 422 and resp.json()["field"] == "workload"
    assert client.post("/v1/studies", json=spec(), headers=admin).status_code == 201

"""The container stack: docker/compose.yaml validated, docker/Dockerfile built and run.

The image is built with rootful podman ``FROM`` a Debian base made with mmdebstrap (no
registry is reachable here; see :mod:`tests.docker.podman`), then run as a user would run it:
``cubic db upgrade`` in a container, the API container (several uvicorn processes, healthy
by its own HEALTHCHECK), a study of the shipped ones submitted over HTTP, and a containerised
simulated worker that serves it to the end. PostgreSQL is a cluster of the test's own on
this host (a ``postgres`` image needs a registry), reached over the host's network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cubic.bench.pgcluster import PgCluster, can_run_postgres
from cubic.bench.service import free_port
from tests.docker import podman
from tests.requirements import need
from tests.service.test_health import parse_exposition

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "compose.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
IMAGE = "localhost/cubic-test:latest"
BUILDER = "localhost/cubic-test:build"
STUDY = REPO / "search_spaces" / "llama3_8b.study.yaml"
TRIALS = 8

BUILD_S = 1800
"""The first build downloads cubic's dependencies; later ones reuse podman's layers."""
READY_S = 240
STUDY_S = 600
"""Bounds on the waits, generous: a loaded 2-core machine."""

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("podman")]


def _compose(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker-compose", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_compose_file_is_valid_and_scales_its_workers(tmp_path: Path) -> None:
    need(
        "podman",
        shutil.which("docker-compose") is not None,
        "docker-compose is not installed (apt-get install --no-install-recommends docker-compose)",
    )
    checked = _compose("-f", str(COMPOSE), "config", "-q")
    assert checked.returncode == 0, checked.stderr
    config = yaml.safe_load(_compose("-f", str(COMPOSE), "config").stdout)
    services = config["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert "pgdata" in config["volumes"]
    assert any(v.startswith("pgdata:") for v in services["postgres"]["volumes"])
    assert services["migrate"]["command"] == ["cubic", "db", "upgrade"]
    assert services["api"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    assert services["worker"]["depends_on"]["api"]["condition"] == "service_healthy"
    # --scale worker=N: no fixed name or host port may stand in the way
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]
    assert "--workers" not in services["api"]["command"]  # CUBIC_API_WORKERS says how many
    assert int(services["api"]["environment"]["CUBIC_API_WORKERS"]) > 1
    # the string (CMD-SHELL) form, which podman-compose 1.0 reads correctly
    for name in ("postgres", "api"):
        assert isinstance(services[name]["healthcheck"]["test"], str), name
    # every variable of the example .env is one the compose file reads
    example = (REPO / "docker" / ".env.example").read_text()
    names = [ln.split("=", 1)[0] for ln in example.splitlines() if ln and ln[0] != "#"]
    text = COMPOSE.read_text()
    unread = [n for n in names if "${" + n not in text and n != "COMPOSE_PROJECT_NAME"]
    assert not unread, f"docker/.env.example sets what compose.yaml never reads: {unread}"
    with_example = _compose("--env-file", "docker/.env.example", "-f", str(COMPOSE), "config")
    assert with_example.returncode == 0, with_example.stderr
    # and a broken file is refused, naming what is wrong
    bad = tmp_path / "compose.yaml"
    bad.write_text(text.replace("  init: true", "  inti: true", 1))
    refused = _compose("-f", str(bad), "config", "-q", cwd=tmp_path)
    assert refused.returncode != 0 and "'inti'" in refused.stderr, refused.stderr


class Containers:
    """Containers started by one test, removed at its end whatever happened."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.tag = uuid.uuid4().hex[:8]
        self.names: list[str] = []

    def run(self, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return podman.run(self.env, ["run", "--rm", "--network", "host", *args], timeout)

    def start(self, name: str, args: list[str]) -> str:
        full = f"cubic-test-{name}-{self.tag}"
        self.names.append(full)
        podman.run(self.env, ["run", "-d", "--name", full, "--network", "host", *args], 120)
        return full

    def running(self, name: str) -> bool:
        state = podman.run(self.env, ["inspect", "--format", "{{.State.Running}}", name], 60)
        return state.stdout.strip() == "true"

    def logs(self, name: str) -> str:
        out = podman.run(self.env, ["logs", name], 60, check=False)
        return (out.stdout + out.stderr)[-4000:]

    def remove(self) -> None:
        for name in reversed(self.names):
            podman.run(self.env, ["rm", "-f", "-t", "5", name], 120, check=False)


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[Containers]:
    reason = podman.missing()
    need("podman", reason is None, reason or "")
    pg = can_run_postgres()
    need("podman", pg is None, f"the test's PostgreSQL cannot start: {pg}")
    made = Containers(podman.environment(tmp_path))
    try:
        yield made
    finally:
        made.remove()


def _build(env: dict[str, str], tmp_path: Path) -> float:
    """Build both stages under tags of their own, removing what the tags held before (a
    rebuild after an edit would otherwise leave an image behind per run; the layers a
    rebuild reuses stay)."""
    base = podman.trusting_base(env, podman.base_image(env), tmp_path)
    t0 = time.monotonic()
    for target, tag in (("build", BUILDER), (None, IMAGE)):
        old = podman.run(env, ["image", "inspect", "--format", "{{.Id}}", tag], 60, check=False)
        stage = ["--target", target] if target else []
        podman.run(
            env,
            [
                *("build", "--format", "docker", "--build-arg", f"BASE_IMAGE={base}", *stage),
                *("-f", str(DOCKERFILE), "-t", tag, str(REPO)),
            ],
            BUILD_S,
        )
        new = podman.run(env, ["image", "inspect", "--format", "{{.Id}}", tag], 60).stdout
        if old.returncode == 0 and old.stdout.strip() != new.strip():
            podman.run(env, ["rmi", old.stdout.strip()], 120, check=False)
    return time.monotonic() - t0


def _wait(what: str, ready: Any, timeout: float, why: Any = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s\n{why()}")
        time.sleep(1.0)


def test_the_image_runs_a_study_to_the_end(containers: Containers, tmp_path: Path) -> None:
    seconds = _build(containers.env, tmp_path)
    print(f"image built in {seconds:.0f} s")
    inspected = json.loads(podman.run(containers.env, ["image", "inspect", IMAGE], 60).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "cubic"  # never root
    check = inspected.get("Healthcheck") or config.get("Healthcheck")  # podman: top level
    assert check and check["Test"][0] == "CMD-SHELL", inspected
    assert containers.run([IMAGE, "id", "-u"], 120).stdout.strip() != "0"

    cluster = PgCluster()
    try:
        cluster.start()
        db = ["-e", f"CUBIC_DATABASE_URL={cluster.url}"]
        migrated = containers.run([*db, IMAGE, "cubic", "db", "upgrade"])
        assert "database at revision" in migrated.stdout
        made = containers.run([*db, IMAGE, "cubic", "token", "create", "--role", "admin", "--json"])
        token = json.loads(made.stdout)["token"]

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}"}
        api = containers.start(
            "api", [*db, "-e", f"CUBIC_PORT={port}", "-e", "CUBIC_API_WORKERS=2", IMAGE]
        )

        def ready() -> bool:
            assert containers.running(api), containers.logs(api)
            try:
                return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        _wait("the API container answering /readyz", ready, READY_S, lambda: containers.logs(api))
        healthy = podman.run(containers.env, ["healthcheck", "run", api], 120, check=False)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        # it listens on every interface: tokens are required
        assert httpx.get(f"{url}/v1/studies", timeout=30).status_code == 401

        spec = yaml.safe_load(STUDY.read_text())
        spec["budget"] = {"max_trials": TRIALS, "max_parallel": 4}
        created = httpx.post(f"{url}/v1/studies", json=spec, headers=headers, timeout=60)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]

        worker = containers.start(
            "worker",
            [
                *("-e", f"CUBIC_URL={url}", "-e", f"CUBIC_TOKEN={token}"),
                *(IMAGE, "cubic", "worker", "--parallel", "4"),
            ],
        )

        def study() -> dict[str, Any]:
            return httpx.get(f"{url}/v1/studies/{sid}", headers=headers, timeout=30).json()

        def done() -> bool:
            assert containers.running(worker), containers.logs(worker)
            return study()["state"] == "completed"

        _wait(f"study {sid} completed", done, STUDY_S, lambda: containers.logs(worker))
        trials = httpx.get(
            f"{url}/v1/studies/{sid}/trials", headers=headers, params={"limit": 100}, timeout=30
        ).json()["items"]
        finished = [t for t in trials if t["state"] in ("complete", "infeasible")]
        assert len(finished) >= TRIALS, [(t["number"], t["state"]) for t in trials]
        best = httpx.get(f"{url}/v1/studies/{sid}/best", headers=headers, timeout=30)
        assert best.status_code == 200 and best.json()["value"] > 0, best.text

        # /metrics adds up both API processes: every report is counted once
        page = parse_exposition(httpx.get(f"{url}/metrics", headers=headers, timeout=30).text)
        assert page["cubic_report_latency_seconds_count"] == sum(
            1 for t in trials if t["state"] in ("complete", "infeasible", "failed")
        )

        # the worker waits for the next study; SIGTERM ends it cleanly
        stopped = podman.run(containers.env, ["stop", "-t", "60", worker], 120)
        assert stopped.returncode == 0
        code = podman.run(
            containers.env, ["inspect", "--format", "{{.State.ExitCode}}", worker], 60
        ).stdout.strip()
        assert code == "0", containers.logs(worker)
        assert f"study {sid}: working on it" in containers.logs(worker)
    finally:
        cluster.remove()

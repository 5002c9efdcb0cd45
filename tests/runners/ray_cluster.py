"""A real local Ray head for the tests: one per session, stopped with everything it started.

``ray stop --force`` would kill every Ray process on the machine; this head is killed alone:
its processes are the ``ray start --block`` process's session and their descendants, anything
whose command line names the head's temporary directory, and job processes whose
``RAY_ADDRESS`` is this head (a job whose supervisor died is orphaned outside the session).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cubic.bench.service import free_port
from tests.requirements import need, required

START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class RayHead:
    address: str  # the dashboard (Jobs API) URL
    gcs_address: str
    temp_dir: Path
    pid: int


def ray_available() -> tuple[bool, str]:
    try:
        import ray.job_submission  # noqa: F401
    except ImportError as exc:
        return False, f"ray is not importable ({exc})"
    if not (Path(sys.executable).parent / "ray").is_file():
        return False, f"no 'ray' command next to {sys.executable}"
    return True, ""


def skip_module_without_ray() -> None:
    """Skip the calling test module when ray is missing (fail it where ray is required)."""
    ok, why = ray_available()
    if not ok:
        if required("ray"):
            pytest.fail(f"ray is required here (CUBIC_REQUIRE) but missing: {why}")
        pytest.skip(f"ray not available: {why}", allow_module_level=True)


@contextlib.contextmanager
def start_head(num_cpus: int = 2) -> Iterator[RayHead]:
    """Start a head with the dashboard on free ports; wait until a job runs on it."""
    # Ray's socket paths live under the temp dir and must stay under ~107 characters.
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    port, dashboard = free_port(), free_port()
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", RAY_USAGE_STATS_ENABLED="0")
    cmd = [
        str(bindir / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--num-cpus={num_cpus}",
        "--num-gpus=0",
        f"--object-store-memory={100 * 1024 * 1024}",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    out = (temp.parent / f"{temp.name}.log").open("wb")
    proc = subprocess.Popen(
        cmd, env=env, cwd=temp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    head = RayHead(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{port}", temp, proc.pid)
    try:
        _wait_ready(head, proc, Path(out.name))
        yield head
    finally:
        stop_head(head, proc)
        out.close()
        shutil.rmtree(temp, ignore_errors=True)
        Path(out.name).unlink(missing_ok=True)


def _wait_ready(head: RayHead, proc: subprocess.Popen[bytes], log: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + START_TIMEOUT_S
    client, last = None, ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}: {_tail(log)}")
        try:
            client = client or JobSubmissionClient(head.address)
            # A first job proves the agent, the supervisor and the worker pool are up.
            sid = client.submit_job(entrypoint="true")
            while time.monotonic() < deadline:
                status = str(client.get_job_status(sid))
                if status == "SUCCEEDED":
                    return
                if status in ("FAILED", "STOPPED"):
                    raise RuntimeError(f"warm-up job {status}: {client.get_job_logs(sid)}")
                time.sleep(0.2)
        # requests' ConnectionError (the dashboard closing a connection while it starts) is an
        # OSError, not the builtin ConnectionError.
        except (OSError, RuntimeError) as exc:
            last = str(exc)
            if "warm-up job" in last:
                raise
            time.sleep(0.5)
    raise RuntimeError(f"the Ray head did not answer in {START_TIMEOUT_S:.0f} s: {last}")


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def _psutil() -> Any:
    importlib.import_module("ray")  # puts Ray's bundled psutil on the path
    return importlib.import_module("psutil")


def _processes(head: RayHead) -> list[Any]:
    psutil = _psutil()
    found: dict[int, Any] = {}
    me = os.getpid()
    for p in psutil.process_iter():
        try:
            mine = os.getsid(p.pid) == head.pid or str(head.temp_dir) in " ".join(p.cmdline())
            if not mine and p.pid != me:
                mine = p.environ().get("RAY_ADDRESS") == head.gcs_address
        except (psutil.Error, OSError):
            continue
        if mine and p.pid != me:
            found[p.pid] = p
            with contextlib.suppress(psutil.Error):
                for child in p.children(recursive=True):
                    found.setdefault(child.pid, child)
    found.pop(me, None)
    return list(found.values())


def stop_head(head: RayHead, proc: subprocess.Popen[bytes]) -> None:
    """Kill this head and every process it started, as ``ray stop --force`` would.

    SIGTERM would make the raylet drain for up to 30 s; nothing here needs a graceful end.
    """
    psutil = _psutil()
    for _ in range(3):  # again, for what was forked while the first ones died
        procs = _processes(head)
        if not procs:
            break
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayHead]:
    ok, why = ray_available()
    need("ray", ok, why)
    try:
        head_cm = start_head()
        head = head_cm.__enter__()
    except RuntimeError as exc:
        need("ray", False, f"cannot start a local Ray head: {exc}")
        raise
    try:
        yield head
    finally:
        head_cm.__exit__(None, None, None)

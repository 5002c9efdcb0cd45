"""What the fault tests need: an API process that can be killed and started again on the same
port, worker processes as users run them (``cubic worker``), a PostgreSQL cluster of the
test's own that can be stopped, and the invariants of a study checked in SQL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from cubic.bench.service import free_port
from cubic.store.engine import make_engine

REPO = Path(__file__).resolve().parents[2]
FINISHED = {"complete", "infeasible", "failed", "pruned"}
NEXT = {  # the state changes the trial lifecycle allows
    None: {"waiting"},
    "waiting": {"running"},
    "running": FINISHED | {"waiting"},  # a released lease goes back to waiting
}


def wait_for(what: str, ok: Any, timeout: float, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


class ApiProcess:
    """``uvicorn`` serving cubic on ``db_url`` at a fixed port, so that a restart is the same
    address to its workers."""

    def __init__(self, db_url: str, log: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "CUBIC_DATABASE_URL": db_url,
            "CUBIC_REAP_INTERVAL_S": "1",
            "CUBIC_AUTH": "false",
            "CUBIC_SPACES_DIR": str(REPO / "search_spaces"),
            **env,
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> None:
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"),
                    *("--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"),
                ],
                env=self.env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the API exited: {self.log.read_text()[-2000:]}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for("the API to become ready", ready, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, as when a node dies."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def api_process(db_url: str, log: Path, **env: str) -> Iterator[ApiProcess]:
    api = ApiProcess(db_url, log, **env)
    api.start()
    try:
        yield api
    finally:
        api.stop()


class Workers:
    """``n`` processes of ``cubic worker`` (simulated runner, jobs of ``job_s`` seconds, or
    ``slow[i]`` for worker ``i``), each with its own worker id, outbox and log."""

    def __init__(
        self,
        url: str,
        study_id: int,
        n: int,
        folder: Path,
        job_s: float,
        lease_s: float,
        slow: dict[int, float] | None = None,
    ) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        steps = 20  # the simulated runner's default
        for i in range(n):
            scale = (slow or {}).get(i, job_s) / steps
            with (folder / f"worker-{i}.log").open("wb") as err:
                self.procs.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "cubic.cli", "worker", "--url", url),
                            *("--study", str(study_id), "--worker-id", f"w{i}"),
                            *("--time-scale", str(scale), "--seed", str(i)),
                            *("--lease-seconds", str(lease_s), "--outbox", str(folder / f"ob{i}")),
                        ],
                        cwd=REPO,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                )

    def kill(self, which: list[int]) -> None:
        for i in which:
            self.procs[i].send_signal(signal.SIGKILL)
            self.procs[i].wait(timeout=30)

    def wait(self, timeout: float) -> list[int | None]:
        """Exit codes once every worker has ended (bounded by ``timeout``)."""
        wait_for(
            "every worker to finish",
            lambda: all(p.poll() is not None for p in self.procs),
            timeout,
            every=0.5,
        )
        return [p.returncode for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def reported(self, which: list[int]) -> dict[int, str]:
        """Every report the service accepted, by trial id, from the workers' logs."""
        out: dict[int, str] = {}
        for i in which:
            log = (self.folder / f"worker-{i}.log").read_text()
            for tid, state in re.findall(r"trial (\d+): reported (\w+)", log):
                out[int(tid)] = state
        return out

    def log(self, i: int) -> str:
        return (self.folder / f"worker-{i}.log").read_text()


def running_by(db_url: str, study_id: int, worker_ids: list[str]) -> dict[int, str]:
    """The study's running trials held by ``worker_ids``: trial id to worker id."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, worker_id FROM cubic_trial WHERE study_id = :s "
                    "AND state = 'running'"
                ),
                {"s": study_id},
            ).all()
    except Exception:  # the database is down: nothing known to be held
        return {}
    finally:
        engine.dispose()
    return {r.id: r.worker_id for r in rows if r.worker_id in worker_ids}


def invariants(db_url: str, study_id: int, budget: int, reported: dict[int, str]) -> list[str]:
    """What must hold after any fault, read with plain SQL; returns what broke (empty: all)."""
    broken: list[str] = []
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            state = conn.execute(
                text("SELECT state FROM cubic_study WHERE id = :s"), {"s": study_id}
            ).scalar_one()
            trials = conn.execute(
                text("SELECT id, state, attempt FROM cubic_trial WHERE study_id = :s"),
                {"s": study_id},
            ).all()
            events = conn.execute(
                text(
                    "SELECT e.trial_id, e.from_state, e.to_state FROM cubic_trial_event e "
                    "JOIN cubic_trial t ON t.id = e.trial_id WHERE t.study_id = :s "
                    "ORDER BY e.id"
                ),
                {"s": study_id},
            ).all()
    finally:
        engine.dispose()
    if state != "completed":
        broken.append(f"study is {state}, not completed")
    first = sum(1 for t in trials if t.attempt == 1)
    if first != budget:
        broken.append(f"{first} first attempts for a budget of {budget}")
    by_id = {t.id: t.state for t in trials}
    unfinished = [t.id for t in trials if t.state not in FINISHED]
    if unfinished:
        broken.append(f"unfinished trials {unfinished}")
    chains: dict[int, list[tuple[str | None, str]]] = {}
    for e in events:
        chains.setdefault(e.trial_id, []).append((e.from_state, e.to_state))
    for tid, chain in chains.items():
        leases = sum(1 for _, to in chain if to == "running")
        released = sum(1 for frm, to in chain if frm == "running" and to == "waiting")
        if leases - released > 1:
            broken.append(f"trial {tid} leased {leases} times ({released} released)")
        prev: str | None = None
        for frm, to in chain:
            if frm != prev or to not in NEXT.get(frm, set()):
                broken.append(f"trial {tid}: change {frm} -> {to} after {prev}")
            prev = to
        if prev != by_id.get(tid):
            broken.append(f"trial {tid}: events end in {prev}, the row says {by_id.get(tid)}")
    lost = {tid: s for tid, s in reported.items() if by_id.get(tid) != s}
    if lost:
        broken.append(f"accepted reports not stored: {lost}")
    return broken

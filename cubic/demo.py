"""``cubic demo``: a whole study against the simulated cluster.

By default the real system on one machine: the API on a SQLite file in one process, simulated
workers in others, the study submitted and watched over HTTP. ``--in-process`` runs worker
threads against the tuner directly, with no service. Only the jobs are simulated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cubic.bench.service import free_port
from cubic.client import CubicClient
from cubic.errors import CubicError
from cubic.progress import watch_study
from cubic.shipped import SHIPPED_DIR
from cubic.sim.job import run_job
from cubic.store import Store
from cubic.store.schema import upgrade
from cubic.study import StudySpec, load_spec
from cubic.tuner import Tuner

DEFAULT_STUDY = SHIPPED_DIR / "llama3_70b.study.yaml"


def run_worker(
    tuner: Tuner, study_id: int, worker_id: str, seed: int, stop: threading.Event, on_done=None
) -> int:
    """Lease, run and report trials until the study has nothing left to propose."""
    resolved = tuner.resolved(study_id)
    done = 0
    while not stop.is_set():
        leased = tuner.ask(study_id, worker_id, 1)
        if not leased:
            if tuner.store.get_study(study_id).state != "running":
                break
            time.sleep(0.05)  # others hold the last trials; a retry may still come back
            continue
        for t in leased:
            outcome = run_job(resolved.workload, t.params, seed=seed * 1_000_003 + t.id)
            tuner.tell(t.id, t.lease_token, outcome)
            done += 1
            if on_done is not None:
                on_done(t, outcome)
    return done


def run_demo(
    study_file: Path | None = None,
    *,
    trials: int | None = None,
    workers: int = 4,
    db: str | None = None,
    seed: int = 0,
    console: Console | None = None,
) -> int:
    console = console or Console()
    spec, base = demo_spec(study_file, trials, seed)
    tmp = None
    if db is None:
        tmp = tempfile.mkdtemp(prefix="cubic-demo-")
        db = f"sqlite:///{tmp}/cubic.db"
    store = Store.create(db)
    tuner = Tuner(store)
    study = tuner.create_study(spec, base)
    r = tuner.resolved(study.id)
    wl = r.workload
    console.print(
        f"[bold]cubic demo[/bold]: study {study.id} '{spec.name}': "
        f"{wl.name} on {wl.cluster.num_gpus}x {wl.cluster.gpu}, "
        f"strategy {spec.strategy.name}, {spec.budget.max_trials} trials, "
        f"{workers} simulated workers"
    )
    metric = spec.objectives[0].metric
    stop = threading.Event()
    lock = threading.Lock()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("trials", total=spec.budget.max_trials)
        best = {"v": None}

        def on_done(t, outcome) -> None:
            with lock:
                v = outcome.metrics.get(metric) if outcome.state == "complete" else None
                if v is not None and (best["v"] is None or v > best["v"]):
                    best["v"] = v
                if t.attempt == 1:
                    progress.advance(task)
                shown = f"{best['v']:,.0f}" if best["v"] is not None else "-"
                progress.update(task, description=f"trials (best {metric} {shown})")

        threads = [
            threading.Thread(
                target=run_worker, args=(tuner, study.id, f"demo-{i}", seed, stop, on_done)
            )
            for i in range(workers)
        ]
        for th in threads:
            th.start()
        try:
            for th in threads:
                th.join()
        except KeyboardInterrupt:
            stop.set()
            raise
    counts = store.count_trials(study.id)
    console.print("trials by state: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v))
    b = tuner.best(study.id)
    if b is None:
        console.print("[red]no trial completed[/red]")
        return 1
    from cubic.cli import print_best

    print_best(
        {
            "metric": metric,
            "trial": {"number": b.trial.number, "params": b.trial.params},
            "value": b.value,
            "baseline_value": b.baseline_value,
            "speedup": b.speedup,
        },
        console,
    )
    console.print(f"database: {db}")
    return 0


def demo_spec(study_file: Path | None, trials: int | None, seed: int) -> tuple[StudySpec, Path]:
    """The demo's study file with the seed (and, if given, the trial budget) overridden."""
    spec, base = load_spec(study_file or DEFAULT_STUDY)
    updates: dict[str, Any] = {"strategy": spec.strategy.model_copy(update={"seed": seed})}
    if trials is not None:
        updates["budget"] = spec.budget.model_copy(update={"max_trials": trials})
    return spec.model_copy(update=updates), base


def _wait_ready(client: CubicClient, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CubicError(f"the demo service exited with status {proc.returncode}")
        try:
            client._http.get("/readyz").raise_for_status()
            return
        except Exception:
            time.sleep(0.2)
    raise CubicError("the demo service did not become ready in time")


def run_service_demo(
    study_file: Path | None = None,
    *,
    trials: int | None = None,
    workers: int = 4,
    db: str | None = None,
    seed: int = 0,
    port: int = 0,
    console: Console | None = None,
) -> int:
    """The whole system on one machine: the API on SQLite, simulated workers, a study."""
    console = console or Console()
    spec, base = demo_spec(study_file, trials, seed)
    resolved = spec.resolve(base)
    if db is None:
        db = f"sqlite:///{tempfile.mkdtemp(prefix='cubic-demo-')}/cubic.db"
    upgrade(db)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    cli = [sys.executable, "-m", "cubic.cli"]
    env = {**os.environ, "CUBIC_DATABASE_URL": db, "CUBIC_URL": url}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            subprocess.Popen(
                [*cli, "serve", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
        with CubicClient(url) as client:
            _wait_ready(client, procs[0])
            study = client.create_study(resolved.spec.model_dump(mode="json"))
            wl = resolved.workload
            console.print(f"[bold]cubic demo[/bold]: service at {url} (SQLite: {db})")
            console.print(
                f"study {study['id']} '{study['name']}': {wl.name} on "
                f"{wl.cluster.num_gpus}x {wl.cluster.gpu}, strategy "
                f"{resolved.spec.strategy.name}, "
                f"{resolved.spec.budget.max_trials} trials, {workers} workers"
            )
            for i in range(workers):
                procs.append(
                    subprocess.Popen(
                        [
                            *cli,
                            "worker",
                            "--study",
                            str(study["id"]),
                            "--runner",
                            "simulated",
                            "--worker-id",
                            f"demo-worker-{i}",
                            "--seed",
                            str(seed),
                            "--log-level",
                            "warning",
                        ],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                    )
                )
            final = watch_study(client, study["id"], console)
            counts = final["progress"]["counts"]
            console.print(
                "trials by state: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
            )
            from cubic.cli import print_best

            print_best(client.best(study["id"]), console)
        console.print(f"API docs: {url}/docs   (the service stops when the demo ends)")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()

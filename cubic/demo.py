"""``cubic demo``: a whole study run in-process against the simulated cluster.

Several worker threads lease, run and report trials through the same tuner and SQLite file a
real deployment would use; only the job is simulated.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cubic.sim.job import run_job
from cubic.store import Store
from cubic.study import load_spec
from cubic.tuner import Tuner

DEFAULT_STUDY = Path(__file__).resolve().parent.parent / "search_spaces" / "llama3_70b.study.yaml"


def run_worker(tuner: Tuner, study_id: int, worker_id: str, seed: int,
               stop: threading.Event, on_done=None) -> int:
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


def run_demo(study_file: Path | None = None, *, trials: int | None = None, workers: int = 4,
             db: str | None = None, seed: int = 0, console: Console | None = None) -> int:
    console = console or Console()
    spec, base = load_spec(study_file or DEFAULT_STUDY)
    updates = {"strategy": spec.strategy.model_copy(update={"seed": seed})}
    if trials is not None:
        updates["budget"] = spec.budget.model_copy(update={"max_trials": trials})
    spec = spec.model_copy(update=updates)
    tmp = None
    if db is None:
        tmp = tempfile.mkdtemp(prefix="cubic-demo-")
        db = f"sqlite:///{tmp}/cubic.db"
    store = Store.create(db)
    tuner = Tuner(store)
    study = tuner.create_study(spec, base)
    r = tuner.resolved(study.id)
    wl = r.workload
    console.print(f"[bold]cubic demo[/bold]: study {study.id} '{spec.name}': "
                  f"{wl.name} on {wl.cluster.num_gpus}x {wl.cluster.gpu}, "
                  f"strategy {spec.strategy.name}, {spec.budget.max_trials} trials, "
                  f"{workers} simulated workers")
    metric = spec.objectives[0].metric
    stop = threading.Event()
    lock = threading.Lock()
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
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

        threads = [threading.Thread(target=run_worker,
                                    args=(tuner, study.id, f"demo-{i}", seed, stop, on_done))
                   for i in range(workers)]
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
    from cubic.cli import _print_best

    _print_best(metric, b)
    console.print(f"database: {db}")
    return 0

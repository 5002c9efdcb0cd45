"""``cubic bench service``: many workers against several API processes on PostgreSQL.

Starts ``uvicorn --workers N`` on a fresh PostgreSQL schema, creates a study, and runs
``workers`` processes that each lease one trial, run it on the simulated cluster and report
it, until the budget is spent. It then checks the invariants a user relies on (every trial
leased exactly once per attempt, every report stored, the study completed) and prints lease
and report latency (p50, p99) and trials per second. As the reference, the same number of
processes runs the same budget through Optuna's RDBStorage (``ask``/``tell``) on the same
server, the way one would without cubic.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

SPACE = "llm_pretrain.yaml"


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_schema(base_url: str) -> Any:
    """A URL on a fresh PostgreSQL schema, dropped afterwards."""
    from cubic.store.engine import temporary_schema

    return temporary_schema(base_url, prefix="cubic_bench")


@contextmanager
def api_server(db_url: str, api_workers: int) -> Iterator[str]:
    """``uvicorn --workers N`` serving cubic on ``db_url``; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "CUBIC_DATABASE_URL": db_url,
        "CUBIC_REAP_INTERVAL_S": "2",
        "CUBIC_AUTH": "false",  # on loopback, for this process's own clients
    }
    # a file, not a pipe: nobody reads a pipe while the server runs, and a full one blocks it
    with tempfile.TemporaryFile() as errors:
        yield from _serve(api_workers, env, port, errors)


def _serve(api_workers: int, env: dict[str, str], port: int, errors: Any) -> Iterator[str]:
    import httpx

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "service.app:create_app",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(api_workers),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                errors.seek(0)
                raise RuntimeError(f"uvicorn exited: {errors.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not become ready within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def study_spec(trials: int, workers: int, strategy: str) -> dict[str, Any]:
    from pathlib import Path

    from cubic.study import parse_spec

    spaces = Path(__file__).resolve().parents[2] / "search_spaces"
    spec = parse_spec(
        {
            "name": "service-bench",
            "workload": {"preset": "llama3_8b", "cluster": {"gpu": "h100_sxm", "num_gpus": 16}},
            "space": str(spaces / SPACE),
            "objective": "tokens_per_s",
            "budget": {"max_trials": trials, "max_parallel": workers},
            "strategy": {"name": strategy, "seed": 0},
            "max_retries": 3,
        }
    )
    return spec.resolve().spec.model_dump(mode="json")


def _cubic_worker(args: tuple[str, int, int, str]) -> dict[str, Any]:
    """One worker process: lease one trial at a time, run it, report it, timing each call."""
    from cubic.client import CubicClient
    from cubic.sim.job import run_job
    from cubic.workload import Workload

    url, study_id, index, workload_json = args
    import json

    workload = Workload.from_dict(json.loads(workload_json))
    lease_s, report_s, reported = [], [], []
    idle_since = None
    with CubicClient(url, timeout=120) as client:
        while True:
            t0 = time.perf_counter()
            leased = client.lease(study_id, f"bench-{index}", 1, 120.0)
            lease_s.append(time.perf_counter() - t0)
            if not leased:
                idle_since = idle_since or time.monotonic()
                if client.get_study(study_id)["state"] != "running":
                    break
                if time.monotonic() - idle_since > 60:
                    break
                time.sleep(0.05)
                continue
            idle_since = None
            t = leased[0]
            out = run_job(workload, t["params"], seed=t["id"])
            t0 = time.perf_counter()
            client.report(
                t["id"],
                t["lease_token"],
                out.state,
                metrics=out.metrics,
                error=out.error,
                log_tail=out.log_tail,
            )
            report_s.append(time.perf_counter() - t0)
            reported.append((t["id"], t["attempt"], out.state))
    return {"lease_s": lease_s, "report_s": report_s, "reported": reported}


def _optuna_worker(args: tuple[str, str, int, int, str]) -> dict[str, Any]:
    """The reference: the same loop through Optuna's RDBStorage ask/tell."""
    import json

    import optuna

    from cubic.sim.job import run_job
    from cubic.space import Space
    from cubic.workload import Workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db_url, name, budget, seed, payload = args
    data = json.loads(payload)
    workload = Workload.from_dict(data["workload"])
    space = Space.from_dict(data["space"])
    dists = space.optuna_distributions()
    ctx = workload.context()
    ask_s, tell_s, errors = [], [], 0
    causes: list[str] = []

    def retried(fn: Any, *a: Any, **kw: Any) -> Any:
        # Under many writers RDBStorage's commits can fail (deadlocks, conflicts); a user
        # would retry, so the reference does too and counts the errors.
        nonlocal errors
        for attempt in range(10):
            try:
                return fn(*a, **kw)
            except (optuna.exceptions.StorageInternalError, RuntimeError) as exc:
                errors += 1
                causes.append(repr(exc.__cause__)[:300])
                time.sleep(0.05 * (attempt + 1))
        raise RuntimeError("RDBStorage kept failing: " + "; ".join(causes[-3:]))

    # 64 processes opening RDBStorage at once race on its schema set-up commit: retried.
    storage = retried(
        optuna.storages.RDBStorage, db_url, engine_kwargs={"pool_size": 2, "max_overflow": 0}
    )
    study = retried(
        optuna.load_study,
        study_name=name,
        storage=storage,
        sampler=optuna.samplers.RandomSampler(seed=seed),
    )
    while True:
        t0 = time.perf_counter()
        n_done = len(retried(study.get_trials, deepcopy=False))
        if n_done >= budget:
            break
        trial = retried(study.ask, dists)
        ask_s.append(time.perf_counter() - t0)
        cfg = space.complete(dict(trial.params), ctx)
        out = run_job(workload, cfg, seed=trial.number)
        t0 = time.perf_counter()
        if out.state == "complete":
            retried(study.tell, trial, out.metrics["tokens_per_s"], skip_if_finished=True)
        else:
            retried(study.tell, trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        tell_s.append(time.perf_counter() - t0)
    return {"lease_s": ask_s, "report_s": tell_s, "reported": [], "errors": errors}


def _max_connections(db_url: str) -> int:
    from cubic.store.engine import make_engine

    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SHOW max_connections").scalar_one())
    finally:
        engine.dispose()


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q)) if xs else float("nan")


def _summary(name: str, results: list[dict[str, Any]], wall: float, trials: int) -> dict[str, Any]:
    errors = sum(r.get("errors", 0) for r in results)
    lease = [x for r in results for x in r["lease_s"]]
    report = [x for r in results for x in r["report_s"]]
    return {
        "system": name,
        "trials": trials,
        "wall_s": wall,
        "trials_per_s": trials / wall,
        "lease_p50_ms": _pct(lease, 50),
        "lease_p99_ms": _pct(lease, 99),
        "report_p50_ms": _pct(report, 50),
        "report_p99_ms": _pct(report, 99),
        "lease_calls": len(lease),
        "report_calls": len(report),
        "storage_errors": errors,
    }


def check_invariants(
    db_url: str, study_id: int, reported: list[tuple[int, int, str]]
) -> dict[str, Any]:
    """Every trial leased once per attempt, every report stored, the study completed."""
    from cubic.store import Store

    with Store(db_url) as store:
        trials = store.list_trials(study_id)
        by_id = {t.id: t for t in trials}
        leases_per_trial = {
            t.id: sum(1 for e in store.trial_events(t.id) if str(e.to_state) == "running")
            for t in trials
        }
        study = store.get_study(study_id)
    lost = [tid for tid, _, state in reported if str(by_id[tid].state) != state]
    multi = {
        tid: n
        for tid, n in leases_per_trial.items()
        if n != 1 and str(by_id[tid].state) != "waiting"
    }
    return {
        "trials": len(trials),
        "study_state": str(study.state),
        "lost_reports": lost,
        "trials_leased_not_once": multi,
        "unfinished": [t.id for t in trials if str(t.state) in ("waiting", "running")],
    }


def bench_service(
    pg_url: str,
    *,
    trials: int = 500,
    workers: int = 64,
    api_workers: int = 4,
    strategy: str = "random",
    reference: bool = True,
) -> dict[str, Any]:
    """Run cubic and (optionally) the Optuna reference; return figures and invariant checks."""
    import json

    from cubic.client import CubicClient
    from cubic.store.schema import upgrade

    out: dict[str, Any] = {}
    ctx = mp.get_context("spawn")
    with pg_schema(pg_url) as db_url:
        upgrade(db_url)
        spec = study_spec(trials, workers, strategy)
        with api_server(db_url, api_workers) as url:
            with CubicClient(url) as client:
                study_id = client.create_study(spec)["id"]
            args = [(url, study_id, i, json.dumps(spec["workload"])) for i in range(workers)]
            t0 = time.perf_counter()
            with ctx.Pool(workers) as pool:
                results = pool.map(_cubic_worker, args)
            wall = time.perf_counter() - t0
        reported = [r for res in results for r in res["reported"]]
        out["cubic"] = _summary(
            f"cubic ({api_workers} API processes)", results, wall, len(reported)
        )
        out["invariants"] = check_invariants(db_url, study_id, reported)
    if reference:
        import optuna

        with pg_schema(pg_url) as db_url:
            name = "optuna-reference"
            optuna.create_study(study_name=name, storage=db_url, direction="maximize")
            payload = json.dumps({"workload": spec["workload"], "space": spec["space"]})
            # RDBStorage needs two connections per process (it nests sessions): 64 direct
            # clients would exhaust PostgreSQL's default max_connections of 100, which
            # cubic's workers never touch. The reference uses as many as the server allows.
            n_ref = min(workers, max(1, (_max_connections(db_url) - 10) // 2))
            args2 = [(db_url, name, trials, i, payload) for i in range(n_ref)]
            t0 = time.perf_counter()
            with ctx.Pool(n_ref) as pool:
                results = pool.map(_optuna_worker, args2)
            wall = time.perf_counter() - t0
            n = len(optuna.load_study(study_name=name, storage=db_url).get_trials())
            out["optuna"] = _summary(
                f"Optuna RDBStorage ({n_ref} direct clients)", results, wall, n
            )
    return out

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
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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


#: How long a benchmark waits for its API server to answer /readyz: generous, since a
#: loaded machine (a test suite or another benchmark beside it) can take minutes to start it.
SERVER_READY_S = 300.0

_SERVERS: dict[str, tuple[int, int]] = {}  # base URL -> (uvicorn's pid, API processes)


@contextmanager
def api_server(
    db_url: str, api_workers: int, extra_env: dict[str, str] | None = None
) -> Iterator[str]:
    """``uvicorn --workers N`` serving cubic on ``db_url``; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "CUBIC_DATABASE_URL": db_url,
        "CUBIC_REAP_INTERVAL_S": "2",
        "CUBIC_AUTH": "false",  # on loopback, for this process's own clients
        **(extra_env or {}),
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
        deadline = time.monotonic() + SERVER_READY_S
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
                raise RuntimeError(f"uvicorn did not become ready within {SERVER_READY_S:g} s")
            time.sleep(0.2)
        _SERVERS[url] = (proc.pid, api_workers)
        yield url
    finally:
        _SERVERS.pop(url, None)
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


def _rss_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return None


def api_rss_mib(url: str, *, background: bool = False) -> list[float]:
    """Resident memory (MiB) of each API process serving ``url`` (Linux ``/proc``); with
    ``background``, of the processes those start for proposing and fitting instead."""
    if url not in _SERVERS:
        return []
    pid, workers = _SERVERS[url]
    # One API process is uvicorn's own; with more, uvicorn starts them as its children.
    procs = [pid] if workers == 1 else _spawned(pid)
    if background:
        procs = [g for p in procs for g in _spawned(p)]
    return [m for p in procs if (m := _rss_mib(p)) is not None]


def _spawned(pid: int) -> list[int]:
    """The processes ``pid`` started with multiprocessing's spawn: uvicorn's workers, or an
    API process's background process (not the resource tracker beside them)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return [k for k in kids if "spawn_main" in _cmdline(k)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _cubic_worker(args: tuple[str, int, int, str, float, int, Any]) -> dict[str, Any]:
    """One worker process: lease one trial at a time, run it, report it, timing each call.

    Each job holds the worker ``job_s`` seconds after the simulator has answered, as a
    trial's run would (the Optuna reference's jobs hold theirs as long).

    Beside each call's time on the worker's clock it keeps the service's own, from the
    answer's ``Server-Timing`` header: on a machine shared by the service and many worker
    processes, the difference is the worker's wait for a core.

    It waits after a short lease as ``cubic worker`` does (:func:`cubic.retry.lease_wait`
    of the lease's ``retry_after_s``), and starts only when
    every worker is ready, so that start-up is not counted.
    """
    import json

    from cubic.client import CubicClient
    from cubic.retry import lease_wait
    from cubic.sim.job import run_job
    from cubic.workload import Workload
    from service.timing import app_ms

    url, study_id, index, workload_json, job_s, nice, barrier = args
    _lower_priority(nice)
    workload = Workload.from_dict(json.loads(workload_json))
    rng, short = random.Random(index), 0
    calls: list[tuple[float, str, float]] = []  # (wall time at the end, kind, seconds)
    served: list[tuple[float, str, float]] = []  # the same, by the service's clock
    last: list[float | None] = [None]  # the newest answer's Server-Timing, in seconds

    def timed(resp: Any) -> None:
        ms = app_ms(resp.headers.get("server-timing"))
        last[0] = None if ms is None else ms / 1e3

    def record(kind: str, t0: float) -> None:
        calls.append((time.time(), kind, time.perf_counter() - t0))
        if last[0] is not None:
            served.append((calls[-1][0], kind, last[0]))

    reported = []
    with CubicClient(url, timeout=120, on_response=timed) as client:
        client.get_study(study_id)  # connected and warm
        barrier.wait(600)
        start = time.time()
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            answer = client.lease_batch(study_id, f"bench-{index}", 1, 120.0)
            record("lease", t0)
            if not answer["trials"]:
                if answer["study_state"] != "running":
                    break
                short += 1
                time.sleep(lease_wait(answer.get("retry_after_s") or 0.25, short, rng))
                continue
            short = 0
            t = answer["trials"][0]
            out = run_job(workload, t["params"], seed=t["id"])
            time.sleep(job_s)
            t0 = time.perf_counter()
            client.report(
                t["id"],
                t["lease_token"],
                out.state,
                metrics=out.metrics,
                error=out.error,
                log_tail=out.log_tail,
            )
            record("report", t0)
            reported.append((t["id"], t["attempt"], out.state))
    return _client_result(calls, start, served=served, reported=reported)


def _client_result(calls: list[Any], start: float, **more: Any) -> dict[str, Any]:
    """What a client process hands back: its calls, its nice value, when it ran."""
    nice = os.nice(0) if hasattr(os, "nice") else 0
    return {"calls": calls, **more, "nice": nice, "start": start, "end": time.time()}


def _lower_priority(nice: int) -> None:
    """Run this client process ``nice`` levels below the servers (see :func:`bench_service`)."""
    if nice and hasattr(os, "nice"):
        os.nice(nice)


def optuna_sampler(strategy: str, seed: int) -> Any:
    """The Optuna sampler the reference uses for a cubic strategy (TPE stands in for the
    strategies Optuna does not have)."""
    import optuna

    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if strategy == "qmc":
        return optuna.samplers.QMCSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _optuna_worker(args: tuple[str, str, int, int, str, str, float, int, Any]) -> dict[str, Any]:
    """The reference: the same loop through Optuna's RDBStorage ask/tell, stopping once the
    study has ``budget`` finished trials (what ``MaxTrialsCallback`` checks)."""
    import json

    import optuna

    from cubic.sim.job import run_job
    from cubic.space import Space
    from cubic.workload import Workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db_url, name, budget, seed, payload, strategy, job_s, nice, barrier = args
    _lower_priority(nice)
    data = json.loads(payload)
    workload = Workload.from_dict(data["workload"])
    space = Space.from_dict(data["space"])
    ctx = workload.context()
    fixed = space.fixed(ctx)  # knobs the hardware rules out, as the service's samplers skip
    dists = {k: d for k, d in space.optuna_distributions().items() if k not in fixed}
    calls: list[tuple[float, str, float]] = []
    errors = 0
    causes: list[str] = []
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)

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

    # Many processes opening RDBStorage at once race on its schema set-up commit: retried.
    storage = retried(
        optuna.storages.RDBStorage, db_url, engine_kwargs={"pool_size": 2, "max_overflow": 0}
    )
    study = retried(
        optuna.load_study,
        study_name=name,
        storage=storage,
        sampler=optuna_sampler(strategy, seed),
    )
    told = 0
    barrier.wait(600)
    start = time.time()
    while len(retried(study.get_trials, deepcopy=False, states=finished)) < budget:
        t0 = time.perf_counter()
        trial = retried(study.ask, dists)
        calls.append((time.time(), "lease", time.perf_counter() - t0))
        cfg = space.complete(dict(trial.params), ctx)
        out = run_job(workload, cfg, seed=trial.number)
        time.sleep(job_s)
        t0 = time.perf_counter()
        if out.state == "complete":
            retried(study.tell, trial, out.metrics["tokens_per_s"], skip_if_finished=True)
        else:
            retried(study.tell, trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        calls.append((time.time(), "report", time.perf_counter() - t0))
        told += 1
    return _client_result(calls, start, told=told, errors=errors)


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


def _latency(calls: list[tuple[float, str, float]], by: str = "") -> dict[str, float]:
    """p50/p95/p99 (ms) and count of each kind of call; ``by`` names whose clock timed them
    (empty: the client's)."""
    out: dict[str, float] = {}
    for kind in ("lease", "report"):
        xs = [s for _, k, s in calls if k == kind]
        for q in (50, 95, 99):
            out[f"{kind}{by}_p{q}_ms"] = _pct(xs, q)
        if not by:
            out[f"{kind}_calls"] = len(xs)
    return out


def _summary(name: str, results: list[dict[str, Any]], trials: int) -> dict[str, Any]:
    """Trials/s from the moment every worker was ready to the last one's end."""
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    calls = [c for r in results for c in r["calls"]]
    served = [c for r in results for c in r.get("served", [])]
    return {
        "system": name,
        "clients": len(results),
        "trials": trials,
        "wall_s": wall,
        "trials_per_s": trials / wall if wall > 0 else float("nan"),
        **_latency(calls),
        **(_latency(served, "_server") if served else {}),
        "storage_errors": sum(r.get("errors", 0) for r in results),
        "client_nice": sorted({r.get("nice", 0) for r in results}),
    }


def windows(results: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """Latency and throughput per window of ``size`` reports, in report order: whether a
    call's cost grows with the study's history."""
    calls = sorted((c for r in results for c in r["calls"]), key=lambda c: c[0])
    served = [c for r in results for c in r.get("served", [])]
    reports = [t for t, k, _ in calls if k == "report"]
    out = []
    for k in range(0, len(reports) - size + 1, size):
        lo, hi = reports[k], reports[k + size - 1]
        inside = [c for c in calls if lo <= c[0] <= hi]
        out.append(
            {
                "trials": f"{k}-{k + size}",
                "trials_per_s": size / (hi - lo) if hi > lo else float("nan"),
                **_latency(inside),
                **(_latency([c for c in served if lo <= c[0] <= hi], "_server") if served else {}),
            }
        )
    return out


def check_invariants(
    db_url: str, study_id: int, reported: list[tuple[int, int, str]]
) -> dict[str, Any]:
    """Every trial leased once per attempt, every report stored, the study completed, and
    the counts the service keeps equal to the trials."""
    from cubic.store import Store

    with Store(db_url) as store:
        trials = store.list_trials(study_id)
        by_id = {t.id: t for t in trials}
        leases_per_trial = {
            t.id: sum(1 for e in store.trial_events(t.id) if str(e.to_state) == "running")
            for t in trials
        }
        study = store.get_study(study_id)
        counts = store.study_counts(study_id)
    lost = [tid for tid, _, state in reported if str(by_id[tid].state) != state]
    multi = {
        tid: n
        for tid, n in leases_per_trial.items()
        if n != 1 and str(by_id[tid].state) != "waiting"
    }
    proposed = sum(1 for t in trials if t.attempt == 1 and t.source != "imported")
    return {
        "trials": len(trials),
        "study_state": str(study.state),
        "lost_reports": lost,
        "trials_leased_not_once": multi,
        "unfinished": [t.id for t in trials if str(t.state) in ("waiting", "running")],
        "counts_match": (counts.proposed, counts.active) == (proposed, 0),
    }


def _run_pool(ctx: Any, fn: Any, args: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(args))
        with ctx.Pool(len(args)) as pool:
            return pool.map(fn, [(*a, barrier) for a in args])


def bench_service(
    pg_url: str | None,
    *,
    trials: int = 500,
    workers: int = 64,
    api_workers: int = 4,
    strategy: str = "random",
    reference: bool = True,
    window: int | None = None,
    job_s: float = 0.0,
    client_nice: int = 0,
) -> dict[str, Any]:
    """Run cubic and (optionally) the Optuna reference with the same number of clients;
    return figures and invariant checks.

    ``pg_url=None``: a PostgreSQL cluster of the benchmark's own, with connections for
    ``workers`` RDBStorage clients (two each) and the API processes' pools. With a given
    server, both systems run with as many clients as its connection limit allows Optuna.
    ``window``: also report latency per ``window`` reports (a history-growth run).
    ``job_s``: seconds each trial's job holds its worker in both systems (0: instant jobs,
    where every figure measures how fast the machine's cores turn calls around).
    ``client_nice``: both systems' client processes run this many levels below the servers
    (API processes, PostgreSQL), as if on machines of their own: on a benchmark machine
    where they share the cores, a server's answer otherwise waits behind clients' work.
    """

    own = None
    if pg_url is None:
        from cubic.bench.pgcluster import PgCluster

        own = PgCluster(max_connections=2 * workers + 8 * api_workers + 20, fsync=True)
        own.start()
        pg_url = own.url
    try:
        args = (strategy, reference, window, job_s, client_nice)
        return _bench(pg_url, trials, workers, api_workers, *args, own)
    finally:
        if own is not None:
            own.remove()


def _bench(
    pg_url: str,
    trials: int,
    workers: int,
    api_workers: int,
    strategy: str,
    reference: bool,
    window: int | None,
    job_s: float,
    client_nice: int,
    own: Any,
) -> dict[str, Any]:
    import json

    from cubic.client import CubicClient
    from cubic.store.schema import upgrade

    limit = _max_connections(pg_url)
    # RDBStorage nests sessions: two connections per client. cubic's workers hold none; its
    # API processes hold at most pool + overflow each.
    clients = min(workers, max(1, (limit - 10) // 2)) if reference else workers
    out: dict[str, Any] = {
        "settings": {
            "trials": trials,
            "clients": clients,
            "api_processes": api_workers,
            "strategy": strategy,
            "optuna_sampler": type(optuna_sampler(strategy, 0)).__name__ if reference else None,
            "database": "own cluster" if own is not None else "given server",
            "max_connections": limit,
            "job_s": job_s,
            "client_nice": client_nice,
        }
    }
    pool = {"CUBIC_DB_POOL_SIZE": "8", "CUBIC_DB_MAX_OVERFLOW": "4"}
    ctx = mp.get_context("spawn")
    with pg_schema(pg_url) as db_url:
        upgrade(db_url)
        spec = study_spec(trials, clients, strategy)
        with api_server(db_url, api_workers, pool) as url:
            with CubicClient(url) as client:
                study_id = client.create_study(spec)["id"]
            wl = json.dumps(spec["workload"])
            args = [(url, study_id, i, wl, job_s, client_nice) for i in range(clients)]
            load0 = os.getloadavg()[0]
            results = _run_pool(ctx, _cubic_worker, args)
            load = os.getloadavg()[0]
            rss = api_rss_mib(url)
            rss_bg = api_rss_mib(url, background=True)
        reported = [r for res in results for r in res["reported"]]
        out["cubic"] = {
            **_summary(f"cubic ({api_workers} API processes)", results, len(reported)),
            "load_avg_1m": load,
            "load_avg_1m_before": load0,
            "api_rss_mib": rss,
            "background_rss_mib": rss_bg,
        }
        if window:
            out["cubic"]["windows"] = windows(results, window)
        out["invariants"] = check_invariants(db_url, study_id, reported)
    if reference:
        import optuna

        with pg_schema(pg_url) as db_url:
            name = "optuna-reference"
            optuna.create_study(study_name=name, storage=db_url, direction="maximize")
            payload = json.dumps({"workload": spec["workload"], "space": spec["space"]})
            args2 = [
                (db_url, name, trials, i, payload, strategy, job_s, client_nice)
                for i in range(clients)
            ]
            results = _run_pool(ctx, _optuna_worker, args2)
            load = os.getloadavg()[0]
            told = sum(r["told"] for r in results)
            out["optuna"] = {
                **_summary(f"Optuna RDBStorage ({clients} clients)", results, told),
                "load_avg_1m": load,
            }
            if window:
                out["optuna"]["windows"] = windows(results, window)
    return out

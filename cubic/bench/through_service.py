"""``cubic bench --through-service``: the search benchmark on the path a REST user takes.

Each (study, strategy, seed) run starts a real API process (uvicorn on a fresh SQLite file,
with the background fitting and proposing of production), creates the study over HTTP, and
runs ``workers`` simulated workers (the real :class:`cubic.worker.Worker` with the
``simulated`` runner, noise on) that lease, heartbeat and report over HTTP until the budget
is spent. A job holds its worker ``clock`` wall
seconds per second it would hold the cluster (launch plus steps, as the in-process loop's
simulated clock counts them), so that jobs end in the same order as there: an out-of-memory
config first, a fast one before a slow one. ``clock=0`` returns every job at once, the
hardest case for a service whose models are fitted in the background. The stored trials
are then scored exactly as an in-process run (:func:`cubic.bench.search.score_run`), so
the two sets of figures compare directly.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cubic.bench.search import RunResult, StudyInfo, landscape, score_run
from cubic.errors import InvalidInput
from cubic.sim.job import NoiseModel
from cubic.study import ResolvedStudy

log = logging.getLogger(__name__)

JOB_CLOCK = 0.01
"""Wall seconds per simulated second of a job: a 2-minute launch takes 1.2 s, ten times a
background proposal round, as minutes of a real job are to the service's seconds."""
WORKER_DEADLINE_S = 3600.0
"""A run whose workers have not finished after this long is reported as broken."""


def run_through_service(
    study: ResolvedStudy,
    strategy: str,
    seed: int,
    *,
    workers: int = 8,
    budget: int = 64,
    prior: Any = None,
    noise: NoiseModel | None = None,
    info: StudyInfo | None = None,
    clock: float = JOB_CLOCK,
) -> RunResult:
    """One run through a real API process and HTTP workers, scored like an in-process one."""
    from cubic.bench.service import api_server
    from cubic.client import CubicClient
    from cubic.runners.simulated import SimulatedRunner
    from cubic.store import Store
    from cubic.store.schema import upgrade
    from cubic.worker import Worker

    if prior:
        raise InvalidInput(
            "--through-service runs each study on its own service; it takes no --transfer",
            field="transfer",
        )
    info = info or landscape(study)
    spec = study.spec.model_dump(mode="json")
    spec.update(
        strategy={"name": strategy, "seed": seed, "options": {}},
        budget={**spec["budget"], "max_trials": budget, "max_parallel": workers},
        baseline=None,  # the in-process loop runs no baseline either
        allow_unfit=True,
    )
    if study.spec.strategy.name == strategy:
        spec["strategy"]["options"] = dict(study.spec.strategy.options)
    noise = NoiseModel() if noise is None else noise
    with tempfile.TemporaryDirectory(prefix="cubic-bench-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'cubic.db'}"
        upgrade(db)
        t0 = time.perf_counter()
        with api_server(db, 1) as url, CubicClient(url, timeout=300) as client:
            study_id = int(client.create_study(spec)["id"])
            errors: list[BaseException] = []

            def work(i: int) -> None:
                try:
                    with CubicClient(url, timeout=300) as c:
                        runner = SimulatedRunner(seed=seed, noise=noise, clock=clock, max_workers=1)
                        # an outbox of the run's own: the next run's service, on a fresh
                        # database, may get the same port and so the same default folder
                        outbox = Path(tmp) / f"outbox-{i}"
                        Worker(
                            c, study_id, runner, worker_id=f"bench-{i}", idle_s=0.05, outbox=outbox
                        ).run()
                except BaseException as exc:  # reported below, with the others
                    errors.append(exc)
                    log.exception("worker %d failed", i)

            threads = [
                threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WORKER_DEADLINE_S)
            if errors or any(t.is_alive() for t in threads):
                raise RuntimeError(f"{study.spec.name}: a worker failed: {errors[:1]}")
        wall = time.perf_counter() - t0
        store = Store(db)
        try:
            trials = store.list_trials(study_id)
        finally:
            store.engine.dispose()
    return score_run(study, info, trials, strategy=strategy, seed=seed, wall_s=wall)

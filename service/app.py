"""The FastAPI app factory. Nothing is opened at import: the lifespan owns the store.

``uvicorn service.app:create_app --factory`` builds the app from the environment
(``CUBIC_*``, see :mod:`service.settings`); ``cubic serve`` passes its settings. Start-up
refuses a database whose schema is missing or old (run ``cubic db upgrade``), and a
background task fails expired leases every ``CUBIC_REAP_INTERVAL_S`` seconds. Off the
request path (in a process of its own, :mod:`service.background`, or with
``CUBIC_BACKGROUND=thread`` in threads of this one) the proxy models are refitted
(``CUBIC_RETRAIN_EVERY`` new trials) and each running study's next trials are proposed ahead
of demand, so that a lease only hands out waiting ones.

Any number of API processes may share one PostgreSQL database: leasing takes row locks
(``FOR UPDATE SKIP LOCKED``), proposals for a study are serialised by an advisory lock, and
each expired lease is reaped by exactly one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from sqlalchemy.engine import make_url

from cubic.config import Settings
from cubic.errors import CubicError, StorageError
from cubic.store import Store
from cubic.store.engine import make_engine
from cubic.tuner import Tuner
from service import errors
from service.limits import BodyLimit
from service.metrics import REAPED, observe_proposal, observe_proxy_fit
from service.routes import dashboard, docs, health, studies, tokens, trials, ui
from service.settings import ServiceSettings
from service.timing import ServerTiming

log = logging.getLogger("cubic.service")
PREFIT_INTERVAL_S = 0.5
"""How often the background thread looks for studies whose model is stale."""
PROPOSE_INTERVAL_S = 0.25
"""How often the proposer looks for studies with room, when nothing woke it."""
IDLE_LOOK_S = 0.1
"""The least time between two looks of a proposer that proposes for no study: every report
and short lease of its API process wakes it, and each look is a query."""
PROPOSER_THREAD = "cubic-proposer"
"""The proposer thread's name: a stop waits for its round, not for the retrainer's fit."""

DESCRIPTION = """\
cubic proposes configurations of a distributed training job, workers run them and report
what they measured, and cubic keeps every trial in SQL.

Workers: `POST /v1/studies/{id}/trials:lease`, then `:heartbeat` while running (with the
job's `progress` in a study that stops slow trials early: the answer's `prune` says when)
and `:report` (or `:release`) with the lease token. Every error answer is
`{"detail", "field", "type"}`.
"""


def open_store(settings: ServiceSettings) -> Store:
    """A store over an engine sized for the API's thread pool; its schema must be current.

    A proposing request may hold two connections at once (the study's advisory lock and
    its queries), so the pool allows some overflow beyond its steady size.
    """
    kwargs: dict[str, Any] = {}
    url = make_url(settings.database_url)
    if url.get_backend_name() != "sqlite" or url.database not in (None, "", ":memory:"):
        kwargs = {"pool_size": settings.db_pool_size, "max_overflow": settings.db_max_overflow}
    engine = make_engine(settings.database_url, **kwargs)
    try:
        return Store(engine)  # raises SchemaOutOfDate naming `cubic db upgrade`
    except BaseException:
        engine.dispose()
        raise


async def reap_forever(tuner: Tuner, interval_s: float) -> None:
    """Fail expired leases (and queue their retries) every ``interval_s`` seconds."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            reaped = await anyio.to_thread.run_sync(tuner.reap)
        except StorageError as exc:
            log.warning("reaping expired leases failed: %s", exc)
            continue
        except Exception:
            log.exception("reaping expired leases failed")
            continue
        if reaped:
            REAPED.inc(len(reaped))
            log.info("reaped %d expired lease(s): trials %s", len(reaped), [t.id for t in reaped])


def observe(kind: str, seconds: float) -> None:
    """Record one round of background work (``proposal`` or ``proxy_fit``) in /metrics."""
    (observe_proposal if kind == "proposal" else observe_proxy_fit)(seconds)


Observer = Callable[[str, float], None]


def observer(tuner: Tuner) -> Observer:
    """:func:`observe`, and each proposal round's time told to ``tuner`` too: the API
    process's leases derive their ``retry_after_s`` from it."""

    def record(kind: str, seconds: float) -> None:
        observe(kind, seconds)
        if kind == "proposal":
            tuner.observe_round(seconds)

    return record


def retrain_forever(
    store: Store,
    stop: threading.Event,
    every: int,
    interval_s: float,
    tuner: Tuner | None = None,
    record: Observer = observe,
    max_share: float | None = None,
) -> None:
    """Fit ahead of demand each running study's own model (the one its strategy proposes
    with, as in the benchmark), and refit each workload kind's shared proxy once ``every``
    new trials finished, taking at most ``max_share`` of a core on average (a thread).

    Fitting is CPU-bound: it runs here, off the request path, so that a lease usually finds
    its study's model fitted.
    """
    from cubic.proxy.training import KINDS, Retrainer

    retrainer = Retrainer(store, every=every, max_share=max_share)
    next_shared = 0.0
    while not stop.is_set():
        if tuner is not None:
            try:
                for sid in tuner.prefit():
                    log.info("study %d: its proxy model was refitted ahead of demand", sid)
            except Exception:
                log.exception("fitting the studies' models failed")
        if time.monotonic() >= next_shared:
            next_shared = time.monotonic() + interval_s
            for kind in KINDS:
                if stop.is_set():
                    return
                t0 = time.perf_counter()
                try:
                    version = retrainer.maybe_retrain(kind)
                except Exception:
                    log.exception("retraining the %s proxy model failed", kind)
                    continue
                if version is not None:
                    record("proxy_fit", time.perf_counter() - t0)
                    log.info(
                        "proxy model %s v%d fitted on %d trials",
                        kind,
                        version.version,
                        version.n_train,
                    )
        stop.wait(min(interval_s, PREFIT_INTERVAL_S))


def propose_forever(
    tuner: Tuner, stop: threading.Event, interval_s: float, record: Observer = observe
) -> None:
    """Keep each running study's queue of waiting trials filled, off the request path (a
    thread): woken when a study is created, a trial finishes or a lease came back short,
    and every ``interval_s`` in any case (another API process may have freed a slot).

    Several API processes may run one each: each proposes for the studies it claimed (see
    :meth:`Tuner.to_fill`), so a study is filled by one process, which keeps its model, and
    no lease waits for it.
    """
    try:
        _propose_until(tuner, stop, interval_s, record)
    finally:
        tuner.claims.close()  # the other processes take this one's studies over


def _propose_until(
    tuner: Tuner, stop: threading.Event, interval_s: float, record: Observer
) -> None:
    while not stop.is_set():
        tuner.wake.wait(interval_s)
        tuner.wake.clear()
        try:
            studies = tuner.to_fill()
        except StorageError as exc:
            log.warning("looking for studies to propose for failed: %s", exc)
            stop.wait(interval_s)
            continue
        except Exception:
            log.exception("looking for studies to propose for failed")
            stop.wait(interval_s)
            continue
        if not studies and not tuner.claims.held:
            stop.wait(IDLE_LOOK_S)
            continue
        for sid in studies:
            if stop.is_set():
                return
            t0 = time.perf_counter()
            try:
                added = tuner.fill(sid)
            except CubicError as exc:
                log.warning("study %d: proposing failed: %s", sid, exc)
                continue
            except Exception:
                log.exception("study %d: proposing failed", sid)
                continue
            if added:
                record("proposal", time.perf_counter() - t0)
                log.debug("study %d: %d trial(s) proposed", sid, added)


def start_background(
    store: Store,
    tuner: Tuner,
    config: ServiceSettings,
    stop: threading.Event,
    record: Observer = observe,
    *,
    fit_nice: int = 0,
) -> list[threading.Thread]:
    """The retrainer and the proposer, as threads of this process, until ``stop`` is set.

    ``fit_nice``: how many nice levels below this process the retrainer's thread runs (in
    a background process of its own: see :mod:`service.background`). The proposer keeps the
    process's priority, the requests': a lease that finds no trial waiting leaves a GPU
    idle until the next round, while the fits ahead of demand and the shared proxy can wait
    for the cores the requests and the proposals leave."""
    retrainer = threading.Thread(
        target=_at_lower_priority,
        name="cubic-retrainer",
        daemon=True,
        args=(
            fit_nice,
            retrain_forever,
            store,
            stop,
            config.retrain_every,
            config.retrain_interval_s,
            tuner,
            record,
        ),
        kwargs={"max_share": config.retrain_max_share},
    )
    proposer = threading.Thread(
        target=propose_forever,
        name=PROPOSER_THREAD,
        daemon=True,
        args=(tuner, stop, PROPOSE_INTERVAL_S, record),
    )
    retrainer.start()
    proposer.start()
    return [retrainer, proposer]


def _at_lower_priority(nice: int, target: Callable[..., None], *args: Any, **kw: Any) -> None:
    """Run ``target`` in this thread ``nice`` levels below the process (Linux, where a nice
    value is a thread's own; elsewhere at the process's priority)."""
    if nice and sys.platform == "linux":
        tid = threading.get_native_id()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    target(*args, **kw)


FIT_STOP_S = 2.0
"""How long a shutdown waits for a model fit in progress: fitted models are caches (refitted
after a restart), so a stop does not wait out a fit that can take minutes on a busy machine,
while a proposal round in progress, which stores trials, is waited for."""


def join_background(threads: list[threading.Thread], timeout_s: float) -> None:
    """Wait for the threads :func:`start_background` started, once ``stop`` is set: the
    proposer up to ``timeout_s``, the retrainer up to :data:`FIT_STOP_S` (it is a daemon
    thread: a fit still running ends with the process)."""
    for thread in threads:
        thread.join(timeout_s if thread.name == PROPOSER_THREAD else FIT_STOP_S)


def log_to_stderr(level: str) -> None:
    """Show the service's own log lines (uvicorn configures only its own loggers)."""
    cubic_log = logging.getLogger("cubic")
    cubic_log.setLevel(level.upper())
    if not any(getattr(h, "_cubic", False) for h in cubic_log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler._cubic = True  # type: ignore[attr-defined]
        cubic_log.addHandler(handler)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the database is opened (and its schema checked) when it starts."""
    config = ServiceSettings.of(settings)
    log_to_stderr(config.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await anyio.to_thread.run_sync(open_store, config)
        in_process = config.background == "thread"
        tuner = Tuner(store, background_fit=in_process, background_propose=True)
        app.state.settings = config
        app.state.store = store
        app.state.tuner = tuner
        reaper = asyncio.create_task(
            reap_forever(tuner, config.reap_interval_s), name="cubic-reaper"
        )
        if in_process:
            stop = threading.Event()
            threads = start_background(store, tuner, config, stop, observer(tuner))
        else:
            from service.background import BackgroundProcess

            background = app.state.background = BackgroundProcess(config)
            tuner.wake = background.nudge  # a short lease or a report wakes it
            await anyio.to_thread.run_sync(background.start)
            if not await anyio.to_thread.run_sync(background.wait_ready):
                log.warning("the background process is not proposing yet: serving anyway")
            watcher = asyncio.create_task(
                background.watch(observer(tuner)), name="cubic-background"
            )
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper  # a reap in progress finishes first (threads are not killed)
            if in_process:
                stop.set()
                tuner.wake.set()
                await anyio.to_thread.run_sync(join_background, threads, 60.0)
            else:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                await anyio.to_thread.run_sync(background.stop)
            await anyio.to_thread.run_sync(store.engine.dispose)

    app = FastAPI(
        title="cubic",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from local files below, not from a CDN
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(ServerTiming)  # outermost: it times what the limit refuses too
    app.include_router(health.router)
    app.include_router(studies.router)
    app.include_router(trials.router)
    app.include_router(tokens.router)
    app.include_router(dashboard.router)
    ui.install(app)  # the dashboard at /ui
    docs.install(app)  # /docs
    return app

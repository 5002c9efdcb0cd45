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
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from cubic.config import Settings
from cubic.errors import StorageError
from cubic.tuner import Tuner
from service import errors
from service.limits import BodyLimit
from service.loops import join_background, log_to_stderr, observer, open_store, start_background
from service.metrics import REAPED
from service.routes import dashboard, docs, health, studies, tokens, trials, ui
from service.settings import ServiceSettings
from service.timing import ServerTiming
from service.warm import thaw, warm_up

log = logging.getLogger("cubic.service")

DESCRIPTION = """\
cubic proposes configurations of a distributed training job, workers run them and report
what they measured, and cubic keeps every trial in SQL.

Workers: `POST /v1/studies/{id}/trials:lease`, then `:heartbeat` while running (with the
job's `progress` in a study that stops slow trials early: the answer's `prune` says when)
and `:report` (or `:release`) with the lease token. Every error answer is
`{"detail", "field", "type"}`.
"""


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
        await warm_up(app, store, config.db_pool_size)
        try:
            yield
        finally:
            thaw()
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

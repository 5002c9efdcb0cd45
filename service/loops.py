"""What runs beside the requests: the proposer and the retrainer loops, and what every
process of the service opens (its store, its log).

The API process runs them in threads (``CUBIC_BACKGROUND=thread``) or, by default, in a
background process of its own (:mod:`service.background`), which imports this module and not
the web app: a background process starts in the time its imports take, and its API process
waits for it before it serves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import make_url

from cubic.errors import CubicError, StorageError
from cubic.store import Store
from cubic.store.engine import make_engine
from cubic.tuner import Tuner
from service.metrics import observe_proposal, observe_proxy_fit
from service.settings import ServiceSettings

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

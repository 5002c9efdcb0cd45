"""Proposing and model fitting in a process of their own, beside each API process.

Both are CPU-bound Python. As threads of the API process they hold its interpreter lock for
whole rounds, and every request that process serves waits for it at each switch: a lease
that takes a few milliseconds of work answered in tens or hundreds. In a process of their
own they cost the requests nothing but CPU time. The API process starts it, restarts it if
it dies, stops it on shutdown, and shares with it one event (a lease that came back short
or a finished trial wakes the proposer) and a queue that carries the rounds' timings back to
``/metrics``. The child exits by itself if its API process goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import threading
from typing import Any

from service.settings import ServiceSettings

log = logging.getLogger("cubic.service")
WATCH_INTERVAL_S = 1.0
"""How often the API process drains the timings and checks that its background one lives."""
STOP_TIMEOUT_S = 60.0
"""How long a shutdown waits for a round in progress before it kills the process."""
_CTX = mp.get_context("spawn")  # no fork of a process with threads and open connections


class BackgroundProcess:
    """The background process of one API process (see the module's docstring)."""

    def __init__(self, config: ServiceSettings) -> None:
        self.config = config
        self.wake = _CTX.Event()
        self.stopping = _CTX.Event()
        self.timings: Any = _CTX.Queue(maxsize=10_000)
        self.process: Any = None
        self.restarts = 0
        # What the request path sets (a report, a short lease): a thread of this process
        # passes it on. Setting the shared event takes a lock between the two processes,
        # which took a fifth of a report's time on a busy service.
        self.nudge = threading.Event()
        self._forwarder: threading.Thread | None = None

    def forward_nudges(self) -> None:
        """Pass each :attr:`nudge` on to the background process until it stops (a thread)."""
        while not self.stopping.is_set():
            if self.nudge.wait(WATCH_INTERVAL_S):
                self.nudge.clear()
                self.wake.set()

    def start(self) -> None:
        if self._forwarder is None:
            self._forwarder = threading.Thread(
                target=self.forward_nudges, name="cubic-wake-forwarder", daemon=True
            )
            self._forwarder.start()
        self.process = _CTX.Process(
            target=main,
            name="cubic-background",
            args=(self.config.model_dump(), os.getpid(), self.wake, self.stopping, self.timings),
            daemon=True,
        )
        self.process.start()

    async def watch(self, record: Any) -> None:
        """Pass the child's timings to ``record`` (this process's metrics, and its tuner's
        lease hint); restart the child if it died."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            self.drain(record)
            if self.process is not None and not self.process.is_alive():
                self.restarts += 1
                log.error(
                    "the background process (proposals, model fits) exited with code %s; "
                    "starting it again (restart %d)",
                    self.process.exitcode,
                    self.restarts,
                )
                await asyncio.to_thread(self.start)

    def drain(self, record: Any) -> int:
        n = 0
        while True:
            try:
                kind, seconds = self.timings.get_nowait()
            except queue.Empty:
                return n
            record(kind, seconds)
            n += 1

    def stop(self) -> None:
        """Let the round in progress finish, then end the process (killed after a while)."""
        self.stopping.set()
        self.wake.set()
        self.nudge.set()
        if self._forwarder is not None:
            self._forwarder.join(10)
        if self.process is None:
            return
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            log.warning("the background process did not stop in %.0f s: killed", STOP_TIMEOUT_S)
            self.process.kill()
            self.process.join(10)
        self.timings.cancel_join_thread()  # timings not yet read are not worth a hang
        self.timings.close()


def main(settings: dict[str, Any], parent: int, wake: Any, stop: Any, timings: Any) -> None:
    """The child: a store and a tuner of its own, running the retrainer and the proposer
    until ``stop`` is set or the API process ``parent`` is gone."""
    from cubic.tuner import Tuner
    from service.app import join_background, log_to_stderr, open_store, start_background

    config = ServiceSettings(**settings)
    log_to_stderr(config.log_level)
    store = open_store(config)
    tuner = Tuner(store, background_fit=True, background_propose=True)
    tuner.wake = wake

    def record(kind: str, seconds: float) -> None:
        with contextlib.suppress(queue.Full):
            timings.put_nowait((kind, seconds))

    threads = start_background(store, tuner, config, stop, record, fit_nice=config.background_nice)
    try:
        while not stop.wait(WATCH_INTERVAL_S):
            if os.getppid() != parent:  # the API process died without stopping us
                log.warning("the API process %d is gone: the background process stops", parent)
                stop.set()
    finally:
        wake.set()
        join_background(threads, STOP_TIMEOUT_S)
        store.engine.dispose()

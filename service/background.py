"""Proposing and model fitting in a process of their own, beside each API process.

Both are CPU-bound Python. As threads of the API process they hold its interpreter lock for
whole rounds, and every request that process serves waits for it at each switch: a lease
that takes a few milliseconds of work answered in tens or hundreds. In a process of their
own they cost the requests nothing but CPU time. The API process starts it, restarts it if
it dies, stops it on shutdown, and shares with it three signals (wake the proposer: a lease
came back short or a trial finished; the child runs; stop) and a queue that carries the
rounds' timings back to ``/metrics``. The child exits by itself if its API process goes
away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from typing import Any

from service.settings import ServiceSettings

log = logging.getLogger("cubic.service")
WATCH_INTERVAL_S = 1.0
"""How often the API process drains the timings and checks that its background one lives."""
STOP_TIMEOUT_S = 60.0
"""How long a shutdown waits for a round in progress before it kills the process."""
READY_TIMEOUT_S = 300.0
"""How long an API process's start waits for its background process to be proposing (its
imports take seconds on a busy machine); past it, the API process serves anyway."""
_CTX = mp.get_context("spawn")  # no fork of a process with threads and open connections


class Signal:
    """A call from one process to another that a killed process cannot jam.

    ``multiprocessing.Event.set()`` waits, holding the event's lock, until every sleeping
    waiter has acknowledged: a waiter killed in its sleep (by the OOM killer, say) never
    does, and every later ``set()`` or ``wait()`` on that event hangs. A semaphore's release
    waits for nobody. One process waits on a signal; the calls made before it looks are one.
    """

    def __init__(self) -> None:
        self._calls = _CTX.Semaphore(0)

    def set(self) -> None:
        self._calls.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Until called (True, and every call so far taken) or ``timeout`` passed (False)."""
        if not self._calls.acquire(True, timeout):
            return False
        self.clear()
        return True

    def clear(self) -> None:
        while self._calls.acquire(False):
            pass


class BackgroundProcess:
    """The background process of one API process (see the module's docstring)."""

    def __init__(self, config: ServiceSettings) -> None:
        self.config = config
        self.wake = Signal()
        self.stopping = threading.Event()  # this process is stopping the child
        self.stop_child = Signal()
        self.ready = Signal()  # called by the child once its proposer runs
        self.proposing = False  # whether :meth:`wait_ready` saw the current child run
        self.timings: Any = None
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
        self.ready.clear()
        self.proposing = False
        # A queue of its own for each child: one killed while it wrote would hold the
        # queue's lock, and the next child's timings would never arrive.
        self._close_timings()
        self.timings = _CTX.Queue(maxsize=10_000)
        self.process = _CTX.Process(
            target=main,
            name="cubic-background",
            args=(self.config.model_dump(), os.getpid(), self.wake, self.stop_child, self.timings),
            kwargs={"ready": self.ready},
            daemon=True,
        )
        self.process.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Wait until the child proposes (True), it died, or ``timeout_s`` passed (False).

        The API process starts serving after it: a lease that comes while the child still
        imports finds nothing waiting, and a study created then gets its first batch only
        once the child runs, so the service is not ready before."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(min(WATCH_INTERVAL_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline or not self.process.is_alive():
                return False
        self.proposing = True
        return True

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
        self.stop_child.set()
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
        self._close_timings()

    def _close_timings(self) -> None:
        if self.timings is not None:
            self.timings.cancel_join_thread()  # timings not yet read are not worth a hang
            self.timings.close()


def main(
    settings: dict[str, Any],
    parent: int,
    wake: Any,
    stop: Any,
    timings: Any,
    *,
    ready: Any = None,
) -> None:
    """The child: a store and a tuner of its own, running the retrainer and the proposer
    until ``stop`` is called (a :class:`Signal`, as ``wake`` and ``ready``) or the API
    process ``parent`` is gone; ``ready`` is called once they run."""
    from cubic.tuner import Tuner
    from service.loops import join_background, log_to_stderr, open_store, start_background

    config = ServiceSettings(**settings)
    log_to_stderr(config.log_level)
    store = open_store(config)
    tuner = Tuner(store, background_fit=True, background_propose=True)
    tuner.wake = wake

    def record(kind: str, seconds: float) -> None:
        with contextlib.suppress(queue.Full):
            timings.put_nowait((kind, seconds))

    halt = threading.Event()  # what this process's threads look at
    threads = start_background(store, tuner, config, halt, record, fit_nice=config.background_nice)
    if ready is not None:
        ready.set()
    try:
        while not stop.wait(WATCH_INTERVAL_S):
            if os.getppid() != parent:  # the API process died without stopping us
                log.warning("the API process %d is gone: the background process stops", parent)
                break
    finally:
        halt.set()
        wake.set()
        join_background(threads, STOP_TIMEOUT_S)
        store.engine.dispose()

"""Warming an API process before it serves, so that its first burst of leases and reports is
served as fast as the later ones.

A cold process pays on its first calls for what it then keeps: FastAPI builds each router's
routes (their validators and serialisers) on the first request that reaches them, and the
pool opens its database connections one by one as concurrent requests need them. When a
study's workers start together, all of that lands on their first calls at once; here it is
paid before the process says it is ready.

Then the objects made at start-up (modules, routes, compiled statements: most of the heap)
are frozen out of the garbage collector (:func:`gc.freeze`), so that a full collection
while serving scans only what serving made, not the whole start-up heap again: unfrozen, a
collection of the oldest generation held the process for 100-300 ms on a loaded machine.
They are thawed when the app stops (:func:`thaw`), so that what the app held is collected
once it is gone (a process that starts many apps, a test suite, would otherwise keep them).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import anyio
import httpx

from cubic.store import Store
from service.deps import MAX_ID

log = logging.getLogger("cubic.service")

#: The hot routes, each called once: a study that does not exist (404), and the worker
#: protocol's calls with an empty body, refused (422) before their handlers run, so that
#: nothing is written or counted (with authentication on, those are 401).
WARM_CALLS: tuple[tuple[str, str], ...] = (
    ("GET", "/healthz"),
    ("GET", f"/v1/studies/{MAX_ID}"),
    ("POST", f"/v1/studies/{MAX_ID}/trials:lease"),
    ("POST", f"/v1/trials/{MAX_ID}:heartbeat"),
    ("POST", f"/v1/trials/{MAX_ID}:report"),
)


async def warm_up(app: Any, store: Store, connections: int) -> None:
    """Call the hot routes once in process, open ``connections`` of the pool, then freeze
    what start-up made out of the garbage collector. A failure only logs: a cold process
    still serves correctly."""
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warm-up") as client:
            for method, path in WARM_CALLS:
                await client.request(method, path, json={} if method == "POST" else None)
        await anyio.to_thread.run_sync(open_connections, store, connections)
    except Exception:
        log.warning("warming the API process failed; it serves cold", exc_info=True)
    gc.collect()
    gc.freeze()


def open_connections(store: Store, n: int) -> None:
    """Open ``n`` pooled connections at once and give them back to the pool, which keeps
    them (at most its size) for the first burst of requests."""
    held = []
    try:
        for _ in range(n):
            held.append(store.engine.connect())
    finally:
        for conn in held:
            conn.close()


def thaw() -> None:
    """Give what :func:`warm_up` froze back to the garbage collector (the app stopped)."""
    gc.unfreeze()

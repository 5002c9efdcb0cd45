"""The ``Server-Timing`` header (W3C Server Timing): how long the API process took to answer.

A client's own clock counts the network and, when it shares a machine with many others, its
wait for a core to read the answer; this header says which part was the service's. ``app``
is measured from the moment the ASGI server hands the request to the app to the moment the
answer's headers leave it: the request's queueing for a thread, its work and its database
calls, not the client's side. Browsers show it in their developer tools; ``cubic bench
service`` reports its percentiles beside the clients'.
"""

from __future__ import annotations

import time
from typing import Any

Scope = dict[str, Any]
HEADER = b"server-timing"


class ServerTiming:
    """A pure ASGI middleware that adds ``Server-Timing: app;dur=<ms>`` to every answer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - t0) * 1e3
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER]
                headers.append((HEADER, f"app;dur={ms:.2f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed_send)


def app_ms(header: str | None) -> float | None:
    """The ``app`` duration (ms) of a ``Server-Timing`` header, or None if it has none."""
    for metric in (header or "").split(","):
        name, *params = (p.strip() for p in metric.split(";"))
        if name != "app":
            continue
        for p in params:
            key, _, value = p.partition("=")
            if key.strip() == "dur":
                try:
                    return float(value.strip().strip('"'))
                except ValueError:
                    return None
    return None

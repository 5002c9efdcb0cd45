"""Bounded work per request: a body larger than ``CUBIC_MAX_BODY_BYTES`` is refused with 413
before it is read into memory, on every endpoint.

A pure ASGI middleware, so that it sees the stream: a declared ``Content-Length`` over the
limit is refused at once, and a chunked body is cut off as soon as it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _detail(self) -> bytes:
        return json.dumps(
            {
                "detail": f"body: larger than CUBIC_MAX_BODY_BYTES={self.max_bytes} bytes",
                "field": "body",
                "type": "BodyTooLarge",
            }
        ).encode()

    async def _refuse(self, send: Any) -> None:
        body = self._detail()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        seen = 0
        started = refused = False

        async def limited_receive() -> Any:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not started:
                    # Answer now and tell the app the client has gone: it stops reading.
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if refused:
                return  # the 413 has been sent; the app's own answer is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise

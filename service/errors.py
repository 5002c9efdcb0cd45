"""The one place where errors become HTTP answers.

Every error answer has the same body, ``{"detail": message, "field": path or null, "type":
name}``, so a client can show the message, point at the field and branch on the type (a
worker tells ``LeaseLost`` from other conflicts). cubic's exceptions carry their own status
(``status_code``); request validation adds ``errors`` (FastAPI's list, with ``loc``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cubic.errors import CubicError, InvalidInput, StorageError
from cubic.hardware import HardwareError
from cubic.space import SpaceError
from cubic.workload import WorkloadError

log = logging.getLogger("cubic.service")

RETRY_AFTER_S = 1
MAX_DEPTH = 32
"""How deeply a request body may nest (a study spec needs about 6 levels)."""
"""What a 503 tells a client to wait before retrying (the database may be back by then)."""


def error_body(detail: str, field: str | None, kind: str, **extra: Any) -> dict[str, Any]:
    return {"detail": detail, "field": field, "type": kind, **extra}


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "trials", 0, "state")`` -> ``"trials.0.state"``, ``("query", "limit")`` ->
    ``"limit"``: the name the client wrote (``errors[].loc`` still says where it was)."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


async def _cubic_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CubicError)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status_code == 503 else None
    if exc.status_code == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="cubic"'}
    if isinstance(exc, StorageError):
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        error_body(str(exc), getattr(exc, "field", None), type(exc).__name__),
        status_code=exc.status_code,
        headers=headers,
    )


async def _input_error(request: Request, exc: Exception) -> JSONResponse:
    """Errors of a space, workload or hardware description: the input is at fault (422)."""
    return JSONResponse(
        error_body(str(exc), None, type(exc).__name__), status_code=InvalidInput.status_code
    )


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in exc.errors()
    ]  # the rejected input is left out: it may be large
    fields = [field_path(e["loc"]) for e in errors]
    detail = "; ".join(f"{f}: {e['msg']}" for f, e in zip(fields, errors, strict=True))
    return JSONResponse(
        error_body(
            detail or "invalid request",
            fields[0] if fields else None,
            "RequestValidationError",
            errors=errors,
        ),
        status_code=422,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and str(exc.detail).startswith("There was an error parsing"):
        # FastAPI's answer when the JSON parser itself fails (a 100,000-level array
        # exhausts its recursion): the input is at fault, as with any malformed body.
        return JSONResponse(
            error_body(
                f"body: cannot be parsed (nested more than {MAX_DEPTH} levels deep?)",
                "body",
                "InvalidInput",
            ),
            status_code=422,
        )
    return JSONResponse(
        error_body(str(exc.detail), None, "HTTPException"),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse(
        error_body("internal server error", None, type(exc).__name__), status_code=500
    )


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(CubicError, _cubic_error)
    for exc in (SpaceError, WorkloadError, HardwareError):
        app.add_exception_handler(exc, _input_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)

"""The FastAPI app factory: the lifespan owns the store; no engine is created at import."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cubic.config import Settings
from cubic.errors import CubicError
from cubic.store import Store
from cubic.store.schema import check_schema


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the database is opened (and its schema checked) when it starts."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.database_url)
        app.state.store = store
        try:
            yield
        finally:
            store.close()

    app = FastAPI(title="cubic", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(CubicError)
    async def _cubic_error(request: Request, exc: CubicError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz(request: Request) -> dict[str, str]:
        """The database answers and its schema is the one this version needs."""
        check_schema(request.app.state.store.engine)
        return {"status": "ready"}

    return app

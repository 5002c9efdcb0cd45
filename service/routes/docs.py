"""The API's interactive documentation, served by this process: no CDN, so ``/docs`` works
on a machine without internet access.

Swagger UI's files come from the installed ``fastapi-offline`` package (its ``static``
folder: the bundle FastAPI would load from jsDelivr), mounted at ``/docs/assets``. There is
no ``/redoc``: ReDoc fetches its logo from its own CDN whatever it is given.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def assets_dir() -> Path:
    """The folder of Swagger UI's bundle in the ``fastapi_offline`` package."""
    return Path(str(resources.files("fastapi_offline") / "static"))


def install(app: FastAPI) -> None:
    """Serve ``/docs`` from local files (build the app with ``docs_url=None, redoc_url=None``
    so that FastAPI's CDN pages are not there too)."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")

    def _root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=root + str(app.openapi_url),
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

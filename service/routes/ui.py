"""The dashboard: static pages under ``/ui`` that read the REST API from the browser.

Everything is served by this process (plotly.js comes from the installed ``plotly``
package), so the pages work without internet access. The pages carry no data and need no
token; their requests to ``/v1`` carry one when authentication is on.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
router = APIRouter(include_in_schema=False)


@cache
def plotly_js() -> Path | None:
    """The ``plotly.min.js`` bundled with the Python ``plotly`` package, if installed."""
    try:
        path = resources.files("plotly") / "package_data" / "plotly.min.js"
    except ModuleNotFoundError:
        return None
    path = Path(str(path))
    return path if path.is_file() else None


@router.get("/ui")
def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/assets/plotly.min.js")
def plotly_asset() -> FileResponse:
    path = plotly_js()
    if path is None:
        raise HTTPException(404, "plotly is not installed: pip install 'plotly>=5'")
    return FileResponse(
        path, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
    )


def install(app: FastAPI) -> None:
    """Add the dashboard's routes and static files to ``app``."""
    app.include_router(router)
    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")

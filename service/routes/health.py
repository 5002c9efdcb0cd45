"""Liveness, readiness and Prometheus metrics (outside ``/v1``: probes and scrapers)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from cubic.store.objects import StudyState
from cubic.store.schema import check_schema
from service.auth import AnyRole
from service.deps import StoreDep
from service.metrics import CONTENT_TYPE, exposition, gauge
from service.schemas import ErrorOut, error_responses

router = APIRouter(tags=["health"])

_LIVE_STATES = (StudyState.RUNNING, StudyState.PAUSED)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up (it may still be unable to serve: see ``/readyz``)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={503: {"model": ErrorOut, "description": "database down or schema out of date"}},
)
def readyz(store: StoreDep) -> dict[str, str]:
    """The database answers and its schema is the one this version needs."""
    check_schema(store.engine)
    return {"status": "ready"}


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {CONTENT_TYPE: {}}}, **error_responses(401, 403, 503)},
)
def metrics(caller: AnyRole, store: StoreDep) -> PlainTextResponse:
    """Prometheus text format: this process's latencies and the trial counts per state.

    Trial counts are read now, for running and paused studies only (finished studies do
    not change, and keeping them would grow the series without end).
    """
    studies = [(s.value, store.count_studies(s)) for s in StudyState]
    trials = []
    for state in _LIVE_STATES:
        for study in store.list_studies(state, limit=None):
            for trial_state, n in store.count_trials(study.id).items():
                trials.append(((("study", str(study.id)), ("state", trial_state.value)), n))
    text = exposition(
        [
            gauge("cubic_studies", "Studies by state.", [((("state", s),), n) for s, n in studies]),
            gauge(
                "cubic_trials", "Trials of running and paused studies, by study and state.", trials
            ),
        ]
    )
    return PlainTextResponse(text, media_type=CONTENT_TYPE)

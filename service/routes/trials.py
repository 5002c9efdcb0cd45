"""Trials: list and read, and the worker protocol (lease, heartbeat, report, release), plus
enqueued configs and imported history.

The worker protocol's handlers are ``async`` and do their work in one worker thread
(``anyio.to_thread.run_sync``, as FastAPI does): FastAPI runs a plain ``def`` handler in a
thread and then validates its answer in another, and on a loaded machine each hop is a wait
for the event loop and a thread to be scheduled again, on every call of every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Query

from cubic.outcome import Outcome
from cubic.store.objects import Trial, TrialState
from cubic.tuner import Tuner
from service.auth import AnyRole, Caller, SubmitterRole, WorkerRole
from service.deps import PageDep, SettingsDep, StoreDep, StudyId, TrialId, TunerDep
from service.metrics import LEASE_LATENCY, REPORT_LATENCY
from service.schemas import (
    API_ERRORS,
    EnqueueRequest,
    ErrorOut,
    HeartbeatOut,
    HeartbeatRequest,
    ImportRequest,
    LeaseOut,
    LeaseRequest,
    PruneOut,
    ReleaseRequest,
    ReportRequest,
    TrialLeaseOut,
    TrialOut,
    TrialPage,
    TrialsOut,
)
from service.settings import ServiceSettings

router = APIRouter(prefix="/v1", tags=["trials"], responses=API_ERRORS)

TrialOrder = Literal["number", "-number", "finished_at", "-finished_at"]

_LEASE_409 = {
    409: {
        "model": ErrorOut,
        "description": "the lease is gone (`type: LeaseLost`: expired and reaped, "
        "released, or re-leased) or the trial already finished "
        "differently (`TrialFinished`)",
    }
}


@router.get("/studies/{study_id:int}/trials", response_model=TrialPage)
def list_trials(
    study_id: StudyId,
    caller: AnyRole,
    store: StoreDep,
    page: PageDep,
    state: Annotated[
        list[TrialState] | None, Query(description="keep these states (repeatable)")
    ] = None,
    order: Annotated[
        TrialOrder, Query(description="number or finished_at; a leading `-` reverses")
    ] = "number",
) -> TrialPage:
    """A study's trials, in number order unless ``order`` says otherwise."""
    caller.check_study(study_id)
    items = store.list_trials(
        study_id, states=state, limit=page.limit, offset=page.offset, order=order
    )
    counts = store.count_trials(study_id)
    total = sum(n for s, n in counts.items() if state is None or s in state)
    return TrialPage(
        items=[TrialOut.from_trial(t) for t in items],
        total=total,
        limit=page.limit,
        offset=page.offset,
    )


@router.get("/trials/{trial_id:int}", response_model=TrialOut)
def get_trial(trial_id: TrialId, caller: AnyRole, store: StoreDep) -> TrialOut:
    """A trial with its state transitions."""
    trial = store.get_trial(trial_id)
    caller.check_study(trial.study_id)
    return TrialOut.from_trial(trial, store.trial_events(trial_id))


@router.post("/studies/{study_id:int}/trials:lease", response_model=LeaseOut)
async def lease(
    study_id: StudyId, req: LeaseRequest, caller: WorkerRole, tuner: TunerDep, settings: SettingsDep
) -> LeaseOut:
    """Lease up to ``count`` waiting trials; proposing runs in the background, never here.

    Idempotent per worker: asking again returns the trials the worker already holds (their
    leases extended) before any new one, so a restarted worker loses nothing.
    """
    return await anyio.to_thread.run_sync(_lease, study_id, req, caller, tuner, settings)


def _lease(
    study_id: int, req: LeaseRequest, caller: Caller, tuner: Tuner, settings: ServiceSettings
) -> LeaseOut:
    caller.check_study(study_id)
    caller.check_worker(tuner.store, req.worker_id)
    seconds = req.lease_seconds or settings.default_lease_s
    with LEASE_LATENCY.time():
        got = tuner.lease(study_id, req.worker_id, req.count, seconds)
    return LeaseOut(
        trials=[TrialLeaseOut.from_trial(t) for t in got.trials],
        study_state=got.study_state,
        retry_after_s=got.retry_after_s,
    )


@router.post("/trials/{trial_id:int}:heartbeat", response_model=HeartbeatOut, responses=_LEASE_409)
async def heartbeat(
    trial_id: TrialId,
    req: HeartbeatRequest,
    caller: WorkerRole,
    tuner: TunerDep,
    settings: SettingsDep,
) -> HeartbeatOut:
    """Extend a lease to now + ``lease_seconds``.

    With the job's ``progress``, in a study that stops slow trials early, the answer's
    ``prune`` says when the trial can no longer matter: the worker then cancels its job and
    reports it ``pruned`` with the evidence.
    """
    return await anyio.to_thread.run_sync(_heartbeat, trial_id, req, caller, tuner, settings)


def _heartbeat(
    trial_id: int, req: HeartbeatRequest, caller: Caller, tuner: Tuner, settings: ServiceSettings
) -> HeartbeatOut:
    _check_holder(caller, tuner, trial_id)
    seconds = req.lease_seconds or settings.default_lease_s
    trial = tuner.heartbeat(trial_id, req.lease_token, seconds)
    verdict = tuner.judge(trial, req.progress.to_progress()) if req.progress else None
    prune = PruneOut.from_verdict(verdict) if verdict is not None and verdict.prune else None
    return HeartbeatOut(**dict(TrialOut.from_trial(trial)), prune=prune)


@router.post("/trials/{trial_id:int}:report", response_model=TrialOut, responses=_LEASE_409)
async def report(
    trial_id: TrialId, req: ReportRequest, caller: WorkerRole, tuner: TunerDep
) -> TrialOut:
    """Record how a leased trial ended.

    Idempotent per lease token: resending the same report after a lost answer returns the
    same trial and changes nothing. A report under a lease that expired (and whose trial
    was retried elsewhere) is refused with 409 ``LeaseLost``.
    """
    return await anyio.to_thread.run_sync(_report, trial_id, req, caller, tuner)


def _report(trial_id: int, req: ReportRequest, caller: Caller, tuner: Tuner) -> TrialOut:
    outcome = Outcome(req.state, req.metrics, req.error, req.log_tail)
    with REPORT_LATENCY.time():
        # The holder's check runs on the trial the report locks: one read, not two.
        trial = tuner.tell(trial_id, req.lease_token, outcome, holder=_holder_check(caller, tuner))
    return TrialOut.from_trial(trial)


@router.post("/trials/{trial_id:int}:release", response_model=TrialOut, responses=_LEASE_409)
async def release(
    trial_id: TrialId, req: ReleaseRequest, caller: WorkerRole, tuner: TunerDep
) -> TrialOut:
    """Give a leased trial back unrun (a worker shutting down); it waits for another."""
    return await anyio.to_thread.run_sync(_release, trial_id, req, caller, tuner)


def _release(trial_id: int, req: ReleaseRequest, caller: Caller, tuner: Tuner) -> TrialOut:
    _check_holder(caller, tuner, trial_id)
    return TrialOut.from_trial(tuner.release(trial_id, req.lease_token))


@router.post("/studies/{study_id:int}/trials:enqueue", status_code=201, response_model=TrialsOut)
def enqueue(
    study_id: StudyId, req: EnqueueRequest, caller: SubmitterRole, tuner: TunerDep
) -> TrialsOut:
    """Queue configs to run before the strategy's own proposals, checked against the space."""
    caller.check_owner(tuner.store.get_study(study_id))
    return TrialsOut(trials=[TrialOut.from_trial(t) for t in tuner.enqueue(study_id, req.configs)])


@router.post("/studies/{study_id:int}/trials:import", status_code=201, response_model=TrialsOut)
def import_history(
    study_id: StudyId, req: ImportRequest, caller: SubmitterRole, tuner: TunerDep
) -> TrialsOut:
    """Add past runs as finished trials: the search learns from them, the budget is untouched.

    A complete run that breaks the study's constraints is stored as ``infeasible``.
    """
    caller.check_owner(tuner.store.get_study(study_id))
    records = [(t.params, t.state, t.metrics) for t in req.trials]
    return TrialsOut(
        trials=[TrialOut.from_trial(t) for t in tuner.import_history(study_id, records)]
    )


def _check_holder(caller: Caller, tuner: Tuner, trial_id: int) -> None:
    """The lease of a trial is its worker's: another token may not touch it."""
    check = _holder_check(caller, tuner)
    if check is not None:
        check(tuner.store.get_trial(trial_id))


def _holder_check(caller: Caller, tuner: Tuner) -> Callable[[Trial], None] | None:
    """:func:`_check_holder` on a trial already read (None: no token, nothing to check)."""
    if caller.token is None:
        return None

    def check(trial: Trial) -> None:
        caller.check_study(trial.study_id)
        caller.check_lease_holder(tuner.store, trial.worker_id)

    return check

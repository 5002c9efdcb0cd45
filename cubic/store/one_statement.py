"""A lease and a report as one statement each, on PostgreSQL, and the reads before them.

Every lease that hands out a trial and every report writes its study's row (the counts),
so the study's workers queue on that row. In a transaction of several statements the row
stays locked across each round trip that follows the write; on a busy machine the API
process that holds it waits for a core between them, and the study's other calls wait on
it. One statement with data-modifying common table expressions, run outside a
transaction block (autocommit), does the whole change and commits on the server: one
round trip, and the row is locked only while the server runs it. The ORM path of
:class:`~cubic.store.repository.Store` stays the reference (and SQLite's); these are used
for the common case only, and whatever they cannot decide goes back to it.

Each statement is built once per shape, with bound parameters (named ``b_*``: the name of
a column would also set that column), and run with the call's values: building and keying
a statement of five common table expressions at every call was a third of a lease's or a
report's time in its API process.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    String,
    Update,
    bindparam,
    case,
    cast,
    exists,
    func,
    insert,
    literal,
    null,
    select,
)
from sqlalchemy.sql import Select

from cubic.store.models import StudyRow, TrialEventRow, TrialRow, UTCDateTime
from cubic.store.objects import StudyState, TrialState

_T = TrialRow.__table__
_S = StudyRow.__table__
_E = TrialEventRow.__table__
_EVENT_COLUMNS = ["trial_id", "study_id", "from_state", "to_state", "at", "worker_id", "detail"]
STUDY_COUNTS = ("study_state", "n_proposed", "n_waiting", "n_running", "gpu_hours")
"""The labels of the study's counts in a row these statements return."""


def _counts(moved: Any) -> list[Any]:
    return [
        moved.c.state.label("study_state"),
        moved.c.n_proposed,
        moved.c.n_waiting,
        moved.c.n_running,
        moved.c.gpu_hours,
    ]


Statement = tuple[Select[Any], dict[str, Any]]
"""A statement and the values of its bound parameters."""


def lease(
    study_id: int,
    worker_id: str,
    n: int,
    deadline: datetime,
    now: datetime,
    max_running: int | None,
) -> Statement:
    """Lease up to ``n`` waiting trials of a running study to ``worker_id`` (who holds none
    of it), keeping at most ``max_running`` running: a row per leased trial, with the
    study's counts after the lease; no row if none was leased (none waited unlocked, or the
    study stopped or reached its cap: read the counts then)."""
    values = {
        "b_study_id": study_id,
        "b_worker_id": worker_id,
        "b_n": n,
        "b_deadline": deadline,
        "b_deadline_iso": deadline.isoformat(),
        "b_at": now,
    }
    if max_running is not None:
        values["b_max_running"] = max_running
    return _lease(max_running is not None), values


@lru_cache(maxsize=2)
def _lease(capped: bool) -> Select[Any]:
    study_id = bindparam("b_study_id", type_=Integer)
    limit: Any = bindparam("b_n", type_=Integer)
    max_running = bindparam("b_max_running", type_=Integer)
    if capped:  # no more than the room the study's row shows now
        running = select(_S.c.n_running).where(_S.c.id == study_id).scalar_subquery()
        limit = func.least(limit, func.greatest(0, max_running - running))
    picked = (
        select(_T.c.id)
        .where(_T.c.study_id == study_id, _T.c.state == TrialState.WAITING.value)
        # What a user queued, the baseline and retries go before the strategy's proposals.
        .order_by(case((_T.c.source == "strategy", 1), else_=0), _T.c.number)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    k = select(func.count()).select_from(picked).scalar_subquery()
    room = [_S.c.id == study_id, _S.c.state == StudyState.RUNNING.value, k > 0]
    if capped:
        # Re-checked on the row's newest version once another writer lets go of it, so
        # the cap is exact across processes.
        room.append(_S.c.n_running + k <= max_running)
    moved = _returning_counts(
        _S.update().where(*room).values(n_waiting=_S.c.n_waiting - k, n_running=_S.c.n_running + k)
    ).cte("moved")
    token = func.replace(cast(func.gen_random_uuid(), String), "-", "")
    leased = (
        _T.update()
        .where(_T.c.id.in_(select(picked.c.id)), exists(select(moved.c.n_running)))
        .values(
            state=TrialState.RUNNING.value,
            worker_id=bindparam("b_worker_id", type_=String),
            lease_token=token,
            lease_deadline=bindparam("b_deadline", type_=UTCDateTime),
            started_at=bindparam("b_at", type_=UTCDateTime),
        )
        .returning(*_T.c)
        .cte("leased")
    )
    detail = func.json_build_object(
        "attempt", leased.c.attempt, "lease_deadline", bindparam("b_deadline_iso", type_=String)
    )
    logged = _logged(leased, TrialState.WAITING, TrialState.RUNNING, detail)
    return (
        select(*leased.c, *_counts(moved))
        .join_from(leased, moved, literal(True))
        .order_by(leased.c.number)
        .add_cte(logged.cte("logged"))
    )


REPORTED = ("metrics", "error", "log_tail", "finished_at")
"""The trial's columns a report writes."""


def report(
    trial_id: int,
    lease_token: str,
    state: TrialState,
    values: dict[str, Any],
    detail: dict[str, Any],
    gpu_hours: float,
) -> Statement:
    """Finish a running trial held under ``lease_token`` with the column ``values``
    (:data:`REPORTED`), log the change with ``detail`` and move its study's counts: the
    trial's row with the counts after, or no row if the trial is no longer running under
    that lease (the caller then asks the ORM path why)."""
    nulls = frozenset(k for k in REPORTED if values[k] is None)
    bound = {f"b_{k}": values[k] for k in REPORTED if k not in nulls}
    bound |= {
        "b_trial_id": trial_id,
        "b_lease_token": lease_token,
        "b_at": values["finished_at"],
        "b_detail": detail,
        "b_gpu_hours": gpu_hours,
    }
    return _report(state, nulls), bound


@lru_cache(maxsize=64)
def _report(state: TrialState, nulls: frozenset[str]) -> Select[Any]:
    # None is SQL NULL, as the ORM writes it (a JSON column would bind it as JSON null).
    written = {
        k: null() if k in nulls else bindparam(f"b_{k}", type_=_T.c[k].type) for k in REPORTED
    }
    done = (
        _T.update()
        .where(
            _T.c.id == bindparam("b_trial_id", type_=Integer),
            _T.c.state == TrialState.RUNNING.value,
            _T.c.lease_token == bindparam("b_lease_token", type_=String),
        )
        .values(state=state.value, lease_deadline=null(), **written)
        .returning(*_T.c)
        .cte("done")
    )
    logged = _logged(done, TrialState.RUNNING, state, bindparam("b_detail", type_=JSON))
    hours = bindparam("b_gpu_hours", type_=Float)
    moved = _returning_counts(
        _S.update()
        .where(_S.c.id == select(done.c.study_id).scalar_subquery())
        .values(n_running=_S.c.n_running - 1, gpu_hours=_S.c.gpu_hours + hours)
    ).cte("moved")
    return (
        select(*done.c, *_counts(moved))
        .join_from(done, moved, literal(True))
        .add_cte(logged.cte("logged"))
    )


def look(study_id: int, worker_id: str) -> Statement:
    """The read before a lease: the study's counts (:data:`STUDY_COUNTS`, then how many of
    its trials ``worker_id`` holds); no row if there is no such study."""
    return _look(), {"b_study_id": study_id, "b_worker_id": worker_id}


@lru_cache(maxsize=1)
def _look() -> Select[Any]:
    study_id = bindparam("b_study_id", type_=Integer)
    own = (
        select(func.count())
        .select_from(_T)
        .where(
            _T.c.study_id == study_id,
            _T.c.state == TrialState.RUNNING.value,
            _T.c.worker_id == bindparam("b_worker_id", type_=String),
        )
        .scalar_subquery()
    )
    counts = [_S.c.state.label("study_state"), _S.c.n_proposed, _S.c.n_waiting, _S.c.n_running]
    return select(*counts, _S.c.gpu_hours, own).where(_S.c.id == study_id)


def trial(trial_id: int) -> Statement:
    """The read before a report: the trial's row, or none."""
    return _trial(), {"b_trial_id": trial_id}


@lru_cache(maxsize=1)
def _trial() -> Select[Any]:
    return select(_T).where(_T.c.id == bindparam("b_trial_id", type_=Integer))


def _logged(changed: Any, from_state: TrialState, to_state: TrialState, detail: Any) -> Any:
    """The insert of an event for each trial row of the CTE ``changed``, at the bound
    parameter ``at``."""
    return insert(_E).from_select(
        _EVENT_COLUMNS,
        select(
            changed.c.id,
            changed.c.study_id,
            literal(from_state.value, String),
            literal(to_state.value, String),
            bindparam("b_at", type_=UTCDateTime),
            changed.c.worker_id,
            detail,
        ),
    )


def _returning_counts(update: Update) -> Update:
    return update.returning(
        _S.c.state, _S.c.n_proposed, _S.c.n_waiting, _S.c.n_running, _S.c.gpu_hours
    )

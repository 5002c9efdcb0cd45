"""A lease and a report as one statement each, on PostgreSQL.

Every lease that hands out a trial and every report writes its study's row (the counts),
so the study's workers queue on that row. In a transaction of several statements the row
stays locked across each round trip that follows the write; on a busy machine the API
process that holds it waits for a core between them, and the study's other calls wait on
it. One statement with data-modifying common table expressions, run outside a
transaction block (autocommit), does the whole change and commits on the server: one
round trip, and the row is locked only while the server runs it. The ORM path of
:class:`~cubic.store.repository.Store` stays the reference (and SQLite's); these are used
for the common case only, and whatever they cannot decide goes back to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    String,
    Update,
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


def lease(
    study_id: int,
    worker_id: str,
    n: int,
    deadline: datetime,
    now: datetime,
    max_running: int | None,
) -> Select[Any]:
    """Lease up to ``n`` waiting trials of a running study to ``worker_id`` (who holds none
    of it), keeping at most ``max_running`` running: a row per leased trial, with the
    study's counts after the lease; no row if none was leased (none waited unlocked, or the
    study stopped or reached its cap: read the counts then)."""
    limit: Any = n
    if max_running is not None:  # no more than the room the study's row shows now
        running = select(_S.c.n_running).where(_S.c.id == study_id).scalar_subquery()
        limit = func.least(n, func.greatest(0, max_running - running))
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
    if max_running is not None:
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
            worker_id=worker_id,
            lease_token=token,
            lease_deadline=deadline,
            started_at=now,
        )
        .returning(*_T.c)
        .cte("leased")
    )
    detail = func.json_build_object(
        "attempt", leased.c.attempt, "lease_deadline", deadline.isoformat()
    )
    logged = _logged(leased, TrialState.WAITING, TrialState.RUNNING, now, detail)
    return (
        select(*leased.c, *_counts(moved))
        .join_from(leased, moved, literal(True))
        .order_by(leased.c.number)
        .add_cte(logged.cte("logged"))
    )


def report(
    trial_id: int,
    lease_token: str,
    state: TrialState,
    values: dict[str, Any],
    detail: dict[str, Any],
    gpu_hours: float,
) -> Select[Any]:
    """Finish a running trial held under ``lease_token`` with the column ``values``
    (metrics, error, log_tail, finished_at), log the change with ``detail`` and move its
    study's counts: the trial's row with the counts after, or no row if the trial is no
    longer running under that lease (the caller then asks the ORM path why)."""
    done = (
        _T.update()
        .where(
            _T.c.id == trial_id,
            _T.c.state == TrialState.RUNNING.value,
            _T.c.lease_token == lease_token,
        )
        # None is SQL NULL, as the ORM writes it (a JSON column would take it as JSON null).
        .values(state=state.value, lease_deadline=null(), **_nulls(values))
        .returning(*_T.c)
        .cte("done")
    )
    at = values["finished_at"]
    logged = _logged(done, TrialState.RUNNING, state, at, literal(detail, JSON))
    moved = _returning_counts(
        _S.update()
        .where(_S.c.id == select(done.c.study_id).scalar_subquery())
        .values(n_running=_S.c.n_running - 1, gpu_hours=_S.c.gpu_hours + gpu_hours)
    ).cte("moved")
    return (
        select(*done.c, *_counts(moved))
        .join_from(done, moved, literal(True))
        .add_cte(logged.cte("logged"))
    )


def _logged(
    changed: Any, from_state: TrialState, to_state: TrialState, at: datetime, detail: Any
) -> Any:
    """The insert of an event for each trial row of the CTE ``changed``."""
    return insert(_E).from_select(
        _EVENT_COLUMNS,
        select(
            changed.c.id,
            changed.c.study_id,
            literal(from_state.value, String),
            literal(to_state.value, String),
            literal(at, UTCDateTime),
            changed.c.worker_id,
            detail,
        ),
    )


def _returning_counts(update: Update) -> Update:
    return update.returning(
        _S.c.state, _S.c.n_proposed, _S.c.n_waiting, _S.c.n_running, _S.c.gpu_hours
    )


def _nulls(values: dict[str, Any]) -> dict[str, Any]:
    return {name: null() if value is None else value for name, value in values.items()}

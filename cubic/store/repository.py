"""The repository: every read and write of cubic's state goes through :class:`Store`.

Each method runs in its own short transaction and returns immutable snapshots
(:mod:`cubic.store.objects`). The store, not its callers, enforces the trial life cycle: a
finished trial is never changed, a lease is honoured only with its token, and a failed trial
is retried (as a new trial) at most ``study.max_attempts - 1`` times.

Concurrency: on PostgreSQL, trial leasing and reaping use ``SELECT ... FOR UPDATE SKIP LOCKED``
and trial numbering locks the study row, so any number of service processes can share one
database. On SQLite every writing transaction starts with ``BEGIN IMMEDIATE`` (see
:mod:`cubic.store.engine`), which serialises writers across threads and processes.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from sqlalchemy import Engine, case, func, select, text, update
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from cubic.errors import (
    Conflict,
    CubicError,
    InvalidInput,
    LeaseLost,
    NotFound,
    StorageError,
    TrialFinished,
)
from cubic.objectives import number
from cubic.store import one_statement, schema
from cubic.store.engine import WRITE_OPTION, is_postgresql, make_engine
from cubic.store.models import (
    ApiTokenRow,
    ProxyModelRow,
    StudyRow,
    TrialEventRow,
    TrialRow,
    WorkerIdentityRow,
)
from cubic.store.objects import (
    TRIAL_SOURCES,
    ApiToken,
    ProxyModelVersion,
    Role,
    Study,
    StudyCounts,
    StudyState,
    Trial,
    TrialEvent,
    TrialState,
)

LEASE_EXPIRED = "lease expired"
MAX_LOG_TAIL = 64 * 1024
#: Worker bindings a store keeps in memory (a few MiB at most).
MAX_BOUND_WORKERS = 65_536
#: How long a token read from the database is trusted without reading it again, and how
#: many a store keeps: the longest a revocation takes to reach another API process.
TOKEN_CACHE_S = 2.0
MAX_CACHED_TOKENS = 4_096
"""Characters of a trial's log kept in the database (the end of the log is what matters)."""

_PG_STUDY_LOCK_NS = 0x63756270
_PG_PROXY_LOCK_NS = 0x63756271  # a version number is taken (save_proxy_model)
# Not the version lock's: the fitting process saves the version on another connection, and
# there a lock held by this one would be waited for forever.
_PG_PROXY_FIT_LOCK_NS = 0x63756272
_PG_PROPOSER_NS = 0x63756273  # a study's proposer (see Store.claims)
_TRIAL_ORDERS = {
    "number": (TrialRow.number.asc(),),
    "-number": (TrialRow.number.desc(),),
    "id": (TrialRow.id.asc(),),
    "-id": (TrialRow.id.desc(),),
    "finished_at": (TrialRow.finished_at.asc().nulls_last(), TrialRow.number.asc()),
    "-finished_at": (TrialRow.finished_at.desc().nulls_last(), TrialRow.number.asc()),
}

_local_locks: dict[tuple[str, int], threading.Lock] = {}
_local_locks_guard = threading.Lock()
_lock_files: dict[str, Any] = {}  # SQLite lock file -> this process's open handle

TrialRecord = tuple[dict[str, Any], TrialState | str, dict[str, Any] | None]
"""An imported past run: (params, finished state, metrics)."""


class Store:
    """cubic's persistent state, over SQLite or PostgreSQL.

    ``Store(url)`` opens an existing database and, with ``check_schema`` (the default),
    refuses one whose schema is missing or old (:class:`~cubic.errors.SchemaOutOfDate`):
    migrating is an explicit step (``cubic db upgrade``, :func:`cubic.store.schema.upgrade`).
    ``Store.create(url)`` migrates first, for tests and demos. A store built from a URL owns
    its engine and disposes of it in :meth:`close`; one built from an engine does not.
    Safe to share between threads.
    """

    def __init__(
        self, url_or_engine: str | URL | Engine | None = None, *, check_schema: bool = True
    ) -> None:
        self._owns_engine = not isinstance(url_or_engine, Engine)
        self._engine = (
            url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine)
        )
        self._pg = is_postgresql(self._engine)
        self._pg_schema: str | None = None  # read on the first advisory lock
        # Worker id -> the token it is bound to. A binding never changes once made, so
        # every process may keep what it has read (bounded: cleared when full).
        self._bound: dict[str, int] = {}
        self._tokens: dict[str, tuple[float, ApiToken]] = {}  # digest -> (read at, token)
        # A read on PostgreSQL runs without BEGIN and COMMIT (two round trips fewer): each
        # statement has a snapshot of its own under READ COMMITTED in a transaction too.
        self._autocommit = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        self._read = sessionmaker(
            self._autocommit if self._pg else self._engine, expire_on_commit=False
        )
        self._write = sessionmaker(
            self._engine, expire_on_commit=False, execution_options={WRITE_OPTION: True}
        )
        if check_schema:
            try:
                schema.check_schema(self._engine)
            except BaseException:
                self.close()
                raise

    @classmethod
    def create(cls, url_or_engine: str | URL | Engine | None = None) -> Self:
        """Migrate the database to the current schema, then open it."""
        schema.upgrade(url_or_engine)
        return cls(url_or_engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Release the connections of an engine this store created."""
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions -----------------------------------------------------------------------

    @contextmanager
    def _session(self, *, write: bool) -> Iterator[Session]:
        maker = self._write if write else self._read
        with _storage_errors(), maker() as session, session.begin():
            yield session

    def _one_statement(self, statement: one_statement.Statement) -> list[Any]:
        """Run one statement that commits on its own (PostgreSQL), with its bound values;
        its rows."""
        query, values = statement
        with _storage_errors(), self._autocommit.connect() as conn:
            return list(conn.execute(query, values).all())

    def _read_first(self, statement: one_statement.Statement) -> Any:
        """The first row of a read built once (see :mod:`cubic.store.one_statement`), or
        None: no session, no building the query per call."""
        query, values = statement
        engine = self._autocommit if self._pg else self._engine
        with _storage_errors(), engine.connect() as conn:
            return conn.execute(query, values).first()

    # -- studies ----------------------------------------------------------------------------

    def create_study(
        self,
        name: str,
        spec: dict[str, Any],
        workload_kind: str,
        max_attempts: int = 3,
        owner_token_id: int | None = None,
    ) -> Study:
        """Create a running study. ``max_attempts`` caps how often one config is tried;
        ``owner_token_id`` is the token that submitted it."""
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput("study name must be a non-empty string")
        if not isinstance(workload_kind, str) or not workload_kind.strip():
            raise InvalidInput("workload_kind must be a non-empty string")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        spec = _json_dict(spec, "spec")
        now = _utcnow()
        with self._session(write=True) as s:
            row = StudyRow(
                name=name,
                spec=spec,
                workload_kind=workload_kind,
                state=StudyState.RUNNING.value,
                max_attempts=max_attempts,
                created_at=now,
                updated_at=now,
                owner_token_id=owner_token_id,
            )
            s.add(row)
            s.flush()
            return _study(row)

    # -- API tokens -------------------------------------------------------------------------

    def create_token(
        self, name: str, role: Role | str, study_id: int | None = None
    ) -> tuple[ApiToken, str]:
        """A new token; returns its record and its secret, which is not stored (only its
        digest is) and so can be shown once."""
        try:
            role = Role(role)
        except ValueError:
            raise InvalidInput(
                f"role: expected one of {', '.join(r.value for r in Role)}, got {role!r}",
                field="role",
            ) from None
        if not isinstance(name, str) or not name.strip() or len(name) > 255:
            raise InvalidInput("name: 1 to 255 characters", field="name")
        if study_id is not None:
            self.get_study(study_id)  # NotFound for an unknown study
        secret = "cubic_" + secrets.token_urlsafe(32)
        with self._session(write=True) as s:
            row = ApiTokenRow(
                name=name,
                role=role.value,
                study_id=study_id,
                digest=token_digest(secret),
                created_at=_utcnow(),
            )
            s.add(row)
            s.flush()
            return _token(row), secret

    def token_for(self, secret: str, touch_after_s: float = 60.0) -> ApiToken | None:
        """The token whose secret this is (revoked ones included), or None. Its
        ``last_used_at`` is brought up to date at most every ``touch_after_s``.

        A token found is kept in memory for :data:`TOKEN_CACHE_S` seconds, so that a
        worker's lease and report do not each read it again: a revocation reaches this
        store at once and every other process within that time."""
        digest = token_digest(secret)
        cached = self._tokens.get(digest)
        if cached is not None and time.monotonic() - cached[0] < TOKEN_CACHE_S:
            return cached[1]
        now = _utcnow()
        with self._session(write=False) as s:
            row = s.scalar(select(ApiTokenRow).where(ApiTokenRow.digest == digest))
            if row is None:
                return None
            token = _token(row)
        _keep(self._tokens, digest, (time.monotonic(), token), MAX_CACHED_TOKENS)
        last = token.last_used_at
        if token.revoked_at is None and (
            last is None or (now - last).total_seconds() > touch_after_s
        ):
            with self._session(write=True) as s:
                s.execute(
                    update(ApiTokenRow).where(ApiTokenRow.id == token.id).values(last_used_at=now)
                )
        return token

    def list_tokens(self) -> list[ApiToken]:
        with self._session(write=False) as s:
            return [_token(r) for r in s.scalars(select(ApiTokenRow).order_by(ApiTokenRow.id))]

    def revoke_token(self, token_id: int) -> ApiToken:
        """Revoke a token for good (revoking it again changes nothing)."""
        with self._session(write=True) as s:
            row = s.get(ApiTokenRow, token_id)
            if row is None:
                raise NotFound(f"token {token_id} does not exist")
            if row.revoked_at is None:
                row.revoked_at = _utcnow()
            for digest in [d for d, (_, t) in list(self._tokens.items()) if t.id == token_id]:
                self._tokens.pop(digest, None)
            return _token(row)

    def bind_worker(self, worker_id: str, token_id: int) -> int:
        """Bind a worker id to the token that first uses it; returns the token it is bound
        to (another one's: the caller may not act as that worker)."""
        bound = self.worker_token(worker_id)  # every lease asks: from memory once read
        if bound is not None:
            return bound
        try:
            with self._session(write=True) as s:
                s.add(
                    WorkerIdentityRow(worker_id=worker_id, token_id=token_id, created_at=_utcnow())
                )
            _keep(self._bound, worker_id, token_id, MAX_BOUND_WORKERS)
            return token_id
        except StorageError:  # another request bound it first
            bound = self.worker_token(worker_id)
            if bound is None:
                raise
            return bound

    def worker_token(self, worker_id: str | None) -> int | None:
        """The token a worker id is bound to, if any."""
        if worker_id is None:
            return None
        if worker_id in self._bound:
            return self._bound[worker_id]
        with self._session(write=False) as s:
            row = s.get(WorkerIdentityRow, worker_id)
            if row is None:
                return None
            _keep(self._bound, worker_id, row.token_id, MAX_BOUND_WORKERS)
            return row.token_id

    def get_study(self, study_id: int) -> Study:
        with self._session(write=False) as s:
            return _study(_get_study(s, study_id))

    def study_counts(self, study_id: int) -> StudyCounts:
        """The study's state and trial counts: one row, whatever the history's size."""
        with self._session(write=False) as s:
            return _study_counts(s, study_id)

    def running_studies(self) -> dict[int, StudyCounts]:
        """The counts of every running study (a background proposer's one query a tick)."""
        c = StudyRow
        query = select(c.id, c.state, c.n_proposed, c.n_waiting, c.n_running, c.gpu_hours).where(
            c.state == StudyState.RUNNING.value
        )
        with self._session(write=False) as s:
            rows = s.execute(query).all()
        return {int(r[0]): _counts_of(r[1:]) for r in rows}

    def last_event_id(self, study_id: int) -> int:
        """The id of the study's newest trial event (0 when it has none)."""
        query = select(func.max(TrialEventRow.id)).where(TrialEventRow.study_id == study_id)
        with self._session(write=False) as s:
            return int(s.scalar(query) or 0)

    def trials_changed(
        self, study_id: int, after_event: int, known: Container[int] = ()
    ) -> tuple[list[Trial], int]:
        """Trials of a study with a state change after event ``after_event``, and the id of
        the newest such event (``after_event`` when there is none): a reader that keeps the
        history reads only what changed. Trials whose ids are in ``known`` (finished ones
        the reader holds: a finished trial never changes) are not read again."""
        with self._session(write=False) as s:
            events = s.execute(
                select(TrialEventRow.id, TrialEventRow.trial_id).where(
                    TrialEventRow.study_id == study_id, TrialEventRow.id > after_event
                )
            ).all()
            if not events:
                return [], after_event
            newest = max(eid for eid, _ in events)
            ids = sorted({tid for _, tid in events if tid not in known})
            if not ids:
                return [], newest
            rows = s.scalars(select(TrialRow).where(TrialRow.id.in_(ids)).order_by(TrialRow.number))
            return [_trial(r, fresh=True) for r in rows], newest

    def list_studies(
        self,
        state: StudyState | str | None = None,
        workload_kind: str | None = None,
        limit: int | None = 50,
        offset: int = 0,
    ) -> list[Study]:
        """Studies in creation order, optionally filtered."""
        _check_page(limit, offset)
        query = _filter_studies(select(StudyRow), state, workload_kind)
        query = query.order_by(StudyRow.id).offset(offset).limit(limit)
        with self._session(write=False) as s:
            return [_study(r) for r in s.scalars(query)]

    def count_studies(
        self, state: StudyState | str | None = None, workload_kind: str | None = None
    ) -> int:
        query = _filter_studies(select(func.count(StudyRow.id)), state, workload_kind)
        with self._session(write=False) as s:
            return int(s.scalar(query) or 0)

    def set_study_state(self, study_id: int, state: StudyState | str) -> Study:
        """Move a study to ``state``. An archived study is final: it cannot be resumed."""
        new = _study_state(state)
        with self._session(write=True) as s:
            row = _get_study(s, study_id, lock=True)
            if row.state == StudyState.ARCHIVED and new != StudyState.ARCHIVED:
                raise Conflict(f"study {study_id} is archived and cannot become {new}")
            if row.state != new:
                row.state = new.value
                row.updated_at = _utcnow()
            s.flush()
            return _study(row)

    # -- creating trials --------------------------------------------------------------------

    def add_trials(
        self,
        study_id: int,
        params_list: Sequence[dict[str, Any]],
        *,
        source: str = "strategy",
        predicted: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[Trial]:
        """Add waiting trials, numbered after the study's last trial, in list order."""
        _check_source(source)
        params = [_json_dict(p, "params") for p in params_list]
        if predicted is None:
            preds: list[dict[str, Any] | None] = [None] * len(params)
        else:
            if len(predicted) != len(params):
                raise InvalidInput(
                    f"predicted has {len(predicted)} entries for {len(params)} params"
                )
            preds = [None if p is None else _json_dict(p, "predicted") for p in predicted]
        now = _utcnow()
        with self._session(write=True) as s:
            study = _get_study(s, study_id, lock=True)
            if study.state == StudyState.ARCHIVED:
                raise Conflict(f"study {study_id} is archived; no trials can be added")
            rows = [
                TrialRow(
                    params=p,
                    predicted=pred,
                    state=TrialState.WAITING.value,
                    source=source,
                    attempt=1,
                    created_at=now,
                )
                for p, pred in zip(params, preds, strict=True)
            ]
            self._insert(s, study.id, rows, now)
            _count(s, study.id, proposed=len(rows), waiting=len(rows))
            return [_trial(r) for r in rows]

    def add_finished_trials(
        self,
        study_id: int,
        records: Sequence[TrialRecord],
        source: str = "imported",
        *,
        predicted: Sequence[dict[str, Any] | None] | None = None,
        errors: Sequence[str | None] | None = None,
    ) -> list[Trial]:
        """Import past runs (e.g. from an earlier tuning campaign) as finished trials.

        ``predicted`` and ``errors`` (one entry per record, or None) carry what a proxy
        predicted and why a run did not complete, as a finished trial of the study has them.
        """
        _check_source(source)
        preds = _per_record(predicted, len(records), "predicted")
        errs = _per_record(errors, len(records), "errors")
        if any(e is not None and not isinstance(e, str) for e in errs):
            raise InvalidInput("errors must be strings or None")
        preds = [None if p is None else _json_dict(p, "predicted") for p in preds]
        prepared = []
        for record in records:
            try:
                params, state, metrics = record
            except (TypeError, ValueError):
                raise InvalidInput("each record must be (params, state, metrics)") from None
            finished = _trial_state(state)
            if not finished.is_finished:
                raise InvalidInput(f"imported trials must be finished, got state {finished}")
            metrics_json = None if metrics is None else _json_dict(metrics, "metrics")
            if finished == TrialState.COMPLETE and metrics_json is None:
                raise InvalidInput("a complete trial needs metrics")
            prepared.append((_json_dict(params, "params"), finished, metrics_json))
        now = _utcnow()
        with self._session(write=True) as s:
            study = _get_study(s, study_id, lock=True)
            rows = [
                TrialRow(
                    params=p,
                    state=st.value,
                    metrics=m,
                    predicted=pred,
                    error=err,
                    source=source,
                    attempt=1,
                    created_at=now,
                    finished_at=now,
                )
                for (p, st, m), pred, err in zip(prepared, preds, errs, strict=True)
            ]
            self._insert(s, study.id, rows, now)
            if source != "imported":  # imported past runs cost nothing now
                _count(
                    s,
                    study.id,
                    proposed=len(rows),
                    gpu_hours=sum(_gpu_hours(r.metrics) for r in rows),
                )
            return [_trial(r) for r in rows]

    def _insert(self, s: Session, study_id: int, rows: list[TrialRow], now: datetime) -> None:
        """Number and insert new trials; the caller holds the study row lock."""
        last = s.scalar(select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id))
        start = -1 if last is None else last
        for i, row in enumerate(rows, start=start + 1):
            row.study_id = study_id
            row.number = i
        s.add_all(rows)
        s.flush()
        for row in rows:
            detail: dict[str, Any] = {"source": row.source, "attempt": row.attempt}
            if row.retry_of is not None:
                detail["retry_of"] = row.retry_of
            _event(s, row, None, row.state, now, None, detail)

    def _retry(self, s: Session, failed: TrialRow, now: datetime) -> TrialRow | None:
        """Create the retry of a failed trial if its study's attempt cap allows one."""
        study = _get_study(s, failed.study_id, lock=True)
        if failed.attempt >= study.max_attempts:
            return None
        row = TrialRow(
            params=copy.deepcopy(failed.params),
            predicted=copy.deepcopy(failed.predicted),
            state=TrialState.WAITING.value,
            source="retry",
            attempt=failed.attempt + 1,
            retry_of=failed.id,
            created_at=now,
        )
        self._insert(s, study.id, [row], now)
        _count(s, study.id, waiting=1)
        return row

    # -- leases -----------------------------------------------------------------------------

    def lease_trials(
        self,
        study_id: int,
        worker_id: str,
        n: int,
        lease_seconds: float,
        now: datetime | None = None,
        max_running: int | None = None,
    ) -> list[Trial]:
        """Lease up to ``n`` trials of a study to ``worker_id`` (see :meth:`lease`)."""
        return self.lease(study_id, worker_id, n, lease_seconds, now, max_running)[0]

    def lease(
        self,
        study_id: int,
        worker_id: str,
        n: int,
        lease_seconds: float,
        now: datetime | None = None,
        max_running: int | None = None,
    ) -> tuple[list[Trial], StudyCounts]:
        """Lease up to ``n`` trials of a study to ``worker_id``, and never so many that more
        than ``max_running`` of the study's trials run at once; with the study's state and
        counts after the lease, read in the same transaction.

        Idempotent per worker: the worker's own running trials in the study come first
        (their deadlines extended, all of them even if more than ``n``), then waiting trials
        fill the rest: queued configs, the baseline and retries first, then the strategy's
        proposals, each in number order. New trials are leased only while the study is
        running; a paused or stopped study still hands a worker back what it holds.

        The study's row, which every lease and report of the study writes (its counts), is
        held as briefly as can be: on PostgreSQL a lease to a worker that holds none of the
        study's trials is one statement that commits on the server
        (:mod:`cubic.store.one_statement`), not a transaction that keeps the row locked
        across its round trips.
        """
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidInput("worker_id must be a non-empty string")
        if not isinstance(n, int) or n < 0:
            raise InvalidInput(f"n must be an integer >= 0, got {n!r}")
        now = _check_now(now)
        deadline = now + _lease_delta(lease_seconds)
        holds = None  # not looked: a lease of nothing new hands back what the worker holds
        if n > 0:
            counts, holds = self._look_before_lease(study_id, worker_id)
            capped = max_running is not None and counts.running >= max_running
            if not holds and (counts.state != StudyState.RUNNING or not counts.waiting or capped):
                return [], counts
        if self._pg and holds == 0:
            rows = self._one_statement(
                one_statement.lease(study_id, worker_id, n, deadline, now, max_running)
            )
            if not rows:  # taken by others since the look, or the study stopped or is full
                return [], self.study_counts(study_id)
            return [_trial(r, fresh=True) for r in rows], _counts_of(_study_part(rows[-1]))
        # A transaction (SQLite, whose writer lock covers the whole database from its start;
        # or a worker that holds trials of the study).
        with self._session(write=True) as s:
            state = s.scalar(select(StudyRow.state).where(StudyRow.id == study_id))
            if state is None:
                raise NotFound(f"study {study_id} not found")
            own = list(
                s.scalars(
                    select(TrialRow)
                    .where(
                        TrialRow.study_id == study_id,
                        TrialRow.state == TrialState.RUNNING.value,
                        TrialRow.worker_id == worker_id,
                    )
                    .order_by(TrialRow.number)
                    .with_for_update()
                )
            )
            for row in own:
                row.lease_deadline = deadline
            fresh: list[TrialRow] = []
            wanted = n - len(own)
            if wanted > 0 and state == StudyState.RUNNING:
                fresh = list(
                    s.scalars(
                        select(TrialRow)
                        .where(
                            TrialRow.study_id == study_id,
                            TrialRow.state == TrialState.WAITING.value,
                        )
                        # What a user queued, the baseline and retries go before the
                        # strategy's proposals, which may have been made ahead of them.
                        .order_by(
                            case((TrialRow.source == "strategy", 1), else_=0), TrialRow.number
                        )
                        .limit(wanted)
                        .with_for_update(skip_locked=True)
                    )
                )
            if fresh and max_running is not None:
                # The study row's lock makes the cap exact across processes.
                running = s.scalar(
                    select(StudyRow.n_running)
                    .where(StudyRow.id == study_id)
                    .with_for_update(key_share=True)
                )
                fresh = fresh[: max(0, max_running - int(running or 0))]
            for row in fresh:
                row.state = TrialState.RUNNING.value
                row.worker_id = worker_id
                row.lease_token = uuid.uuid4().hex
                row.lease_deadline = deadline
                row.started_at = now
                _event(
                    s,
                    row,
                    TrialState.WAITING,
                    TrialState.RUNNING,
                    now,
                    worker_id,
                    {"attempt": row.attempt, "lease_deadline": deadline.isoformat()},
                )
            s.flush()
            moved = _count(s, study_id, waiting=-len(fresh), running=len(fresh))
            counts = moved or _study_counts(s, study_id)
        return [_trial(r) for r in own + fresh], counts

    def _look_before_lease(self, study_id: int, worker_id: str) -> tuple[StudyCounts, int]:
        """The study's counts and how many of its trials ``worker_id`` holds, read in one
        statement without a lock or a write.

        Most leases of a busy study hand out nothing (workers asking again while a round is
        proposed): they cost this read, not the locking transaction of a lease that hands a
        trial out. A trial that comes to wait just after is leased on the worker's next ask.
        """
        row = self._read_first(one_statement.look(study_id, worker_id))
        if row is None:
            raise NotFound(f"study {study_id} not found")
        return _counts_of(row[:5]), int(row[5])

    def heartbeat(
        self,
        trial_id: int,
        lease_token: str,
        lease_seconds: float,
        now: datetime | None = None,
    ) -> Trial:
        """Extend a lease to ``now + lease_seconds``. A lease stays valid until reaped."""
        now = _check_now(now)
        delta = _lease_delta(lease_seconds)
        with self._session(write=True) as s:
            row = _get_trial(s, trial_id, lock=True)
            _check_lease(row, lease_token)
            row.lease_deadline = now + delta
            s.flush()
            return _trial(row)

    def finish_trial(
        self, trial_id: int, lease_token: str, state: TrialState | str, **options: Any
    ) -> tuple[Trial, Trial | None]:
        """Report the outcome of a leased trial; returns (trial, retry or None). The
        ``options`` (metrics, error, log_tail, now, check) are :meth:`finish_trial_counted`'s,
        which also returns the study's counts."""
        trial, retry, _ = self.finish_trial_counted(trial_id, lease_token, state, **options)
        return trial, retry

    def finish_trial_counted(
        self,
        trial_id: int,
        lease_token: str,
        state: TrialState | str,
        *,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
        log_tail: str | None = None,
        now: datetime | None = None,
        check: Callable[[Trial], str | None] | None = None,
    ) -> tuple[Trial, Trial | None, StudyCounts | None]:
        """Report the outcome of a leased trial, in one transaction with what a report needs:
        ``check(trial)`` runs on the locked, still leased trial before it changes, and may
        refuse the report (raise) or return the error text to record instead of ``error``;
        the study's counts after the change come back as the third item (None for a
        repeated report, which changes nothing).

        A ``failed`` trial gets a retry (a new waiting trial with the same params and the
        next attempt number) while ``attempt < study.max_attempts``. Repeating the same
        report with the same token changes nothing and returns the same answer, so a worker
        can resend after a lost response. Any other report on a finished trial, or a report
        without the current lease, raises :class:`~cubic.errors.Conflict`.
        """
        new = _trial_state(state)
        if not new.is_finished:
            raise InvalidInput(
                f"a trial can only be finished as one of {_names(TrialState.FINISHED)}"
            )
        metrics_json = None if metrics is None else _json_dict(metrics, "metrics")
        if new == TrialState.COMPLETE and metrics_json is None:
            raise InvalidInput("a complete trial needs metrics")
        if error is not None and not isinstance(error, str):
            raise InvalidInput("error must be a string")
        if log_tail is not None:
            if not isinstance(log_tail, str):
                raise InvalidInput("log_tail must be a string")
            log_tail = log_tail[-MAX_LOG_TAIL:]
        now = _check_now(now)
        if self._pg and new != TrialState.FAILED:  # a failed trial's retry: the ORM path
            values = {"metrics": metrics_json, "error": error, "log_tail": log_tail}
            done = self._report_in_one(trial_id, lease_token, new, values, now, check)
            if done is not None:
                return done
        with self._session(write=True) as s:
            row = _get_trial(s, trial_id, lock=True)
            current = TrialState(row.state)
            if current.is_finished:
                if not _same_token(row.lease_token, lease_token):
                    raise LeaseLost(
                        f"trial {trial_id} was finished ({current}) under another lease"
                    )
                if current != new:
                    raise TrialFinished(
                        f"trial {trial_id} is already {current} and cannot become {new}"
                    )
                retry = s.scalar(select(TrialRow).where(TrialRow.retry_of == row.id))
                return _trial(row), None if retry is None else _trial(retry), None
            _check_lease(row, lease_token)
            if check is not None:
                error = check(_trial(row))
            row.state = new.value
            row.metrics = metrics_json
            row.error = error
            row.log_tail = log_tail
            row.finished_at = now
            row.lease_deadline = None
            retry_row = self._retry(s, row, now) if new == TrialState.FAILED else None
            detail: dict[str, Any] = {}
            if error is not None:
                detail["error"] = error[:1000]
            if retry_row is not None:
                detail["retry_trial_id"] = retry_row.id
            _event(s, row, TrialState.RUNNING, new, now, row.worker_id, detail)
            s.flush()
            hours = _gpu_hours(metrics_json) if row.source != "imported" else 0.0
            # Last: the study's row stays locked only until the commit.
            counts = _count(s, row.study_id, running=-1, gpu_hours=hours)
        return _trial(row), None if retry_row is None else _trial(retry_row), counts

    def _report_in_one(
        self,
        trial_id: int,
        lease_token: str,
        new: TrialState,
        values: dict[str, Any],
        now: datetime,
        check: Callable[[Trial], str | None] | None,
    ) -> tuple[Trial, None, StudyCounts] | None:
        """:meth:`finish_trial_counted` of a trial still running under ``lease_token`` as
        one read and one statement that commits (PostgreSQL: see
        :mod:`cubic.store.one_statement`); None if the trial is not (or no longer) so held,
        for the ORM path to say why (a repeated report, a lost lease)."""
        row = self._read_first(one_statement.trial(trial_id))
        if row is None or row.state != TrialState.RUNNING.value:
            return None
        if not _same_token(row.lease_token, lease_token):
            return None
        if check is not None:
            # The params and the study of a leased trial never change: the check holds for
            # the statement below, which writes only while the same lease holds it.
            values["error"] = check(_trial(row, fresh=True))
        detail = {} if values["error"] is None else {"error": values["error"][:1000]}
        hours = _gpu_hours(values["metrics"]) if row.source != "imported" else 0.0
        statement = one_statement.report(
            trial_id, lease_token, new, {**values, "finished_at": now}, detail, hours
        )
        rows = self._one_statement(statement)
        if not rows:
            return None
        return _trial(rows[0], fresh=True), None, _counts_of(_study_part(rows[0]))

    def release_trial(self, trial_id: int, lease_token: str) -> Trial:
        """Give a leased trial back (running -> waiting), e.g. when a worker shuts down."""
        now = _utcnow()
        with self._session(write=True) as s:
            row = _get_trial(s, trial_id, lock=True)
            _check_lease(row, lease_token)
            worker = row.worker_id
            row.state = TrialState.WAITING.value
            row.worker_id = None
            row.lease_token = None
            row.lease_deadline = None
            row.started_at = None
            _event(
                s, row, TrialState.RUNNING, TrialState.WAITING, now, worker, {"reason": "released"}
            )
            _count(s, row.study_id, waiting=1, running=-1)
            s.flush()
            return _trial(row)

    def reap_expired(self, now: datetime | None = None) -> list[Trial]:
        """Fail every running trial whose lease deadline has passed, and create its retry.

        The lease is revoked (its token cleared), so a late report from the worker that held
        it raises :class:`~cubic.errors.LeaseLost`. Safe to run from several processes at
        once: each expired trial is reaped by exactly one of them.
        """
        now = _check_now(now)
        expired = (TrialRow.state == TrialState.RUNNING.value, TrialRow.lease_deadline < now)
        with self._session(write=False) as s:  # mostly none: a read, not a write transaction
            if s.scalar(select(TrialRow.id).where(*expired).limit(1)) is None:
                return []
        with self._session(write=True) as s:
            rows = list(
                s.scalars(
                    select(TrialRow)
                    .where(
                        TrialRow.state == TrialState.RUNNING.value,
                        TrialRow.lease_deadline < now,
                    )
                    # Study order: _retry locks study rows, always in ascending id order.
                    .order_by(TrialRow.study_id, TrialRow.id)
                    .with_for_update(skip_locked=True)
                )
            )
            for row in rows:
                deadline = row.lease_deadline
                row.state = TrialState.FAILED.value
                row.error = LEASE_EXPIRED
                row.finished_at = now
                row.lease_token = None
                row.lease_deadline = None
                retry = self._retry(s, row, now)
                _count(s, row.study_id, running=-1)
                detail: dict[str, Any] = {
                    "reason": LEASE_EXPIRED,
                    "lease_deadline": None if deadline is None else deadline.isoformat(),
                }
                if retry is not None:
                    detail["retry_trial_id"] = retry.id
                _event(s, row, TrialState.RUNNING, TrialState.FAILED, now, row.worker_id, detail)
            s.flush()
            return [_trial(r) for r in rows]

    def set_predicted(self, trial_id: int, predicted: dict[str, Any]) -> Trial:
        """Attach the proxy model's prediction; the only column that may change at any state."""
        value = _json_dict(predicted, "predicted")
        with self._session(write=True) as s:
            row = _get_trial(s, trial_id, lock=True)
            row.predicted = value
            s.flush()
            return _trial(row)

    # -- reading trials ---------------------------------------------------------------------

    def get_trial(self, trial_id: int) -> Trial:
        with self._session(write=False) as s:
            return _trial(_get_trial(s, trial_id))

    def list_trials(
        self,
        study_id: int,
        states: Iterable[TrialState | str] | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: str = "number",
    ) -> list[Trial]:
        """Trials of a study; ``order`` is one of number, id, finished_at (``-`` reverses)."""
        _check_page(limit, offset)
        if order not in _TRIAL_ORDERS:
            raise InvalidInput(f"order must be one of {sorted(_TRIAL_ORDERS)}, got {order!r}")
        query = select(TrialRow).where(TrialRow.study_id == study_id)
        if states is not None:
            query = query.where(TrialRow.state.in_(_state_values(states)))
        query = query.order_by(*_TRIAL_ORDERS[order]).offset(offset).limit(limit)
        with self._session(write=False) as s:
            _get_study(s, study_id)
            return [_trial(r, fresh=True) for r in s.scalars(query)]

    def count_trials(self, study_id: int) -> dict[TrialState, int]:
        """Number of trials per state, every state present (zeros included)."""
        counts = dict.fromkeys(TrialState, 0)
        with self._session(write=False) as s:
            _get_study(s, study_id)
            rows = s.execute(
                select(TrialRow.state, func.count(TrialRow.id))
                .where(TrialRow.study_id == study_id)
                .group_by(TrialRow.state)
            )
            for state, count in rows:
                counts[TrialState(state)] = int(count)
        return counts

    def trial_events(self, trial_id: int) -> list[TrialEvent]:
        """A trial's state transitions, oldest first."""
        with self._session(write=False) as s:
            _get_trial(s, trial_id)
            rows = s.scalars(
                select(TrialEventRow)
                .where(TrialEventRow.trial_id == trial_id)
                .order_by(TrialEventRow.id)
            )
            return [_trial_event(r) for r in rows]

    def history_for_kind(
        self,
        workload_kind: str,
        exclude_study: int | None = None,
        states: Iterable[TrialState | str] | None = None,
        limit: int | None = None,
    ) -> list[Trial]:
        """Trials of every study of a workload kind, for transfer learning across studies,
        by study and number; with ``limit``, only the newest ``limit`` of them (the last
        stored), so that a reader's memory and time stay bounded as the history grows."""
        query = (
            select(TrialRow)
            .join(StudyRow, StudyRow.id == TrialRow.study_id)
            .where(StudyRow.workload_kind == workload_kind)
        )
        if exclude_study is not None:
            query = query.where(TrialRow.study_id != exclude_study)
        if states is not None:
            query = query.where(TrialRow.state.in_(_state_values(states)))
        if limit is not None:
            if limit < 0:
                raise InvalidInput(f"limit must be >= 0, got {limit}", field="limit")
            query = query.order_by(TrialRow.id.desc()).limit(limit)
        else:
            query = query.order_by(TrialRow.study_id, TrialRow.number)
        with self._session(write=False) as s:
            out = [_trial(r, fresh=True) for r in s.scalars(query)]
        if limit is not None:
            out.sort(key=lambda t: (t.study_id, t.number))
        return out

    def count_for_kind(
        self, workload_kind: str, states: Iterable[TrialState | str] | None = None
    ) -> int:
        """How many trials the studies of a workload kind hold (in ``states``): whether a
        refit may be due, without reading them."""
        query = (
            select(func.count(TrialRow.id))
            .join(StudyRow, StudyRow.id == TrialRow.study_id)
            .where(StudyRow.workload_kind == workload_kind)
        )
        if states is not None:
            query = query.where(TrialRow.state.in_(_state_values(states)))
        with self._session(write=False) as s:
            return int(s.scalar(query) or 0)

    # -- proxy models -----------------------------------------------------------------------

    def save_proxy_model(
        self,
        workload_kind: str,
        model: dict[str, Any],
        features: Sequence[str],
        metrics: dict[str, Any],
        n_train: int,
    ) -> ProxyModelVersion:
        """Store a new model version for ``workload_kind`` (one more than the latest)."""
        if not isinstance(workload_kind, str) or not workload_kind:
            raise InvalidInput("workload_kind must be a non-empty string")
        if not isinstance(n_train, int) or n_train < 0:
            raise InvalidInput(f"n_train must be an integer >= 0, got {n_train!r}")
        if isinstance(features, str) or not all(isinstance(f, str) for f in features):
            raise InvalidInput("features must be a list of feature names")
        model_json = _json_dict(model, "model")
        metrics_json = _json_dict(metrics, "metrics")
        now = _utcnow()
        with self._session(write=True) as s:
            if self._pg:
                s.execute(
                    text("SELECT pg_advisory_xact_lock(:ns, :key)"),
                    {
                        "ns": self._pg_lock_ns(s, _PG_PROXY_LOCK_NS),
                        "key": _int32(zlib.crc32(workload_kind.encode())),
                    },
                )
            last = s.scalar(
                select(func.max(ProxyModelRow.version)).where(
                    ProxyModelRow.workload_kind == workload_kind
                )
            )
            row = ProxyModelRow(
                workload_kind=workload_kind,
                version=(last or 0) + 1,
                created_at=now,
                n_train=n_train,
                metrics=metrics_json,
                model=model_json,
                features=list(features),
            )
            s.add(row)
            s.flush()
            return _proxy(row)

    def latest_proxy_model(self, workload_kind: str) -> ProxyModelVersion | None:
        query = (
            select(ProxyModelRow)
            .where(ProxyModelRow.workload_kind == workload_kind)
            .order_by(ProxyModelRow.version.desc())
            .limit(1)
        )
        with self._session(write=False) as s:
            row = s.scalar(query)
            return None if row is None else _proxy(row)

    def latest_proxy_version(self, workload_kind: str) -> int | None:
        """The newest version number of ``workload_kind``'s proxy model, without its payload
        (a model is megabytes of JSON; a reader that caches by version asks only this)."""
        query = select(func.max(ProxyModelRow.version)).where(
            ProxyModelRow.workload_kind == workload_kind
        )
        with self._session(write=False) as s:
            version = s.scalar(query)
            return None if version is None else int(version)

    def get_proxy_model(self, workload_kind: str, version: int) -> ProxyModelVersion:
        query = select(ProxyModelRow).where(
            ProxyModelRow.workload_kind == workload_kind, ProxyModelRow.version == version
        )
        with self._session(write=False) as s:
            row = s.scalar(query)
            if row is None:
                raise NotFound(f"proxy model {workload_kind!r} version {version} not found")
            return _proxy(row)

    def list_proxy_models(self, workload_kind: str) -> list[ProxyModelVersion]:
        """Every version for a workload kind, oldest first."""
        query = (
            select(ProxyModelRow)
            .where(ProxyModelRow.workload_kind == workload_kind)
            .order_by(ProxyModelRow.version)
        )
        with self._session(write=False) as s:
            return [_proxy(r) for r in s.scalars(query)]

    # -- proposal serialisation -------------------------------------------------------------

    @contextmanager
    def study_lock(self, study_id: int) -> Iterator[None]:
        """Hold the study's proposal lock, so one process at a time generates its trials.

        PostgreSQL: a session-level advisory lock on a dedicated connection, shared by every
        process using the database's schema (released by the server if the process dies).
        SQLite: a lock of this process's threads, then a record lock on a file beside the
        database that other processes (the service's background process) share. Not
        re-entrant.
        """
        with self.try_study_lock(study_id, wait=True) as held:
            assert held
            yield

    @contextmanager
    def try_study_lock(self, study_id: int, *, wait: bool = False) -> Iterator[bool]:
        """The study's proposal lock (see :meth:`study_lock`) if it is free now; yields
        whether it is held. A background proposer skips a study another process fills."""
        self.study_counts(study_id)  # NotFound for a missing study
        with self._try_lock(_PG_STUDY_LOCK_NS, study_id, wait=wait) as held:
            yield held

    def claims(self) -> StudyClaims:
        """This process's claims on studies as their proposer (see :class:`StudyClaims`)."""
        return StudyClaims(self)

    @contextmanager
    def try_proxy_fit_lock(self, workload_kind: str) -> Iterator[bool]:
        """A workload kind's lock for fitting its shared proxy model, if free now (yields
        whether it is held): of several processes that find a refit due, one fits."""
        key = _int32(zlib.crc32(workload_kind.encode()))
        with self._try_lock(_PG_PROXY_FIT_LOCK_NS, key, wait=False) as held:
            yield held

    @contextmanager
    def _try_lock(self, ns: int, key: int, *, wait: bool) -> Iterator[bool]:
        """A lock every process on this database shares: PostgreSQL's session-level advisory
        lock ``(ns, key)`` (``ns`` made the schema's) on a dedicated connection, released by
        the server if the process dies; for a SQLite file, one byte of a lock file beside it
        (``fcntl``), taken after a lock of this process's threads (POSIX record locks are per
        process)."""
        if not self._pg:
            lock = _local_lock(self._engine, ns, key)
            if not lock.acquire(blocking=wait):
                yield False
                return
            try:
                with _file_lock(self._engine, ns, key, wait=wait) as held:
                    yield held
            finally:
                lock.release()
            return
        try:
            conn = self._engine.connect()
        except SQLAlchemyError as exc:
            raise StorageError(_describe(exc)) from exc
        try:
            try:
                args = {"ns": self._pg_lock_ns(conn, ns), "key": key}
                if wait:
                    conn.execute(text("SELECT pg_advisory_lock(:ns, :key)"), args)
                    held = True
                else:
                    held = bool(
                        conn.execute(text("SELECT pg_try_advisory_lock(:ns, :key)"), args).scalar()
                    )
                conn.commit()
            except SQLAlchemyError as exc:
                raise StorageError(_describe(exc)) from exc
            if not held:
                yield False
                return
            try:
                yield True
            finally:
                try:
                    conn.execute(text("SELECT pg_advisory_unlock(:ns, :key)"), args)
                    conn.commit()
                except SQLAlchemyError:
                    # Closing the server session releases its advisory locks.
                    conn.invalidate()
        finally:
            conn.close()

    def _pg_lock_ns(self, conn: Connection | Session, ns: int) -> int:
        """``ns`` of this store's schema: advisory locks are per database, not per schema,
        and a deployment (or a test run) in another schema of it must not share them."""
        if self._pg_schema is None:
            self._pg_schema = str(conn.execute(text("SELECT current_schema()")).scalar() or "")
        return _int32(zlib.crc32(f"{self._pg_schema}/{ns:x}".encode()))


class StudyClaims:
    """Which studies one process proposes for, across its rounds.

    Of several processes that propose in the background (one per API process), the one
    whose round runs a study's strategy keeps its caches warm: its fitted model, its
    in-memory history. If whichever process woke first proposed, each would keep and refit
    a copy of every study's model. So a process claims a study and proposes for it until
    the study stops running or the process ends; the others leave it alone.

    PostgreSQL: session-level advisory locks, all on one connection this object holds, so
    that a process that dies (or loses its connection) frees its claims at once. SQLite:
    every claim is granted (the processes sharing a SQLite file are one API process and its
    background process, which alone proposes). Used by one thread.

    A study another process holds is tried again only after :attr:`retry_s`: every report
    and short lease wakes its API process's proposer, and a try at each wake kept each
    process that does not propose for it busy a third of the time.
    """

    retry_s = 1.0
    """How long a study another process proposes for is left alone before the next try (the
    longest a study waits for a new proposer after its own went away)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._conn: Connection | None = None
        self._ns: int | None = None
        self.held: set[int] = set()
        self._elsewhere: dict[int, float] = {}  # study -> when another process held it

    def claim(self, study_id: int) -> bool:
        """Whether this process proposes for the study: it already does, or it takes it now
        (no other process does)."""
        if study_id in self.held:
            return True
        if not self._store._pg:
            self.held.add(study_id)
            return True
        tried = self._elsewhere.get(study_id)
        if tried is not None and time.monotonic() - tried < self.retry_s:
            return False
        got = self._run("SELECT pg_try_advisory_lock(:ns, :key)", study_id)
        if got:
            self.held.add(study_id)
            self._elsewhere.pop(study_id, None)
        else:
            self._elsewhere[study_id] = time.monotonic()
        return bool(got)

    def keep_only(self, study_ids: Container[int]) -> None:
        """Give up the claims on studies not in ``study_ids`` (those no longer running)."""
        for sid in [s for s in self._elsewhere if s not in study_ids]:
            del self._elsewhere[sid]
        for sid in [s for s in self.held if s not in study_ids]:
            self.held.discard(sid)
            if self._store._pg:
                self._run("SELECT pg_advisory_unlock(:ns, :key)", sid)

    def close(self) -> None:
        """Give up every claim."""
        self.held.clear()
        if self._conn is not None:
            with suppress(SQLAlchemyError):
                # Closed for real, not handed back to the pool: its server session (and the
                # locks the session holds) ends with it.
                self._conn.invalidate()
                self._conn.close()
            self._conn = None

    def _run(self, sql: str, key: int) -> Any:
        try:
            if self._conn is None:  # each statement commits on its own: no idle transaction
                self._conn = self._store._autocommit.connect()
                self._ns = self._store._pg_lock_ns(self._conn, _PG_PROPOSER_NS)
            out = self._conn.execute(text(sql), {"ns": self._ns, "key": key}).scalar()
            self._conn.commit()
            return out
        except SQLAlchemyError as exc:
            # The session is gone and its locks with it: claim again from nothing.
            if self._conn is not None:
                with suppress(SQLAlchemyError):
                    self._conn.invalidate()
                self._conn = None
            self.held.clear()
            raise StorageError(_describe(exc)) from exc


# -- helpers ---------------------------------------------------------------------------------


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _check_now(now: datetime | None) -> datetime:
    if now is None:
        return _utcnow()
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise InvalidInput("now must be a timezone-aware datetime")
    return now.astimezone(UTC)


def _lease_delta(lease_seconds: float) -> timedelta:
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float):
        raise InvalidInput("lease_seconds must be a number")
    if not 0 < lease_seconds < 10 * 365 * 86400:
        raise InvalidInput(f"lease_seconds must be positive, got {lease_seconds!r}")
    return timedelta(seconds=lease_seconds)


def _json_dict(value: Any, what: str) -> dict[str, Any]:
    """A private, JSON-normalised copy of ``value`` (what the database will give back).

    NaN and infinity are refused: PostgreSQL's JSON rejects them and SQLite would store
    text no JSON parser accepts, so both backends refuse the same inputs.
    """
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a dict, got {type(value).__name__}")
    try:
        result = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    if not isinstance(result, dict):  # pragma: no cover - dicts stay dicts
        raise InvalidInput(f"{what} must be a dict")
    return result


def _check_page(limit: int | None, offset: int) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise InvalidInput(f"limit must be an integer >= 0, got {limit!r}")
    if not isinstance(offset, int) or offset < 0:
        raise InvalidInput(f"offset must be an integer >= 0, got {offset!r}")


def _check_source(source: str) -> None:
    if source not in TRIAL_SOURCES:
        raise InvalidInput(f"source must be one of {_names(TRIAL_SOURCES)}, got {source!r}")


def _per_record(values: Sequence[Any] | None, n: int, what: str) -> list[Any]:
    """One entry per record: ``values`` as a list, or n Nones when not given."""
    if values is None:
        return [None] * n
    if isinstance(values, str | bytes) or len(values) != n:
        raise InvalidInput(f"{what} needs one entry per record ({n})", field=what)
    return list(values)


def _names(values: Iterable[str]) -> str:
    return ", ".join(sorted(str(v) for v in values))


def _trial_state(state: TrialState | str) -> TrialState:
    try:
        return TrialState(state)
    except ValueError:
        raise InvalidInput(
            f"unknown trial state {state!r}; expected one of {_names(TrialState)}"
        ) from None


def _study_state(state: StudyState | str) -> StudyState:
    try:
        return StudyState(state)
    except ValueError:
        raise InvalidInput(
            f"unknown study state {state!r}; expected one of {_names(StudyState)}"
        ) from None


def _state_values(states: Iterable[TrialState | str]) -> list[str]:
    if isinstance(states, str):
        states = [states]
    return [_trial_state(s).value for s in states]


def _filter_studies(query: Any, state: StudyState | str | None, workload_kind: str | None) -> Any:
    if state is not None:
        query = query.where(StudyRow.state == _study_state(state).value)
    if workload_kind is not None:
        query = query.where(StudyRow.workload_kind == workload_kind)
    return query


def _get_study(s: Session, study_id: int, *, lock: bool = False) -> StudyRow:
    query = select(StudyRow).where(StudyRow.id == study_id)
    if lock:
        # FOR NO KEY UPDATE on PostgreSQL: serialises writers of the study (trial numbering)
        # without blocking the foreign-key checks of concurrent trial inserts.
        query = query.with_for_update(key_share=True)
    row = s.scalar(query)
    if row is None:
        raise NotFound(f"study {study_id} not found")
    return row


def _get_trial(s: Session, trial_id: int, *, lock: bool = False) -> TrialRow:
    query = select(TrialRow).where(TrialRow.id == trial_id)
    if lock:
        query = query.with_for_update()
    row = s.scalar(query)
    if row is None:
        raise NotFound(f"trial {trial_id} not found")
    return row


def _same_token(stored: str | None, given: str | None) -> bool:
    if stored is None or not isinstance(given, str):
        return False
    return hmac.compare_digest(stored.encode(), given.encode())


def _check_lease(row: TrialRow, lease_token: str) -> None:
    if row.state != TrialState.RUNNING.value:
        raise LeaseLost(f"trial {row.id} is {row.state}, not running: the lease is gone")
    if not _same_token(row.lease_token, lease_token):
        raise LeaseLost(f"trial {row.id} is leased under another token")


def _event(
    s: Session,
    row: TrialRow,
    from_state: TrialState | str | None,
    to_state: TrialState | str,
    at: datetime,
    worker_id: str | None,
    detail: dict[str, Any],
) -> None:
    s.add(
        TrialEventRow(
            trial_id=row.id,
            study_id=row.study_id,
            from_state=None if from_state is None else str(from_state),
            to_state=str(to_state),
            at=at,
            worker_id=worker_id,
            detail=detail,
        )
    )


_COUNTS = (StudyRow.state, StudyRow.n_proposed, StudyRow.n_waiting, StudyRow.n_running)


def _counts_of(row: Any) -> StudyCounts:
    return StudyCounts(StudyState(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4])


@contextmanager
def _storage_errors() -> Iterator[None]:
    """A database error as :class:`StorageError` (the service's 503); cubic's own pass."""
    try:
        yield
    except CubicError:
        raise
    except SQLAlchemyError as exc:
        raise StorageError(_describe(exc)) from exc


def _study_part(row: Any) -> tuple[Any, ...]:
    """The study's counts in a row of :mod:`cubic.store.one_statement`."""
    return tuple(getattr(row, name) for name in one_statement.STUDY_COUNTS)


def _study_counts(s: Session, study_id: int) -> StudyCounts:
    row = s.execute(select(*_COUNTS, StudyRow.gpu_hours).where(StudyRow.id == study_id)).first()
    if row is None:
        raise NotFound(f"study {study_id} not found")
    return _counts_of(row)


def _keep(cache: dict[Any, Any], key: Any, value: Any, cap: int) -> None:
    """Remember ``key`` in a per-process cache of at most ``cap`` entries (emptied when
    full: what it holds is cheap to read again)."""
    if len(cache) >= cap:
        cache.clear()
    cache[key] = value


def _count(
    s: Session,
    study_id: int,
    *,
    proposed: int = 0,
    waiting: int = 0,
    running: int = 0,
    gpu_hours: float = 0.0,
) -> StudyCounts | None:
    """Move the study's counts in the transaction that changes its trials; returns them
    as they now are (None when nothing moved)."""
    c = StudyRow
    values: dict[str, Any] = {}
    for name, delta in (("n_proposed", proposed), ("n_waiting", waiting), ("n_running", running)):
        if delta:
            values[name] = getattr(c, name) + delta
    if gpu_hours:
        values["gpu_hours"] = c.gpu_hours + gpu_hours
    if not values:
        return None
    row = s.execute(
        update(c).where(c.id == study_id).values(**values).returning(*_COUNTS, c.gpu_hours),
        execution_options={"synchronize_session": False},
    ).first()
    return None if row is None else _counts_of(row)


def _gpu_hours(metrics: dict[str, Any] | None) -> float:
    """The GPU-hours a report says it used (0 when it says nothing usable)."""
    return max(0.0, number((metrics or {}).get("gpu_hours")) or 0.0)


def _int32(value: int) -> int:
    """Map an unsigned 32-bit hash to PostgreSQL's signed int4 range."""
    return value - (1 << 32) if value >= 1 << 31 else value


def _sqlite_file(engine: Engine) -> str | None:
    """The absolute path of a file-backed SQLite database, else None (in memory)."""
    database = engine.url.database or ""
    if engine.url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):  # a URI filename: the path before any query
        database = database[5:].split("?", 1)[0]
    return os.path.abspath(database)


def _local_lock(engine: Engine, ns: int, key: int) -> threading.Lock:
    database = _sqlite_file(engine) or f"{engine.url.get_backend_name()}:{engine.url.database}"
    with _local_locks_guard:
        return _local_locks.setdefault((database, ns, key), threading.Lock())


@contextmanager
def _file_lock(engine: Engine, ns: int, key: int, *, wait: bool) -> Iterator[bool]:
    """One byte, at an offset given by ``(ns, key)``, of ``<database>.locks``: held by one
    process at a time (the kernel frees it if the process dies). An in-memory database has
    one process: nothing to take."""
    path = _sqlite_file(engine)
    if path is None:
        yield True
        return
    import fcntl

    offset = ((ns & 0xF) << 40) | (key & 0xFFFFFFFFFF)
    flags = fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)
    f = _lock_file(path + ".locks")
    try:
        fcntl.lockf(f, flags, 1, offset)
    except BlockingIOError:
        yield False
        return
    except OSError as exc:
        raise StorageError(f"cannot lock {path}.locks: {exc}") from exc
    try:
        yield True
    finally:
        fcntl.lockf(f, fcntl.LOCK_UN, 1, offset)


def _lock_file(path: str) -> Any:
    """The process's one open handle on a lock file, kept open: closing any handle on a
    file drops every POSIX record lock the process holds on it."""
    with _local_locks_guard:
        f = _lock_files.get(path)
        if f is None:
            try:
                f = _lock_files[path] = open(path, "a+b")  # noqa: SIM115
            except OSError as exc:
                raise StorageError(f"cannot open the lock file {path}: {exc}") from exc
        return f


def _describe(exc: SQLAlchemyError) -> str:
    """A short message: the driver's error, without the SQL and its (possibly large) params."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        message = f"{type(exc.orig).__name__}: {exc.orig}"
    else:
        message = f"{type(exc).__name__}: {exc}"
    return "database error: " + message.strip()[:500]


def _study(row: StudyRow) -> Study:
    return Study(
        id=row.id,
        name=row.name,
        spec=copy.deepcopy(row.spec),
        workload_kind=row.workload_kind,
        state=StudyState(row.state),
        max_attempts=row.max_attempts,
        created_at=row.created_at,
        updated_at=row.updated_at,
        owner_token_id=row.owner_token_id,
    )


def _token(row: ApiTokenRow) -> ApiToken:
    return ApiToken(
        id=row.id,
        name=row.name,
        role=Role(row.role),
        study_id=row.study_id,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )


def token_digest(secret: str) -> str:
    """SHA-256 of a token's secret: what the database keeps. The secrets are 256 random
    bits, so a slow password hash would add latency to every request and no safety."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _trial(row: TrialRow, *, fresh: bool = False) -> Trial:
    """A trial's plain object. ``fresh``: the row was just loaded by a read-only session that
    ends before the object is used, so its JSON values are already the object's own and the
    copies (half the cost of reading 10,000 trials) are skipped."""
    dup = _same if fresh else copy.deepcopy
    return Trial(
        id=row.id,
        study_id=row.study_id,
        number=row.number,
        params=dup(row.params),
        state=TrialState(row.state),
        source=row.source,
        metrics=dup(row.metrics),
        predicted=dup(row.predicted),
        worker_id=row.worker_id,
        lease_token=row.lease_token,
        lease_deadline=row.lease_deadline,
        attempt=row.attempt,
        retry_of=row.retry_of,
        error=row.error,
        log_tail=row.log_tail,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _same(value: Any) -> Any:
    return value


def _trial_event(row: TrialEventRow) -> TrialEvent:
    return TrialEvent(
        id=row.id,
        trial_id=row.trial_id,
        from_state=None if row.from_state is None else TrialState(row.from_state),
        to_state=TrialState(row.to_state),
        at=row.at,
        worker_id=row.worker_id,
        detail=copy.deepcopy(row.detail),
    )


def _proxy(row: ProxyModelRow) -> ProxyModelVersion:
    # The model payload can be megabytes; it is already private (freshly loaded or a
    # normalised copy made by save_proxy_model), so it is not copied again.
    return ProxyModelVersion(
        id=row.id,
        workload_kind=row.workload_kind,
        version=row.version,
        created_at=row.created_at,
        n_train=row.n_train,
        metrics=copy.deepcopy(row.metrics),
        model=row.model,
        features=list(row.features),
    )

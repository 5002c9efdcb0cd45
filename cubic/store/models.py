"""ORM tables of the store.

Private to :mod:`cubic.store`: the repository turns rows into the snapshots of
:mod:`cubic.store.objects` before they leave a session. The hand-written migration in
``migrations/versions`` must create exactly these tables (a test compares them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from cubic.store.objects import StudyState, TrialState

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Deterministic constraint names, identical on every backend, so migrations can name them."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    SQLite has no time zones: values are stored as naive UTC text, which also keeps
    lexicographic comparison (``lease_deadline < now``) correct. PostgreSQL stores
    ``timestamptz``; values read back are converted to UTC either way.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _in(column: str, values: Any) -> str:
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


TRIAL_STATE_CHECK = _in("state", TrialState)
STUDY_STATE_CHECK = _in("state", StudyState)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StudyRow(Base):
    __tablename__ = "cubic_study"
    __table_args__ = (CheckConstraint(STUDY_STATE_CHECK, name="state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    workload_kind: Mapped[str] = mapped_column(String(128), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    max_attempts: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # The token that created the study (a submitter manages its own); no foreign key, so
    # that a study outlives its token.
    owner_token_id: Mapped[int | None] = mapped_column(Integer)
    # Counts kept in the same transaction as each trial's state change, so that a lease or
    # a report reads one row instead of the study's whole history: trials proposed (first
    # attempts, imports excluded), waiting and running now, and GPU-hours reported.
    n_proposed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    n_waiting: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    n_running: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class TrialRow(Base):
    __tablename__ = "cubic_trial"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        Index("ix_cubic_trial_study_id_state", "study_id", "state"),
        CheckConstraint(TRIAL_STATE_CHECK, name="state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("cubic_study.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(32))
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    predicted: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    worker_id: Mapped[str | None] = mapped_column(String(255))
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    retry_of: Mapped[int | None] = mapped_column(
        ForeignKey("cubic_trial.id", ondelete="SET NULL"), index=True
    )
    error: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class TrialEventRow(Base):
    __tablename__ = "cubic_trial_event"
    # A strategy reads what changed in its study since the last event it saw.
    __table_args__ = (Index("ix_cubic_trial_event_study_id_id", "study_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("cubic_trial.id", ondelete="CASCADE"), index=True
    )
    study_id: Mapped[int | None] = mapped_column(Integer)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    worker_id: Mapped[str | None] = mapped_column(String(255))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON)


class ProxyModelRow(Base):
    __tablename__ = "cubic_proxy_model"
    __table_args__ = (UniqueConstraint("workload_kind", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_kind: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    n_train: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    model: Mapped[dict[str, Any]] = mapped_column(JSON)
    features: Mapped[list[str]] = mapped_column(JSON)


ROLE_CHECK = "role IN ('admin', 'submitter', 'worker', 'reader')"


class ApiTokenRow(Base):
    """An API token: only the SHA-256 digest of its secret is kept."""

    __tablename__ = "cubic_api_token"
    __table_args__ = (CheckConstraint(ROLE_CHECK, name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    study_id: Mapped[int | None] = mapped_column(Integer)  # a token for one study only
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WorkerIdentityRow(Base):
    """Which token a worker id belongs to: the first one that leased with it."""

    __tablename__ = "cubic_worker_identity"

    worker_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    token_id: Mapped[int] = mapped_column(
        ForeignKey("cubic_api_token.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

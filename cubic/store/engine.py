"""Engine construction for the supported backends (SQLite files and PostgreSQL).

Engines are made by the caller that owns them (the service's lifespan, a CLI command, a
test), never at import time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.pool import StaticPool

DEFAULT_URL = "sqlite:///cubic.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PING_IDLE_S = 5.0
"""A pooled server connection unused this long is checked (one round trip) before use."""
WRITE_OPTION = "cubic_write"
"""Execution option marking a transaction that will write.

On SQLite such a transaction starts with ``BEGIN IMMEDIATE``: it takes the single writer lock
up front, so its reads cannot go stale before its writes (read-modify-write is atomic), and a
concurrent writer waits for the busy timeout instead of failing on a stale snapshot.
"""


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``; bare ``postgresql://`` and ``postgres://`` URLs get the psycopg 3 driver."""
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` (default :data:`DEFAULT_URL`).

    SQLite connections get WAL mode (readers do not block the writer), a 30 s busy timeout
    (writers queue instead of failing) and foreign keys; transactions are begun by SQLAlchemy
    so that they really are transactions (see :data:`WRITE_OPTION`). Extra ``kwargs`` go to
    :func:`sqlalchemy.create_engine`.
    """
    parsed = normalize_url(url or DEFAULT_URL)
    if parsed.get_backend_name() != "sqlite":
        engine = create_engine(parsed, **kwargs)
        if "pool_pre_ping" not in kwargs:
            _ping_when_idle(engine, PING_IDLE_S)
        return engine

    memory = parsed.database in (None, "", ":memory:")
    if memory:
        # One shared connection, or every connection would see its own empty database.
        kwargs.setdefault("poolclass", StaticPool)
        kwargs.setdefault("connect_args", {"check_same_thread": False})
    else:
        kwargs.setdefault("pool_pre_ping", True)
    engine = create_engine(parsed, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Stop the sqlite3 module from issuing its own BEGINs; _on_begin does it instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys = ON")
            if not memory:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def is_postgresql(engine: Engine) -> bool:
    """Whether row locks (``FOR UPDATE SKIP LOCKED``) and advisory locks are available."""
    return engine.dialect.name == "postgresql"


@contextmanager
def temporary_schema(base_url: str, prefix: str = "cubic_tmp") -> Iterator[str]:
    """A PostgreSQL URL whose connections use a fresh schema, dropped afterwards.

    Tests and benchmarks share one server without seeing each other's rows.
    """
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = make_engine(base_url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = normalize_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Check a pooled connection before use only if it sat unused ``idle_s`` or more.

    SQLAlchemy's ``pool_pre_ping`` checks every checkout: one more round trip to the
    server for each call, which on a busy service was a sixth of a lease's time. A
    connection in steady use needs no check: were the server restarted under it, its next
    statement fails, SQLAlchemy then discards every connection of the pool made before,
    and the caller's retry (workers retry) gets a fresh one. A connection that sat idle
    (through a restart, a failover, a firewall's timeout) is checked first, and replaced
    if dead, so that a quiet service's first call after an outage does not fail.
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["cubic_checked_in"] = monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("cubic_checked_in")
        if since is None or monotonic() - since < idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the pool then connects afresh (up to three times)
            raise DisconnectionError(f"a pooled connection is gone: {exc}") from exc

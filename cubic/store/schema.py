"""Schema migrations as an explicit step (``cubic db upgrade``), never on import.

The Alembic scripts live inside the package (``cubic/store/migrations``) and keep their
revision in their own table, :data:`VERSION_TABLE`, so cubic can share a database with an
application that has its own Alembic history.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from cubic.errors import SchemaOutOfDate, StorageError
from cubic.store.engine import WRITE_OPTION, is_postgresql, make_engine

VERSION_TABLE = "cubic_alembic_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_PG_MIGRATION_LOCK = (0x63756269, 0)
"""Advisory lock key held while migrating, so two concurrent upgrades run one after the other."""


def alembic_config() -> Config:
    """An Alembic config for cubic's scripts; no ``alembic.ini`` is needed."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    return cfg


def head_revision() -> str:
    """The revision this version of cubic needs."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        raise RuntimeError("cubic ships no migrations")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None for a database cubic never migrated."""
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    except SQLAlchemyError as exc:
        raise StorageError(f"cannot read the schema revision: {exc}") from exc


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaOutOfDate` unless the database is at :func:`head_revision`."""
    current = current_revision(engine)
    head = head_revision()
    if current != head:
        at = current or "base (no cubic tables)"
        raise SchemaOutOfDate(
            f"database schema is at {at}, cubic needs {head}: run `cubic db upgrade`"
        )


def _migrate(url_or_engine: str | URL | Engine | None, fn: str, revision: str) -> None:
    engine = url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine)
    owned = engine is not url_or_engine
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(**{WRITE_OPTION: True})
            sqlite = engine.dialect.name == "sqlite"
            if sqlite:
                # SQLite alters a table by copying it and dropping the old one: with foreign
                # keys on, that drop would cascade to every trial of every study.
                conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = OFF")
            with conn.begin():
                if is_postgresql(engine):
                    conn.execute(
                        text("SELECT pg_advisory_xact_lock(:a, :b)"),
                        dict(a=_PG_MIGRATION_LOCK[0], b=_PG_MIGRATION_LOCK[1]),
                    )
                cfg = alembic_config()
                cfg.attributes["connection"] = conn
                getattr(command, fn)(cfg, revision)
            if sqlite:
                conn.connection.dbapi_connection.execute("PRAGMA foreign_keys = ON")
    except SQLAlchemyError as exc:
        raise StorageError(f"migration failed: {exc}") from exc
    finally:
        if owned:
            engine.dispose()


def upgrade(url_or_engine: str | URL | Engine | None, revision: str = "head") -> None:
    """Migrate the database up to ``revision`` (default: the head cubic needs).

    ``None`` means :data:`cubic.store.engine.DEFAULT_URL`. Safe to run repeatedly, and on
    PostgreSQL from several processes at once.
    """
    _migrate(url_or_engine, "upgrade", revision)


def downgrade(url_or_engine: str | URL | Engine | None, revision: str) -> None:
    """Migrate the database down to ``revision`` (``"base"`` drops every cubic table)."""
    _migrate(url_or_engine, "downgrade", revision)

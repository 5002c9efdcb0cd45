"""Alembic environment for cubic's own tables.

Invoked through :mod:`cubic.store.schema`, which passes an open connection in
``config.attributes["connection"]``; with no connection it connects to
``sqlalchemy.url`` itself, and in offline mode it renders SQL for that URL.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from cubic.store.engine import make_engine
from cubic.store.models import Base
from cubic.store.schema import VERSION_TABLE

config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()

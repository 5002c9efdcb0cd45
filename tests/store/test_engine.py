"""Pooled PostgreSQL connections: checked before use only after sitting idle."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import text

from cubic.store import engine as engine_module
from cubic.store.engine import make_engine, temporary_schema
from tests.requirements import need
from tests.store.backends import PG_ENV

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url() -> str:
    base = os.environ.get(PG_ENV)
    need("postgres", bool(base), f"{PG_ENV} not set: PostgreSQL engine tests skipped")
    assert base is not None
    return base


def test_a_connection_in_steady_use_is_not_pinged_and_an_idle_dead_one_is_replaced(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy service's calls cost no extra round trip; a connection that died while it
    sat idle in the pool (its backend terminated, as by a server restart) is replaced
    before use, so the call after a quiet outage succeeds."""
    clock = [1000.0]
    monkeypatch.setattr(engine_module, "monotonic", lambda: clock[0])
    with temporary_schema(pg_url, prefix="cubic_test") as url:
        engine = make_engine(url, pool_size=1, max_overflow=0)
        pings = []
        real_ping = engine.dialect.do_ping
        monkeypatch.setattr(
            engine.dialect, "do_ping", lambda conn: pings.append(1) or real_ping(conn)
        )
        try:
            with engine.connect() as conn:
                pid = conn.execute(text("select pg_backend_pid()")).scalar_one()
            for _ in range(5):
                clock[0] += 1.0  # in steady use: back in the pool for a second at most
                with engine.connect() as conn:
                    assert conn.execute(text("select pg_backend_pid()")).scalar_one() == pid
            assert pings == []
            with make_engine(url).connect() as other:
                other.execute(text("select pg_terminate_backend(:p)"), {"p": pid})
            clock[0] += engine_module.PING_IDLE_S + 1
            with engine.connect() as conn:  # pinged, found dead, replaced: no error
                assert conn.execute(text("select pg_backend_pid()")).scalar_one() != pid
            assert len(pings) == 1
        finally:
            engine.dispose()

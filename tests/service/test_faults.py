"""Faults of a bad day in a data centre, against a real API process and real worker processes.

Each test runs a study with ``cubic worker`` processes (the simulated runner, jobs of about
a second), breaks something mid-study, and then checks, in SQL, what users rely on: the
budget met exactly, no trial leased twice, every report the service accepted stored, every
state change in order, and no worker exited before the study was done.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import bindparam, text

from cubic.bench.pgcluster import PgCluster, can_run_postgres
from cubic.client import CubicClient
from cubic.store.engine import make_engine
from cubic.store.schema import upgrade
from tests.requirements import need
from tests.service.conftest import spec
from tests.service.faults import Workers, api_process, invariants, running_by
from tests.service.faults import wait_for as wait_until

BUDGET = 40

# Each starts 8 to 16 worker processes and, on PostgreSQL, tens of connections to the shared
# server: one at a time, with the other tests of the group, as without xdist.
pytestmark = pytest.mark.xdist_group("many-processes")


def _finished(db_url: str, study_id: int) -> int:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM cubic_trial WHERE study_id = :s AND state IN "
                        "('complete', 'infeasible', 'failed', 'pruned')"
                    ),
                    {"s": study_id},
                ).scalar_one()
            )
    except Exception:  # the database is down (the outage under test): not finished yet
        return -1
    finally:
        engine.dispose()


def _study(url: str, parallel: int) -> int:
    body = spec(name="faults", budget={"max_trials": BUDGET, "max_parallel": parallel})
    # Creating surveys the space and proposes the first batch while the API process's
    # background process starts beside it: on a loaded machine that may exceed 30 s.
    with CubicClient(url, timeout=300) as client:
        return int(client.create_study(body)["id"])


def _logs(workers: Workers) -> str:
    return "\n".join(f"--- worker {i}\n{workers.log(i)[-1500:]}" for i in range(len(workers.procs)))


def _mid_study(db_url: str, study_id: int, at_least: int) -> int:
    wait_until(
        f"{at_least} finished trials",
        lambda: _finished(db_url, study_id) >= at_least,
        timeout=300,
        every=0.3,
    )
    done = _finished(db_url, study_id)
    assert done < BUDGET, "the study ended before the fault: nothing was tested"
    return done


def test_api_killed_mid_study_16_workers_ride_through(db_url: str, tmp_path: Path) -> None:
    """SIGKILL of the API with 16 workers busy, started again 10 s later on the same port."""
    upgrade(db_url)
    with api_process(db_url, tmp_path / "api.log") as api:
        sid = _study(api.url, 16)
        workers = Workers(api.url, sid, 16, tmp_path, job_s=1.0, lease_s=120)
        try:
            _mid_study(db_url, sid, 16)
            api.kill()
            time.sleep(10)
            api.start()
            codes = workers.wait(timeout=600)
        finally:
            workers.close()
    logs = _logs(workers)
    assert codes == [0] * 16, logs
    assert "retrying" in logs  # the workers did meet the outage
    everyone = list(range(16))
    assert invariants(db_url, sid, BUDGET, workers.reported(everyone)) == [], logs


def test_half_the_workers_killed_mid_study(db_url: str, tmp_path: Path) -> None:
    """SIGKILL of 4 of 8 workers, each while it runs a trial: their leases expire, their
    trials are retried by the others, and what they reported before they died is kept."""
    upgrade(db_url)
    doomed = [f"w{i}" for i in range(4)]
    with api_process(db_url, tmp_path / "api.log") as api:
        sid = _study(api.url, 8)
        # The doomed workers' jobs take a minute, so each is killed holding a lease (a
        # worker between leases would leave nothing to reap).
        slow = dict.fromkeys(range(4), 60.0)
        workers = Workers(api.url, sid, 8, tmp_path, job_s=1.0, lease_s=5, slow=slow)
        try:
            _mid_study(db_url, sid, 8)
            wait_until(
                "each doomed worker to hold a trial",
                lambda: set(running_by(db_url, sid, doomed).values()) == set(doomed),
                timeout=300,
                every=0.3,
            )
            workers.kill(list(range(4)))
            orphans = running_by(db_url, sid, doomed)
            codes = workers.wait(timeout=600)
        finally:
            workers.close()
    logs = _logs(workers)
    assert codes[4:] == [0] * 4, logs
    assert len(orphans) == 4, orphans
    api_log = (tmp_path / "api.log").read_text()
    assert "reaped" in api_log, api_log[-3000:]  # the service says what it did
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            errors = conn.execute(
                text("SELECT id, error FROM cubic_trial WHERE id IN :ids").bindparams(
                    bindparam("ids", expanding=True)
                ),
                {"ids": list(orphans)},
            ).all()
    finally:
        engine.dispose()
    assert {r.id: r.error for r in errors} == dict.fromkeys(orphans, "lease expired")
    everyone = list(range(8))
    assert invariants(db_url, sid, BUDGET, workers.reported(everyone)) == [], logs


@pytest.mark.postgres
def test_postgres_outage_of_30_s_mid_study(tmp_path: Path) -> None:
    """The database (a PostgreSQL cluster of the test's own) stops for 30 s mid-study."""
    reason = can_run_postgres()
    need("postgres", reason is None, reason or "")
    pg = PgCluster()
    try:
        pg.start()
        upgrade(pg.url)
        with api_process(pg.url, tmp_path / "api.log") as api:
            sid = _study(api.url, 8)
            workers = Workers(api.url, sid, 8, tmp_path, job_s=1.0, lease_s=120)
            try:
                _mid_study(pg.url, sid, 8)
                pg.stop()
                time.sleep(30)
                pg.start()
                codes = workers.wait(timeout=600)
            finally:
                workers.close()
        logs = _logs(workers)
        assert codes == [0] * 8, logs
        assert "retrying" in logs
        assert invariants(pg.url, sid, BUDGET, workers.reported(list(range(8)))) == [], logs
    finally:
        pg.remove()

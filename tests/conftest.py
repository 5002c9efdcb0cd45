"""Fixtures shared by every test folder: a store over SQLite, and over PostgreSQL when set;
a real API server for the tests of workers and runners.

``make test`` runs two xdist workers (``--dist loadgroup``): tests that share something a
run has one of are kept to one worker (``xdist_group``), and a test marked ``alone`` runs
while the other worker runs nothing.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

pytest_plugins = ["tests.store.backends"]

# A test using one of these session fixtures runs on the worker that runs the others, so a
# run starts one of each, as without xdist.
FIXTURE_GROUPS = {
    # The cluster's node is this host, by name, and munged is one per host: a second
    # cluster would share it, and the first to finish would stop it under the other.
    "slurm_cluster": "slurm",
    # A head is a dozen processes and takes two cores' worth of CPUs for its jobs.
    "ray_head": "ray",
}


_UNGROUPED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)  # around xdist's, which reads the marks
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        group = next((g for f, g in FIXTURE_GROUPS.items() if f in fixtures), None)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    # xdist tells its scheduler a test's group by a suffix of the node id; where that does not
    # take, the groups would be spread over the workers without a word: such a test fails.
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[_UNGROUPED] = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_UNGROUPED, False):
        pytest.fail(
            f"--dist loadgroup does not keep this test to its group's worker with pytest "
            f"{pytest.__version__} (pytest-dev/pytest-xdist#1386)",
            pytrace=False,
        )


_LOCKS = pytest.StashKey[tuple[IO[bytes], IO[bytes]]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """An ``alone`` test (it times real jobs on this machine's cores) holds the run's lock
    file exclusively, from its first fixture to its last teardown; every other test holds it
    shared. A turnstile taken before it keeps new tests from starting while an ``alone`` one
    waits for the running ones to end."""
    if not hasattr(item.config, "workerinput"):  # not an xdist worker: nothing runs beside
        return (yield)
    if _LOCKS not in item.config.stash:
        run = Path(item.config.option.basetemp).parent  # the run's folder, above each worker's
        item.config.stash[_LOCKS] = (
            (run / "alone.turnstile").open("ab"),
            (run / "alone.lock").open("ab"),
        )
    turnstile, lock = item.config.stash[_LOCKS]
    alone = item.get_closest_marker("alone") is not None
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    if not alone:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        return (yield)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture(autouse=True, scope="session")
def _private_outbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers of the tests keep unreported outcomes under the test run's folder, never in
    the user's own outbox (:mod:`cubic.outbox`)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CUBIC_OUTBOX", str(tmp_path_factory.mktemp("outbox")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a real uvicorn serving cubic on a fresh SQLite file, one per module."""
    from cubic.bench.service import api_server
    from cubic.store.schema import upgrade

    db = f"sqlite:///{tmp_path_factory.mktemp('api') / 'cubic.db'}"
    upgrade(db)
    with api_server(db, 1) as base:
        yield base

"""The background process of production (``CUBIC_BACKGROUND=process``): it proposes and
fits while the API process only serves requests; it is restarted if it dies and stops by
itself if the API process goes away."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.background import _CTX, Signal, main
from tests.service.conftest import create, lease_answer, run_study, service_settings

WAIT_S = 120.0


@pytest.fixture
def process_client(migrated_url: str) -> Iterator[TestClient]:
    settings = service_settings(migrated_url, background="process", retrain_every=4)
    with TestClient(create_app(settings)) as c:
        yield c


def _wait(what: str, check: object) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_S:.0f} s"
        time.sleep(0.1)


def test_the_background_process_proposes_and_the_api_process_never_does(
    process_client: TestClient,
) -> None:
    app = process_client.app
    study = create(process_client, budget={"max_trials": 10, "max_parallel": 4})
    assert run_study(process_client, study) == 10
    got = process_client.get(f"/v1/studies/{study['id']}").json()
    assert got["state"] == "completed"
    # The request process proposed the first batch only, and kept no strategy.
    assert app.state.tuner._strategies == {}
    # The rest were proposed by the child, whose round timings reach this process's /metrics.
    background = app.state.background

    def proposal_counted() -> bool:
        text = process_client.get("/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("cubic_proposal_seconds_count"))
        return float(line.split()[-1]) >= 1

    _wait("a proposal timing in /metrics", proposal_counted)
    # ... and this process's leases: a short one says to wait about one of those rounds.
    _wait("the rounds timed for the lease hint", lambda: app.state.tuner.round_s is not None)
    assert app.state.tuner.retry_after() > 0
    assert background.process.is_alive()


def test_a_background_process_that_dies_is_started_again(process_client: TestClient) -> None:
    background = process_client.app.state.background
    first = background.process.pid
    os.kill(first, signal.SIGKILL)
    _wait("a new background process", lambda: background.restarts >= 1)
    _wait("the new one alive", lambda: background.process.is_alive())
    assert background.process.pid != first
    study = create(process_client)
    assert lease_answer(process_client, study["id"])["trials"]  # it proposes


def test_the_background_process_stops_when_its_api_process_is_gone(migrated_url: str) -> None:
    settings = service_settings(migrated_url, background="process").model_dump()
    wake, stop, timings = Signal(), Signal(), _CTX.Queue()
    # A parent pid that is not its parent: what it sees once the API process died.
    child = _CTX.Process(target=main, args=(settings, -1, wake, stop, timings), daemon=True)
    child.start()
    child.join(WAIT_S)
    try:
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()


@pytest.mark.parametrize("nice", [0, 7])
def test_the_background_processs_fits_run_at_a_lower_cpu_priority(
    migrated_url: str, nice: int
) -> None:
    """Fits take the cores the requests and the proposals leave: the background process's
    retrainer thread runs ``CUBIC_BACKGROUND_NICE`` below its API process (0: beside it),
    and the process's other threads, the proposer's among them, at the API process's."""
    settings = service_settings(migrated_url, background="process", background_nice=nice)
    with TestClient(create_app(settings)) as c:
        child = c.app.state.background.process
        base = _nice(os.getpid())
        assert base is not None

        def nices() -> list[int | None]:
            return [_nice(f"{child.pid}/task/{t.name}") for t in _tasks(child.pid)]

        want = sorted({base, base + nice})
        _wait(f"threads at nice {want}", lambda: sorted(set(nices()) - {None}) == want)
        if nice:
            assert nices().count(base + nice) == 1  # the retrainer's thread alone
        assert nices()[0] == base  # the main thread: the process itself is not lowered
        assert child.is_alive()


def _tasks(pid: int) -> list[Path]:
    """The threads of ``pid``, the main one first."""
    tasks = sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda p: int(p.name))
    return [t for t in tasks if t.name.isdigit()]


def _nice(pid: int | str) -> int | None:
    """A process's (or ``PID/task/TID``: a thread's) nice value (``/proc/.../stat``'s 19th
    field), None before it is set."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[16])


def test_a_stop_does_not_wait_out_a_model_fit(
    migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared-proxy fit in progress (a cache, refitted after a restart) does not hold up a
    shutdown, which would otherwise outlast a deployment's grace period on a busy machine."""
    import threading

    from cubic.proxy.training import Retrainer

    fitting, release = threading.Event(), threading.Event()

    def endless_fit(self: Retrainer, kind: str) -> None:
        fitting.set()
        release.wait(600)

    monkeypatch.setattr(Retrainer, "maybe_retrain", endless_fit)
    client = TestClient(create_app(service_settings(migrated_url)))
    client.__enter__()
    try:
        _wait("the fit to start", fitting.is_set)
        stopper = threading.Thread(target=client.__exit__, args=(None, None, None))
        stopper.start()
        # Generous, but less than the 60 s a proposal round in progress is given.
        stopper.join(30)
        assert not stopper.is_alive(), "the shutdown waited for the fit"
    finally:
        release.set()


def test_the_api_process_serves_once_its_background_process_proposes(
    process_client: TestClient,
) -> None:
    """Startup waits for the child's proposer: a lease before it would find nothing, and a
    study created before it would get its first batch only once the child runs."""
    background = process_client.app.state.background
    assert background.proposing and background.process.is_alive()
    study = create(process_client, budget={"max_trials": 4, "max_parallel": 4})
    assert run_study(process_client, study) == 4


def test_waiting_for_a_background_process_that_died_returns_at_once(tmp_path: Path) -> None:
    """A child that cannot start (here: a database without cubic's schema) ends the wait
    before its timeout: the API process serves, and its watcher restarts the child."""
    from service.background import BackgroundProcess

    bp = BackgroundProcess(service_settings(f"sqlite:///{tmp_path / 'empty.db'}"))
    bp.start()
    try:
        t0 = time.monotonic()
        assert bp.wait_ready(timeout_s=600.0) is False
        assert time.monotonic() - t0 < 600.0 and not bp.process.is_alive()
    finally:
        bp.stop()


def test_a_nudge_on_the_request_path_reaches_the_background_process(tmp_path: Path) -> None:
    """A report or a short lease sets a flag of the API process (no lock shared with the
    child); a thread passes it on to the child's event, and ends when the child stops."""
    import threading

    from service.background import BackgroundProcess

    bp = BackgroundProcess(service_settings(f"sqlite:///{tmp_path / 'c.db'}"))
    forwarder = threading.Thread(target=bp.forward_nudges, daemon=True)
    forwarder.start()
    for _ in range(3):
        assert not bp.wake.wait(0)  # not called: nothing taken
        bp.nudge.set()
        assert bp.wake.wait(30)
        bp.wake.clear()  # as the child does when it wakes
    bp.stopping.set()
    bp.nudge.set()
    forwarder.join(30)
    assert not forwarder.is_alive()

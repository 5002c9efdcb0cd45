"""The loops beside the requests (:mod:`service.loops`): how often the proposer looks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from cubic.store import Store
from cubic.store.schema import upgrade
from cubic.tuner import Tuner
from service.loops import IDLE_LOOK_S, propose_forever

WAIT_S = 120.0


def test_a_proposer_that_proposes_for_no_study_looks_at_most_every_idle_interval(
    tmp_path: Path,
) -> None:
    """Every report and short lease of an API process wakes its proposer; one that proposes
    for no study (another process does) answers a burst of wakes with a few looks."""
    url = f"sqlite:///{tmp_path / 'idle.db'}"
    upgrade(url)
    with Store(url) as store:
        tuner = Tuner(store, background_propose=True)
        looks = []
        to_fill = tuner.to_fill
        tuner.to_fill = lambda: looks.append(1) or to_fill()  # type: ignore[method-assign]
        stop = threading.Event()
        proposer = threading.Thread(target=propose_forever, args=(tuner, stop, 30.0))
        t0 = time.monotonic()
        proposer.start()
        for _ in range(200):
            tuner.wake.set()
            time.sleep(0.002)
        elapsed = time.monotonic() - t0
        stop.set()
        tuner.wake.set()
        proposer.join(WAIT_S)
        assert not proposer.is_alive()
    assert 1 <= len(looks) <= elapsed / IDLE_LOOK_S + 2

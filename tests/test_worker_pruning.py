"""Early stopping through the whole loop: a real API process, a worker, simulated jobs that
report their step times while they run.

A study of 16 configs of the shipped pruning example, a quarter of them slow (a sixth to a
quarter of the fastest one's throughput), is run twice with the same seeds: without pruning,
then with it. Pruning must stop exactly the slow ones early, find the same best trial, and
spend at least a fifth fewer GPU-hours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cubic.bench.service import api_server
from cubic.client import CubicClient
from cubic.runners.simulated import SimulatedRunner
from cubic.shipped import shipped
from cubic.sim import simulate
from cubic.sim.job import NoiseModel
from cubic.store import Store
from cubic.store.schema import upgrade
from cubic.study import load_spec, parse_spec
from cubic.tuner import Tuner
from cubic.worker import Worker

STUDY = shipped("llama3_8b_pruning.study.yaml")
# Step-time jitter and slow warm-up steps as the default noise model has them; no straggler
# nodes and no node failures, so that the slow quarter is exactly the slow configs.
NOISE = NoiseModel(straggler_prob=0.0, failure_prob=0.0)
STEPS = 40  # timed steps per job
# Wall seconds per simulated second: a fast step takes about 0.03 s, a slow one 4 to 6 times
# that, so that a slow job runs seconds past the step where it can first be judged.
CLOCK = 0.003
MIN_SAVED = 0.20


def _configs() -> tuple[dict[str, Any], list[dict[str, Any]], list[bool]]:
    """The study (pruning off) and 16 configs: 12 fast ones, then a slow one after every
    three fast ones, and which are slow."""
    spec, base = load_spec(STUDY)
    r = spec.resolve(base)
    rng = np.random.default_rng(0)
    configs = r.space.sample(rng, 3000, r.context)
    res = simulate(r.workload, configs)
    ok = np.asarray(res.feasible, dtype=bool)
    thr = np.where(ok, res.throughput, 0.0)
    order = np.argsort(-thr)
    top = float(thr[order[0]])
    fast = [int(i) for i in order if thr[i] >= 0.85 * top][:12]
    slow = [int(i) for i in order if top / 6 <= thr[i] <= top / 4][:4]
    assert len(fast) == 12 and len(slow) == 4
    picked, is_slow = [], []
    for k in range(4):
        for i in [*fast[3 * k : 3 * k + 3], slow[k]]:
            picked.append(configs[i])
            is_slow.append(i in slow)
    body = r.spec.model_copy(
        update={
            "baseline": None,
            "budget": spec.budget.model_copy(update={"max_trials": 16, "max_parallel": 1}),
        }
    ).model_dump(mode="json")
    body["pruning"]["enabled"] = False
    return body, picked, is_slow


def _run(tmp: Path, body: dict[str, Any], configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the study in a fresh service (trial ids, hence the noise seeds, from 1). It is
    created with its configs before the service starts, so that no strategy proposes."""
    db = f"sqlite:///{tmp / 'cubic.db'}"
    upgrade(db)
    with Store.create(db) as store:
        sid = Tuner(store).create_study(parse_spec(body)).id
        Tuner(store).enqueue(sid, configs)
    with api_server(db, 1) as url, CubicClient(url) as client:
        runner = SimulatedRunner(steps=STEPS, clock=CLOCK, seed=0, noise=NOISE)
        worker = Worker(
            CubicClient(url),
            sid,
            runner,
            worker_id="w",
            lease_seconds=60,
            poll_s=0.01,
            idle_s=0.1,
            progress_s=0.0,
            cancel_wait_s=30.0,
            outbox=tmp / "outbox",
        )
        assert worker.run(max_trials=len(configs)) == len(configs)
        assert client.get_study(sid)["state"] == "completed"
        return client.all_trials(sid)


def _hours(trials: list[dict[str, Any]]) -> float:
    return sum((t["metrics"] or {}).get("gpu_hours", 0.0) for t in trials)


@pytest.mark.slow
def test_pruning_stops_the_slow_quarter_and_saves_gpu_hours(tmp_path: Path) -> None:
    body, configs, is_slow = _configs()
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    off = _run(tmp_path / "off", body, configs)
    on = _run(tmp_path / "on", {**body, "pruning": {**body["pruning"], "enabled": True}}, configs)

    assert [t["state"] for t in off] == ["complete"] * 16
    assert [t["params"] for t in on] == [t["params"] for t in off]
    states = [t["state"] for t in on]
    assert states == ["pruned" if s else "complete" for s in is_slow], states
    for t, full in zip(on, off, strict=True):
        if t["state"] == "complete":  # the same job, the same noise: the same measurement
            assert t["metrics"] == full["metrics"]
            continue
        m = t["metrics"]
        # Stopped early: fewer steps than the whole job, and what they measured is kept.
        assert m["steps"] < full["metrics"]["steps"] + NOISE.warmup_steps
        assert m["timed_steps"] >= 5
        assert m["gpu_hours"] < full["metrics"]["gpu_hours"]
        assert m["tokens_per_s"] == pytest.approx(full["metrics"]["tokens_per_s"], rel=0.05)
        assert m["pruned_bound"] < m["pruned_limit"] == pytest.approx(0.8 * m["pruned_best"])
        assert t["error"].startswith("pruned (threshold)")

    best_off = max((t for t in off), key=lambda t: t["metrics"]["tokens_per_s"])
    best_on = max(
        (t for t in on if t["state"] == "complete"), key=lambda t: t["metrics"]["tokens_per_s"]
    )
    assert best_on["number"] == best_off["number"]
    assert best_on["metrics"]["tokens_per_s"] == best_off["metrics"]["tokens_per_s"]

    saved = 1.0 - _hours(on) / _hours(off)
    at = [t["metrics"]["steps"] for t in on if t["state"] == "pruned"]
    print(
        f"GPU-hours: {_hours(off):.2f} without pruning, {_hours(on):.2f} with: "
        f"{saved:.0%} saved at the same best ({best_on['metrics']['tokens_per_s']:,.0f} "
        f"tokens/s); the slow trials stopped after {at} of {STEPS + NOISE.warmup_steps} steps"
    )
    assert saved >= MIN_SAVED, (saved, _hours(off), _hours(on))

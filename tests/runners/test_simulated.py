"""The simulated runner's job clock: jobs hold their worker as long as real ones would."""

from __future__ import annotations

import numpy as np
import pytest

from cubic.bench.search import BENCH_DIR, load_study
from cubic.outcome import Outcome
from cubic.runners.simulated import SimulatedRunner
from cubic.sim import simulate
from cubic.sim.job import STARTUP_S, NoiseModel, job_duration, run_job

STUDY = load_study(BENCH_DIR / "llama3_8b_h100x16.study.yaml")
WORKLOAD = STUDY.workload
_CONFIGS = STUDY.space.sample(np.random.default_rng(0), 400, STUDY.context)
_SIM = simulate(WORKLOAD, _CONFIGS)
FITS = next(c for i, c in enumerate(_CONFIGS) if _SIM.row(i)["valid"] and _SIM.row(i)["fits"])
OOM = next(c for i, c in enumerate(_CONFIGS) if _SIM.row(i)["valid"] and not _SIM.row(i)["fits"])


def _outcome(params: dict) -> Outcome:
    return run_job(WORKLOAD, params, noise=NoiseModel.off(), seed=0)


def test_a_job_holds_its_worker_for_its_launch_and_steps_times_the_clock() -> None:
    runner = SimulatedRunner(clock=0.01)
    done = _outcome(FITS)
    assert done.state == "complete"
    assert runner.wall_s(done, WORKLOAD) == pytest.approx(0.01 * job_duration(done, WORKLOAD))
    assert runner.wall_s(done, WORKLOAD) > 0.01 * STARTUP_S  # its steps count too


def test_an_out_of_memory_job_ends_at_launch_before_one_that_runs() -> None:
    runner = SimulatedRunner(clock=0.01)
    oom = _outcome(OOM)
    assert oom.state == "infeasible"
    assert runner.wall_s(oom, WORKLOAD) == pytest.approx(0.01 * STARTUP_S)
    assert runner.wall_s(oom, WORKLOAD) < runner.wall_s(_outcome(FITS), WORKLOAD)


def test_without_a_clock_jobs_return_at_once() -> None:
    assert SimulatedRunner().wall_s(_outcome(FITS), WORKLOAD) == 0.0
    assert SimulatedRunner(time_scale=0.1, steps=20).wall_s(
        _outcome(FITS), WORKLOAD
    ) == pytest.approx(2.0)

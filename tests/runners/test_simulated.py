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


def test_a_running_job_reports_its_progress_and_a_cancelled_one_what_it_ran() -> None:
    import time

    from cubic.runners.base import TrialJob
    from tests.runners.outcomes import wait

    noise = NoiseModel(straggler_prob=0.0, failure_prob=0.0)
    runner = SimulatedRunner(steps=400, time_scale=0.01, noise=noise)
    job = TrialJob(
        trial_id=3, study_id=1, number=0, attempt=1, params=FITS, workload=WORKLOAD.to_dict()
    )
    handle = runner.submit(job)
    deadline = time.monotonic() + 60
    while (p := runner.progress(handle)) is None or p.timed_steps < 5:
        assert time.monotonic() < deadline, "no progress within 60 s"
        time.sleep(0.01)
    assert p.steps == p.timed_steps + noise.warmup_steps and p.throughput > 0
    runner.cancel(handle)
    out = wait(runner, handle)
    full = run_job(WORKLOAD, FITS, steps=400, noise=noise, seed=3)
    assert out.state == "failed" and out.error == "cancelled"
    assert p.steps <= out.metrics["steps"] < 403
    assert 0 < out.metrics["gpu_hours"] < full.metrics["gpu_hours"]
    assert out.metrics["tokens_per_s"] == pytest.approx(full.metrics["tokens_per_s"], rel=0.05)
    runner.close()


def test_a_job_that_returns_at_once_shows_no_progress() -> None:
    from cubic.runners.base import TrialJob
    from tests.runners.outcomes import wait

    runner = SimulatedRunner()
    job = TrialJob(
        trial_id=3, study_id=1, number=0, attempt=1, params=FITS, workload=WORKLOAD.to_dict()
    )
    handle = runner.submit(job)
    assert wait(runner, handle).state in ("complete", "failed")
    assert runner.progress(handle) is None

"""Simulated jobs behave like jobs: seeded noise, warm-up, stragglers, failures, OOM."""

from __future__ import annotations

import numpy as np
import pytest

from cubic.sim import simulate
from cubic.sim.job import NoiseModel, run_job
from cubic.workload import PRESETS

WL = PRESETS["llama3_8b"]
CFG = {
    "tp": 2,
    "pp": 1,
    "micro_batch": 1,
    "recompute": "selective",
    "zero_stage": 1,
    "sequence_parallel": True,
}


def test_noise_off_reports_the_model_exactly() -> None:
    out = run_job(WL, CFG, noise=NoiseModel.off(), seed=1)
    row = simulate(WL, [CFG]).row(0)
    assert out.state == "complete"
    assert out.metrics["tokens_per_s"] == pytest.approx(row["throughput"])
    assert out.metrics["step_time_s"] == pytest.approx(row["step_time_s"])


def test_seeded_noise_is_reproducible_and_a_few_percent() -> None:
    noise = NoiseModel(straggler_prob=0.0, failure_prob=0.0)
    a = run_job(WL, CFG, noise=noise, seed=7).metrics["tokens_per_s"]
    assert run_job(WL, CFG, noise=noise, seed=7).metrics["tokens_per_s"] == a
    exact = simulate(WL, [CFG]).row(0)["throughput"]
    vals = np.array(
        [run_job(WL, CFG, noise=noise, seed=s).metrics["tokens_per_s"] for s in range(200)]
    )
    spread = vals.std() / vals.mean()
    assert 0.002 < spread < 0.03
    # Warm-up steps are slow, but excluded from the measured throughput.
    assert abs(vals.mean() / exact - 1) < 0.01


def test_stragglers_slow_some_runs_and_failures_happen_at_their_rate() -> None:
    noise = NoiseModel(jitter=0.0, straggler_prob=0.2, failure_prob=0.1)
    outs = [run_job(WL, CFG, noise=noise, seed=s) for s in range(400)]
    failed = [o for o in outs if o.state == "failed"]
    assert 20 <= len(failed) <= 65
    assert all("NCCL" in (o.log_tail or "") for o in failed)
    exact = simulate(WL, [CFG]).row(0)["throughput"]
    slow = [o for o in outs if o.state == "complete" and o.metrics["throughput"] < 0.97 * exact]
    assert 40 <= len(slow) <= 110


def test_out_of_memory_is_infeasible_with_the_reason() -> None:
    wl = PRESETS["llama3_70b"]
    cfg = {"tp": 1, "pp": 1, "cp": 1, "micro_batch": 1, "recompute": "none", "zero_stage": 0}
    out = run_job(wl, cfg, seed=0)
    assert out.state == "infeasible"
    assert "out of memory" in out.error.lower()
    assert "OutOfMemoryError" in out.log_tail


def test_a_job_step_by_step_ends_where_run_job_does() -> None:
    """The progress after every step is what the final metrics say; a cut short job reports
    the steps it ran."""
    from cubic.sim.job import simulate_job

    job = simulate_job(WL, CFG, steps=20, seed=5)
    done = run_job(WL, CFG, steps=20, seed=5)
    assert job.outcome == done and job.times is not None and len(job.times) == 23
    last = job.progress(23)
    assert (last.steps, last.timed_steps) == (23, 20)
    assert last.throughput == pytest.approx(done.metrics["tokens_per_s"])
    assert last.step_time_s == pytest.approx(done.metrics["step_time_s"])
    assert job.partial_metrics(23)["gpu_hours"] == pytest.approx(done.metrics["gpu_hours"])
    early = job.partial_metrics(9)
    assert early["timed_steps"] == 6 and early["steps"] == 9
    assert early["gpu_hours"] < done.metrics["gpu_hours"]
    assert early["tokens_per_s"] == pytest.approx(done.metrics["tokens_per_s"], rel=0.1)
    assert early["peak_memory_gb"] == done.metrics["peak_memory_gb"]
    assert "tokens_per_s" not in job.partial_metrics(2)  # only warm-up steps so far

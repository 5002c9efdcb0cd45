"""A simulated training job: one configuration run for a few steps, the way a real job behaves.

Real jobs are noisy: the same config measured twice differs by a few percent, the first steps
are slow (allocator warm-up, NCCL communicator set-up, compilation), an unlucky placement now
and then lands next to a slow node, and sometimes a node simply dies. The noise model
reproduces each of these, seeded, and each can be switched off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cubic.objectives import cost_per_million
from cubic.outcome import Outcome
from cubic.pruning import Progress
from cubic.sim import simulate
from cubic.workload import Workload

STARTUP_S = 120.0
"""Simulated seconds to launch a job (scheduling, container start, NCCL set-up)."""


def job_duration(outcome: Outcome, workload: Workload) -> float:
    """Simulated seconds a job holds its worker: launch plus every step it ran (an
    out-of-memory or invalid config dies at launch, a lost node after twice that)."""
    if outcome.state == "complete":
        hours = float(outcome.metrics.get("gpu_hours", 0.0))
        return STARTUP_S + hours * 3600.0 / workload.cluster.num_gpus
    if outcome.state == "failed":
        return 2.0 * STARTUP_S
    return STARTUP_S


@dataclass(frozen=True, slots=True)
class NoiseModel:
    """Run-to-run behaviour of a simulated job.

    ``jitter`` is the log-normal sigma of each step's time; the first ``warmup_steps`` take
    ``warmup_slowdown`` times longer and are excluded from the measured throughput, as a
    real benchmark harness excludes them; with probability ``straggler_prob`` the whole job
    runs slower by a factor drawn from ``straggler_slowdown``; with probability
    ``failure_prob`` the job dies (a lost node) and the trial is ``failed``.
    """

    jitter: float = 0.03
    warmup_steps: int = 3
    warmup_slowdown: float = 3.0
    straggler_prob: float = 0.03
    straggler_slowdown: tuple[float, float] = (1.05, 1.30)
    failure_prob: float = 0.01

    @classmethod
    def off(cls) -> NoiseModel:
        """A deterministic job: what the analytical model says, every time."""
        return cls(0.0, 0, 1.0, 0.0, (1.0, 1.0), 0.0)


def _oom_message(reason: str, gpu: str) -> str:
    return f"torch.OutOfMemoryError: CUDA out of memory on {gpu} (simulated). {reason}"


@dataclass(frozen=True, slots=True)
class SimulatedJob:
    """A simulated job, step by step: its outcome had it run to the end and, when it runs at
    all, the time of every step (``warmup`` warm-up steps first), so that a job stopped
    early (a pruned trial) reports what it had measured by then."""

    outcome: Outcome
    times: np.ndarray | None = None
    warmup: int = 0
    units_per_step: float = 0.0
    num_gpus: int = 1

    def progress(self, k: int) -> Progress:
        """What the job's step timer says after its first ``k`` steps."""
        assert self.times is not None
        return Progress.of_times(self.times[:k], self.warmup, self.units_per_step)

    def partial_metrics(self, k: int) -> dict[str, Any]:
        """The metrics of the first ``k`` steps: the GPU-hours they held, and the throughput
        they measured once any step after the warm-up has run."""
        if self.times is None:
            return {}
        p = self.progress(k)
        full = self.outcome.metrics
        out: dict[str, Any] = {
            "gpu_hours": float(self.times[:k].sum()) * self.num_gpus / 3600.0,
            "steps": p.steps,
            "timed_steps": p.timed_steps,
        }
        if k > 0:  # known once the job has run a step
            out.update({m: full[m] for m in ("peak_memory_gb", "error_score") if m in full})
        if p.throughput is not None and p.step_time_s is not None:
            out["throughput"] = p.throughput
            out["step_time_s"] = p.step_time_s
            for unit in ("tokens_per_s", "samples_per_s"):
                if unit in full:
                    out[unit] = p.throughput
            out["mfu"] = full["mfu"] * p.throughput / full["throughput"]
            out["cost"] = cost_per_million(p.throughput, self.num_gpus)
        return out


def run_job(
    workload: Workload,
    config: dict[str, Any],
    *,
    steps: int = 20,
    noise: NoiseModel | None = None,
    seed: int | None = None,
) -> Outcome:
    """Run ``config`` for ``steps`` measured steps and report what a real job would."""
    return simulate_job(workload, config, steps=steps, noise=noise, seed=seed).outcome


def simulate_job(
    workload: Workload,
    config: dict[str, Any],
    *,
    steps: int = 20,
    noise: NoiseModel | None = None,
    seed: int | None = None,
) -> SimulatedJob:
    """:func:`run_job`, with the time of every step it runs (warm-up first)."""
    noise = NoiseModel() if noise is None else noise
    rng = np.random.default_rng(seed)
    res = simulate(workload, [config])
    row = res.row(0)
    if not row["valid"]:
        return SimulatedJob(
            Outcome("infeasible", error=row["reason"], log_tail=f"ValueError: {row['reason']}")
        )
    if not row["fits"]:
        msg = _oom_message(row["reason"], workload.cluster.gpu)
        return SimulatedJob(
            Outcome(
                "infeasible",
                metrics={"peak_memory_gb": row["peak_memory_gb"]},
                error=row["reason"],
                log_tail=msg,
            )
        )
    if noise.failure_prob > 0 and rng.random() < noise.failure_prob:
        step = int(rng.integers(0, max(1, steps)))
        return SimulatedJob(
            Outcome(
                "failed",
                error="node lost (simulated)",
                log_tail=f"step {step}: NCCL watchdog timeout: rank lost contact with its peers",
            )
        )
    base = row["step_time_s"]
    slow = 1.0
    if noise.straggler_prob > 0 and rng.random() < noise.straggler_prob:
        slow = float(rng.uniform(*noise.straggler_slowdown))
    times = base * slow * rng.lognormal(0.0, noise.jitter, size=steps + noise.warmup_steps)
    times[: noise.warmup_steps] *= noise.warmup_slowdown
    measured = float(times[noise.warmup_steps :].mean())
    ratio = base / measured
    throughput = row["throughput"] * ratio
    n_gpus = workload.cluster.num_gpus
    unit = "tokens_per_s" if workload.kind == "llm" else "samples_per_s"
    metrics = {
        "throughput": throughput,
        unit: throughput,
        "step_time_s": measured,
        "mfu": row["mfu"] * ratio,
        "peak_memory_gb": row["peak_memory_gb"],
        "error_score": row["error_score"],
        "gpu_hours": float(times.sum()) * n_gpus / 3600.0,
        # GPU-hours per million tokens (LLM) or samples (DLRM): the cost objective.
        "cost": cost_per_million(throughput, n_gpus),
        "steps": steps,
        "warmup_steps": noise.warmup_steps,
    }
    outcome = Outcome(
        "complete", metrics=metrics, log_tail=f"{steps} steps, {unit}={throughput:.1f}"
    )
    # Tokens (or samples) per step: what the analytical model's throughput and step time say.
    return SimulatedJob(outcome, times, noise.warmup_steps, row["throughput"] * base, n_gpus)

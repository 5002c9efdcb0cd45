"""The ``simulated`` runner: the job runs on the simulated cluster, in a worker thread.

``time_scale`` makes a job take ``time_scale`` seconds per simulated step, so that leases,
heartbeats and shutdown can be exercised with jobs that take time; ``clock`` instead makes it
take ``clock`` seconds per second the job would hold its cluster
(:func:`cubic.sim.job.job_duration`: launch plus every step, an out-of-memory config dying at
launch), so that jobs end in the order real ones would; 0 for both (the default) returns as
soon as the model has answered.

A job that takes time runs step by step: each step's time comes from the noise model (the
warm-up steps first, slower), and after each one the job's progress (:meth:`progress`) is
what a real job's :class:`~cubic.job.StepTimer` would report, so that a study can stop a slow
trial early. A cancelled job ends ``failed`` with the metrics of the steps it ran (the
GPU-hours it held).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cubic.outcome import Outcome
from cubic.pruning import Progress
from cubic.runners.base import Runner, TrialJob
from cubic.sim.job import STARTUP_S, NoiseModel, SimulatedJob, job_duration, simulate_job
from cubic.workload import Workload


class _Live:
    """What a running job's thread shares with the worker: its progress so far."""

    __slots__ = ("progress",)

    def __init__(self) -> None:
        self.progress: Progress | None = None


SimHandle = tuple[Future[Outcome], threading.Event, _Live]


class SimulatedRunner(Runner):
    name = "simulated"
    needs_command = False

    def __init__(
        self,
        *,
        steps: int = 20,
        time_scale: float = 0.0,
        clock: float = 0.0,
        seed: int = 0,
        noise: NoiseModel | None = None,
        max_workers: int = 8,
    ) -> None:
        self.steps = steps
        self.time_scale = time_scale
        self.clock = clock
        self.seed = seed
        self.noise = noise
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sim-job")
        self._workloads: dict[str, Workload] = {}

    def _workload(self, spec: dict[str, Any]) -> Workload:
        key = repr(sorted(spec.items()))
        if key not in self._workloads:
            self._workloads[key] = Workload.from_dict(spec)
        return self._workloads[key]

    def _run(self, job: TrialJob, cancelled: threading.Event, live: _Live) -> Outcome:
        workload = self._workload(job.workload)
        sim = simulate_job(
            workload,
            job.params,
            steps=self.steps,
            noise=self.noise,
            seed=self.seed * 1_000_003 + job.trial_id,
        )
        outcome = sim.outcome
        wall = self.wall_s(outcome, workload)
        if wall <= 0:
            return outcome
        if sim.times is None:  # dies at launch (or loses its node): no step to report
            if wall > job.timeout_s:
                cancelled.wait(job.timeout_s)
                return Outcome("failed", error=f"timeout after {job.timeout_s:.0f} s")
            if cancelled.wait(wall):
                return Outcome("failed", error="cancelled")
            return outcome
        return self._steps(job, sim, cancelled, live)

    def _steps(
        self, job: TrialJob, sim: SimulatedJob, cancelled: threading.Event, live: _Live
    ) -> Outcome:
        """Run the job's steps in wall time, publishing its progress after each."""
        assert sim.times is not None
        spent = self.clock * STARTUP_S
        if spent > job.timeout_s:
            cancelled.wait(job.timeout_s)
            return Outcome("failed", error=f"timeout after {job.timeout_s:.0f} s")
        if cancelled.wait(spent):
            return Outcome("failed", error="cancelled")
        for i, t in enumerate(sim.times):
            wall = self.clock * float(t) + (self.time_scale if i >= sim.warmup else 0.0)
            if spent + wall > job.timeout_s:
                cancelled.wait(job.timeout_s - spent)
                return Outcome("failed", error=f"timeout after {job.timeout_s:.0f} s")
            if cancelled.wait(wall):
                return Outcome("failed", metrics=sim.partial_metrics(i), error="cancelled")
            spent += wall
            live.progress = sim.progress(i + 1)
        return sim.outcome

    def wall_s(self, outcome: Outcome, workload: Workload) -> float:
        """Seconds the job with ``outcome`` holds its worker (0: it returns at once)."""
        return self.time_scale * self.steps + self.clock * job_duration(outcome, workload)

    def submit(self, job: TrialJob) -> SimHandle:
        cancelled, live = threading.Event(), _Live()
        return self._pool.submit(self._run, job, cancelled, live), cancelled, live

    def poll(self, handle: SimHandle) -> Outcome | None:
        fut = handle[0]
        return fut.result() if fut.done() else None

    def progress(self, handle: SimHandle) -> Progress | None:
        return handle[2].progress

    def cancel(self, handle: SimHandle) -> None:
        handle[1].set()

"""The ``simulated`` runner: the job runs on the simulated cluster, in a worker thread.

``time_scale`` makes a job take ``time_scale`` seconds per simulated step, so that leases,
heartbeats and shutdown can be exercised with jobs that take time; ``clock`` instead makes it
take ``clock`` seconds per second the job would hold its cluster
(:func:`cubic.sim.job.job_duration`: launch plus every step, an out-of-memory config dying at
launch), so that jobs end in the order real ones would; 0 for both (the default) returns as
soon as the model has answered.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cubic.outcome import Outcome
from cubic.runners.base import Runner, TrialJob
from cubic.sim.job import NoiseModel, job_duration, run_job
from cubic.workload import Workload


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

    def _run(self, job: TrialJob, cancelled: threading.Event) -> Outcome:
        workload = self._workload(job.workload)
        outcome = run_job(
            workload,
            job.params,
            steps=self.steps,
            noise=self.noise,
            seed=self.seed * 1_000_003 + job.trial_id,
        )
        wall = self.wall_s(outcome, workload)
        if wall > 0:
            if wall > job.timeout_s:
                cancelled.wait(job.timeout_s)
                return Outcome("failed", error=f"timeout after {job.timeout_s:.0f} s")
            if cancelled.wait(wall):
                return Outcome("failed", error="cancelled")
        return outcome

    def wall_s(self, outcome: Outcome, workload: Workload) -> float:
        """Seconds the job with ``outcome`` holds its worker (0: it returns at once)."""
        return self.time_scale * self.steps + self.clock * job_duration(outcome, workload)

    def submit(self, job: TrialJob) -> tuple[Future[Outcome], threading.Event]:
        cancelled = threading.Event()
        return self._pool.submit(self._run, job, cancelled), cancelled

    def poll(self, handle: tuple[Future[Outcome], threading.Event]) -> Outcome | None:
        fut, _ = handle
        return fut.result() if fut.done() else None

    def cancel(self, handle: tuple[Future[Outcome], threading.Event]) -> None:
        handle[1].set()

"""The simulated cluster: an analytical performance and memory model of distributed training.

``simulate(workload, configs)`` scores a batch of configurations at once (NumPy arrays, no
Python loop over configurations); ``run_job`` turns one configuration into what a real job
would report, with run-to-run noise, warm-up steps, stragglers and rare failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cubic.sim.result import SimResult
from cubic.workload import Workload

Configs = Mapping[str, Any] | Sequence[Mapping[str, Any]]


def simulate(workload: Workload, configs: Configs) -> SimResult:
    """Score configurations of ``workload``: a list of dicts or a dict of equal-length arrays."""
    if workload.kind == "llm":
        from cubic.sim.llm import simulate_llm

        return simulate_llm(workload, configs)
    from cubic.sim.dlrm import simulate_dlrm

    return simulate_dlrm(workload, configs)


__all__ = ["SimResult", "simulate"]

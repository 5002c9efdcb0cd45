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


def knob_defaults(kind: str) -> dict[str, Any]:
    """The simulator's knobs of a workload kind, with their defaults."""
    if kind == "llm":
        from cubic.sim.llm import DEFAULTS
    else:
        from cubic.sim.dlrm import DEFAULTS
    return dict(DEFAULTS)


def unknown_knobs(kind: str, config: Mapping[str, Any]) -> list[str]:
    """Keys of ``config`` the simulator does not know, each with the nearest knob's name: a
    misspelt knob would otherwise silently keep its default."""
    import difflib

    if kind == "llm":
        from cubic.sim.llm import DERIVED
    else:
        from cubic.sim.dlrm import DERIVED
    known = [*knob_defaults(kind), *DERIVED]
    out = []
    for key in config:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            out.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return out


__all__ = ["SimResult", "knob_defaults", "simulate", "unknown_knobs"]

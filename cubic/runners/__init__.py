"""Runners: one module per place a trial can run, found by name here.

The registry maps a name to ``module:Class`` and imports it only when asked, so that a
worker that runs on Slurm needs neither Ray nor the Kubernetes client installed.
"""

from __future__ import annotations

import importlib
from typing import Any

from cubic.errors import InvalidInput
from cubic.runners.base import Runner, TrialJob

REGISTRY: dict[str, str] = {
    "simulated": "cubic.runners.simulated:SimulatedRunner",
    "local": "cubic.runners.local:LocalRunner",
    "slurm": "cubic.runners.slurm:SlurmRunner",
    "ray": "cubic.runners.ray:RayRunner",
    "kubernetes": "cubic.runners.kubernetes:KubernetesRunner",
}
EXTRAS = {"ray": "ray", "kubernetes": "kubernetes"}


def runner_class(name: str) -> type[Runner]:
    target = REGISTRY.get(name)
    if target is None:
        raise InvalidInput(
            f"runner '{name}' is not available; known: {', '.join(sorted(REGISTRY))}",
            field="runner",
        )
    module, _, cls = target.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        extra = EXTRAS.get(name)
        hint = f"; install it with: pip install 'cubic[{extra}]'" if extra else ""
        raise InvalidInput(
            f"runner '{name}' needs a package that is not installed ({exc.name}){hint}",
            field="runner",
        ) from exc


def make_runner(name: str, **options: Any) -> Runner:
    cls = runner_class(name)
    try:
        return cls(**options)
    except TypeError as exc:
        raise InvalidInput(f"runner '{name}': {exc}", field="runner-option") from exc


__all__ = ["REGISTRY", "Runner", "TrialJob", "make_runner", "runner_class"]

"""Fixtures of the runner tests: a real Slurm cluster, started once per session when used."""

from __future__ import annotations

from tests.runners.slurm_cluster import slurm_cluster

__all__ = ["slurm_cluster"]

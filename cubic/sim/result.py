"""What the simulated cluster says about a batch of configurations (struct of arrays)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SimResult:
    """Per-configuration outputs; every array has one entry per configuration.

    ``step_time`` is seconds per optimizer step; ``breakdown`` holds its parts (compute,
    exposed communication per parallel dimension, pipeline bubble, optimizer, embeddings...)
    so that an engineer can see why a config is slow. ``memory`` holds the peak bytes per
    GPU by part. A config that does not fit has ``fits`` false and says why in ``reason``;
    a config that cannot run at all (an invalid layout) has ``valid`` false and a reason too.
    """

    kind: str
    step_time: np.ndarray
    throughput: np.ndarray
    throughput_unit: str
    mfu: np.ndarray
    peak_memory: np.ndarray
    fits: np.ndarray
    valid: np.ndarray
    reason: np.ndarray
    error_score: np.ndarray
    breakdown: dict[str, np.ndarray] = field(default_factory=dict)
    memory: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.step_time)

    @property
    def feasible(self) -> np.ndarray:
        return self.fits & self.valid

    def row(self, i: int) -> dict[str, Any]:
        """One configuration's outputs as plain Python values (for JSON and reports)."""
        feasible = bool(self.feasible[i])
        out: dict[str, Any] = {
            "kind": self.kind,
            "feasible": feasible,
            "valid": bool(self.valid[i]),
            "fits": bool(self.fits[i]),
            "reason": str(self.reason[i]) or None,
            "step_time_s": float(self.step_time[i]) if feasible else None,
            "throughput": float(self.throughput[i]) if feasible else None,
            "throughput_unit": self.throughput_unit,
            "mfu": float(self.mfu[i]) if feasible else None,
            "peak_memory_gb": float(self.peak_memory[i]) / 1e9,
            "error_score": float(self.error_score[i]),
            "breakdown_s": {k: float(v[i]) for k, v in self.breakdown.items()},
            "memory_gb": {k: float(v[i]) / 1e9 for k, v in self.memory.items()},
        }
        return out

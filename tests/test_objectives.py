"""Constraint checks of finished trials: the reported peak memory in either unit."""

from __future__ import annotations

from cubic.objectives import violations
from cubic.study import parse_spec


def test_the_headroom_is_checked_in_gib_or_gb() -> None:
    spec = parse_spec(
        {
            "name": "o",
            "workload": {"preset": "llama3_8b", "cluster": {"gpu": "h100_sxm", "num_gpus": 8}},
            "space": {"parameters": {"x": {"type": "categorical", "choices": [1]}}},
            "constraints": {"memory_headroom": 0.05},
        }
    )
    wl = spec.load_workload()  # 80 GiB: 76 GiB allowed
    assert violations(spec, wl, {"peak_memory_gib": 75.0}) == []
    (why,) = violations(spec, wl, {"peak_memory_gib": 77.0})
    assert "77.0 GiB exceeds 76.0 GiB" in why
    assert violations(spec, wl, {"peak_memory_gb": 81.0}) == []  # 75.4 GiB
    assert violations(spec, wl, {"peak_memory_gb": 83.0})  # 77.3 GiB

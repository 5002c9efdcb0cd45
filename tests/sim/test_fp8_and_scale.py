"""FP8 gains over BF16 on H100, the scale term, and the calibration bar on the shipped runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cubic.sim.calibrate import CURRENT_DEFAULTS, validate
from cubic.sim.llm import simulate_llm
from cubic.workload import PRESETS, Cluster

#: Published FP8-over-BF16 throughput ratios of Llama 3 on H100 (NVIDIA's DGX Cloud
#: benchmarking recipes and Megatron-Bridge performance summaries, BF16 and FP8 sweeps of the
#: same layouts): 8B 1.33x, 405B 1.53x. For 70B the figure the previous model matched, 1.27x
#: (same layout in both precisions). These runs are kept out of the calibration data.
PUBLISHED_FP8_RATIO = {"llama3_8b": 1.33, "llama3_70b": 1.27, "llama3_405b": 1.53}

#: The recipes' layouts (NeMo/Megatron-Bridge Llama 3 pretraining on DGX H100).
LAYOUTS = {
    "llama3_8b": (8, 128, {"tp": 1, "pp": 1, "cp": 2}),
    "llama3_70b": (64, 128, {"tp": 4, "pp": 4, "cp": 2, "vp": 5}),
    "llama3_405b": (
        512,
        256,
        {"tp": 8, "pp": 8, "cp": 2, "vp": 8, "embedding_loss_in_split": True},
    ),
}


def _fp8_ratio(name: str) -> float:
    ngpu, gbs, layout = LAYOUTS[name]
    wl = PRESETS[name]
    wl = replace(
        wl,
        cluster=Cluster("h100_sxm", ngpu, 8),
        training=replace(wl.training, global_batch=gbs, precision="bf16"),
    )
    cfg = dict(CURRENT_DEFAULTS, **layout)
    res = simulate_llm(wl, [cfg, dict(cfg, precision="fp8")])
    assert res.valid.all(), res.reason
    return float(res.throughput[1] / res.throughput[0])


@pytest.mark.parametrize("name", sorted(PUBLISHED_FP8_RATIO))
def test_fp8_over_bf16_within_a_tenth_of_published(name):
    assert _fp8_ratio(name) == pytest.approx(PUBLISHED_FP8_RATIO[name], abs=0.1)


def test_fp8_gains_more_on_bigger_gemms():
    assert _fp8_ratio("llama3_8b") < _fp8_ratio("llama3_70b") < _fp8_ratio("llama3_405b")


def test_small_gemms_gain_less_from_fp8():
    """The same model split thinner by TP (smaller GEMMs) gains less from FP8."""
    wl = replace(PRESETS["llama3_70b"], cluster=Cluster("h100_sxm", 64, 8))
    ratios = []
    for tp in (2, 8):
        cfg = dict(CURRENT_DEFAULTS, tp=tp, pp=8 // tp * 2 if tp == 2 else 2, micro_batch=1)
        res = simulate_llm(wl, [cfg, dict(cfg, precision="fp8")])
        ratios.append(res.throughput[1] / res.throughput[0])
    assert ratios[1] < ratios[0]


def test_bf16_step_slows_with_node_count():
    """Weak scaling from 64 to 2,048 H100 costs a few percent per GPU (published 2-4 %)."""
    wl = PRESETS["llama3_70b"]
    cfg = dict(CURRENT_DEFAULTS, tp=4, pp=4, cp=2, vp=5)
    per_gpu = {}
    for n in (64, 2048):
        w = replace(
            wl,
            cluster=Cluster("h100_sxm", n, 8),
            training=replace(wl.training, global_batch=2 * n, precision="bf16"),
        )
        per_gpu[n] = simulate_llm(w, [cfg]).throughput[0] / n
    loss = 1.0 - per_gpu[2048] / per_gpu[64]
    assert 0.005 < loss < 0.06


def test_shipped_calibration_meets_the_bar():
    """Overall error at most 5 %, every source at most 10 %, every row priced."""
    result = validate()
    assert not result["skipped"]
    assert result["mape"] <= 5.0, result["by_source"]
    assert max(result["by_source"].values()) <= 10.0, result["by_source"]

"""The LLM training model: each formula against a hand-computed case, then its behaviour.

Hand-computed figures use the public formulas the model claims to follow (Narayanan et al.
SC21 for FLOPs and the pipeline bubble, Korthikanti et al. 2022 for activations,
Rajbhandari et al. 2020 / Megatron-LM for model state, the ring alpha-beta model for
collectives); behavioural tests check what an engineer expects of the landscape.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cubic.hardware import get_gpu
from cubic.sim import llm
from cubic.sim.llm import (
    FP8_SITES,
    activation_bytes_per_layer,
    bubble_fraction,
    layer_flops,
    layers_in_flight,
    lm_head_flops,
    simulate_llm,
)
from cubic.workload import LLM, PRESETS, Cluster, Training, Workload

GPT_22B = LLM("gpt_22b", 48, 6144, 64, 64, 24576, 51200, 2048, False)
GPT_175B = LLM("gpt_175b", 96, 12288, 96, 96, 49152, 51200, 2048, False)
GPT_1_7B = LLM("gpt_1.7b", 24, 2304, 24, 24, 9216, 51200, 2048, False)


def workload(
    model: LLM, gpu: str = "a100_80gb", gpus: int = 8, batch: int = 4, precision: str = "bf16"
) -> Workload:
    return Workload(model.name, model, Cluster(gpu, gpus), Training(batch, precision=precision))


def one(wl: Workload, **cfg):
    res = simulate_llm(wl, [cfg])
    return res, res.row(0)


# --- formulas ------------------------------------------------------------------------------


def test_layer_flops_match_narayanan_for_a_gpt():
    """Per layer 24 T h^2 (GEMMs) + 4 T s h (attention, full square without flash)."""
    T, h, s = 2048.0, 12288.0, 2048.0
    f = layer_flops(GPT_175B, T, tp=1, flash_attention=False)
    gemms = f["qkv"] + f["attn_out"] + f["mlp_in"] + f["mlp_out"]
    assert gemms == pytest.approx(24 * T * h * h)
    assert f["attn"] == pytest.approx(4 * T * s * h)
    # Whole model, forward + backward: 72 B s L h^2 (1 + s/6h + V/12Lh), eq. 3 of SC21.
    L, V = 96, 51200
    total = 3 * (L * (gemms + f["attn"]) + lm_head_flops(GPT_175B, T))
    assert total == pytest.approx(72 * T * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)))


@pytest.mark.parametrize("name", ["llama3_8b", "llama3_70b", "gpt3_175b"])
def test_layer_flops_agree_with_the_model_flop_count(name):
    """With causal flash attention, GEMM FLOPs x3 equal the MFU numerator per token."""
    m = PRESETS[name].model
    T = float(m.seq_len)
    f = layer_flops(m, T, tp=1, flash_attention=True)
    per_layer = sum(float(v) for v in f.values())
    total = 3 * (m.layers * per_layer + float(lm_head_flops(m, T)))
    assert total == pytest.approx(T * m.flops_per_token(), rel=1e-12)


def test_tensor_parallel_splits_flops_and_replicates_few_kv_heads():
    m = PRESETS["llama3_70b"].model  # 8 KV heads
    full = layer_flops(m, 8192.0, tp=1)
    tp8 = layer_flops(m, 8192.0, tp=8)
    assert tp8["attn_out"] == pytest.approx(full["attn_out"] / 8)
    assert tp8["qkv"] == pytest.approx(full["qkv"] / 8)
    tp16 = layer_flops(m, 8192.0, tp=16)  # KV heads replicated, Q still split
    h, d = m.hidden, m.head_dim
    assert tp16["qkv"] == pytest.approx(2 * 8192 * h * (h / 16 + 2 * d))


def test_bubble_fraction_1f1b_and_interleaved():
    assert bubble_fraction(8, 1, 64) == pytest.approx(7 / 64)
    assert bubble_fraction(8, 3, 64) == pytest.approx(7 / 192)
    assert bubble_fraction(1, 1, 16) == 0.0


def test_interleaving_divides_the_simulated_bubble():
    wl = workload(GPT_175B, gpus=64, batch=64)
    cfg = dict(tp=8, pp=8, micro_batch=1, recompute="selective", sequence_parallel=True)
    res = simulate_llm(wl, [dict(cfg, vp=1), dict(cfg, vp=3)])
    assert res.breakdown["bubble"][0] / res.breakdown["bubble"][1] == pytest.approx(3, rel=0.03)


def test_layers_in_flight_follow_korthikanti():
    # 1F1B: the first stage keeps p micro-batches of L/p layers, i.e. L layers.
    assert layers_in_flight(96, 8, 1, 64) == pytest.approx(96)
    assert layers_in_flight(96, 8, 1, 4) == pytest.approx(48)  # fewer micro-batches than stages
    # Interleaved: L (1 + (p-1)/(p v)).
    assert layers_in_flight(96, 8, 3, 64) == pytest.approx(96 * (1 + 7 / 24))
    assert layers_in_flight(105, 35, 3, 280) == pytest.approx(105 * (1 + 34 / 105))


def test_activation_memory_per_layer_is_korthikantis():
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    sbh = s * b * h
    act = lambda **kw: float(activation_bytes_per_layer(GPT_22B, s * b, tp=t, **kw))  # noqa: E731
    # No parallelism at all: sbh (34 + 5as/h).
    assert float(activation_bytes_per_layer(GPT_22B, s * b, tp=1)) == pytest.approx(
        sbh * (34 + 5 * a * s / h)
    )
    # Tensor parallel without sequence parallel: sbh (10 + 24/t + 5as/(ht)).
    assert act() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    # With sequence parallel everything splits: sbh/t (34 + 5as/h).
    assert act(sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    # Selective recompute drops the attention-score term: 34 sbh / t.
    assert act(sequence_parallel=True, recompute="selective") == pytest.approx(34 * sbh / t)
    # Full recompute keeps the layer input: 2 sbh (or 2 sbh / t with sequence parallel).
    assert act(recompute="full") == pytest.approx(2 * sbh)
    assert act(recompute="full", sequence_parallel=True) == pytest.approx(2 * sbh / t)
    # Flash attention never stores the scores either.
    assert act(sequence_parallel=True, flash_attention=True) == pytest.approx(34 * sbh / t)


def test_gated_mlp_and_gqa_change_the_activation_count():
    m = PRESETS["llama3_8b"].model  # h 4096, kv 1024, ffn 14336, gated
    h, kv, f = 4096, 1024, 14336
    per_token = 10 * h + 2 * h + 4 * kv + 2 * h + 2 * f * 2 + 2 * f
    got = activation_bytes_per_layer(m, 1.0, tp=1, flash_attention=True)
    assert float(got) == pytest.approx(per_token)


def test_model_state_memory_per_zero_stage():
    """Megatron's accounting: 2-byte weights, fp32 main grads, 12 bytes of Adam state."""
    wl = workload(GPT_1_7B, gpus=32, batch=512)
    h, L, V = GPT_1_7B.hidden, GPT_1_7B.layers, GPT_1_7B.vocab
    P = L * (12 * h * h + 4 * h) + 2 * V * h  # one pipeline stage holds everything
    assert pytest.approx(GPT_1_7B.params()) == P
    res = simulate_llm(wl, [dict(zero_stage=z, recompute="full") for z in range(4)])
    w, g, o = (res.memory[k] for k in ("weights", "grads", "optimizer"))
    assert (w[0], g[0], o[0]) == pytest.approx((2 * P, 4 * P, 12 * P))
    assert (w[1], g[1], o[1]) == pytest.approx((2 * P, 4 * P, 12 * P / 32))
    assert (w[2], g[2], o[2]) == pytest.approx((2 * P, 4 * P / 32, 12 * P / 32))
    # ZeRO-3 keeps a shard plus two gathered layers in flight.
    layer = 12 * h * h + 4 * h
    assert (w[3], g[3], o[3]) == pytest.approx(
        (2 * P / 32 + 2 * 2 * layer, 4 * P / 32, 12 * P / 32)
    )


def test_fp16_keeps_16_bit_gradients_by_default():
    wl = workload(GPT_1_7B, gpus=32, batch=512, precision="fp16")
    res, _ = one(wl, zero_stage=0, recompute="full")
    assert res.memory["grads"][0] == pytest.approx(2 * GPT_1_7B.params())
    res, _ = one(wl, zero_stage=0, recompute="full", fp32_grads=True)
    assert res.memory["grads"][0] == pytest.approx(4 * GPT_1_7B.params())


def test_tensor_parallel_all_reduce_time():
    """Two ring all-reduces of b*s*h 2-byte values per layer forward, two more backward."""
    wl = workload(GPT_22B, gpus=8, batch=4)
    res, _ = one(wl, tp=8, micro_batch=4, zero_stage=0, recompute="none")
    gpu = get_gpu("a100_80gb")
    nbytes = 4 * 2048 * 6144 * 2
    bw = gpu.nvlink_gbs * 1e9 * 0.80
    ar = 2 * 7 / 8 * nbytes / bw + 2 * 7 * gpu.nvlink_latency_us * 1e-6
    per_layer = 2 * ar + (1 - llm.TP_BWD_ASYNC) * 2 * ar
    assert res.breakdown["tp_comm"][0] == pytest.approx(48 * per_layer)


def test_data_parallel_gradient_all_reduce_time():
    """DDP: one ring all-reduce of fp32 gradients; a 4-node ring drives all 8 NICs."""
    wl = workload(GPT_1_7B, gpus=32, batch=512)
    res, _ = one(wl, zero_stage=0, recompute="full")
    gpu = get_gpu("a100_80gb")
    bw = min(gpu.nvlink_gbs * 0.80, 8 * gpu.nic_gbs * 0.90) * 1e9
    nbytes = 4 * GPT_1_7B.params()
    expected = 2 * 31 / 32 * nbytes / bw + 2 * 31 * gpu.nic_latency_us * 1e-6
    assert res.breakdown["dp_comm"][0] == pytest.approx(expected)
    # With tp=8 each data-parallel group has one GPU per node: one NIC.
    res8, _ = one(workload(GPT_1_7B, gpus=256, batch=512), tp=8, zero_stage=0, recompute="full")
    bw1 = gpu.nic_gbs * 0.90 * 1e9
    expected8 = 2 * 31 / 32 * nbytes / 8 / bw1 + 2 * 31 * gpu.nic_latency_us * 1e-6
    assert res8.breakdown["dp_comm"][0] == pytest.approx(expected8, rel=1e-3)


def test_overlap_hides_gradient_reduction_but_not_the_last_bucket():
    wl = replace(PRESETS["llama3_8b"], cluster=Cluster("h100_sxm", 64))
    cfg = dict(tp=1, pp=1, micro_batch=1, zero_stage=1)
    res = simulate_llm(wl, [cfg, dict(cfg, overlap_grad_reduce=True, overlap_param_gather=True)])
    assert 0 < res.breakdown["dp_comm"][1] < 0.5 * res.breakdown["dp_comm"][0]


def test_step_time_is_the_sum_of_its_parts():
    wl = PRESETS["llama3_70b"]
    res, row = one(
        wl,
        tp=4,
        pp=4,
        vp=5,
        cp=2,
        sequence_parallel=True,
        recompute="selective",
        overlap_grad_reduce=True,
    )
    assert sum(row["breakdown_s"].values()) == pytest.approx(row["step_time_s"])
    assert row["throughput"] == pytest.approx(512 * 8192 / row["step_time_s"])
    mfu = 512 * 8192 * wl.model.flops_per_token() / (row["step_time_s"] * 64 * 989.4e12)
    assert row["mfu"] == pytest.approx(mfu)
    parts = sum(
        res.memory[k][0] for k in ("weights", "grads", "optimizer", "activations", "overhead")
    )
    assert parts == pytest.approx(res.peak_memory[0])


def test_error_score_weights_fp8_sites():
    wl = PRESETS["llama3_8b"]
    cfgs = [{}, {k: True for k in FP8_SITES}, {"precision": "fp8"}, {"fp8_lm_head": True}]
    res = simulate_llm(wl, cfgs)
    assert res.error_score[0] == 0.0
    assert res.error_score[1] == pytest.approx(1.0)
    assert res.error_score[2] == pytest.approx(1.0 - llm.FP8_ERROR_WEIGHTS["fp8_lm_head"])
    assert res.error_score[3] == max(llm.FP8_ERROR_WEIGHTS.values())


# --- validity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (dict(tp=3), "invalid: tp*pp*cp=3 does not divide 64 GPUs"),
        (dict(tp=8, dp=4), "invalid: tp*pp*cp*dp=32 is not the 64 GPUs"),
        (dict(pp=32), "invalid: pp*vp=32 does not divide 80 layers"),
        (dict(tp=8, micro_batch=3), "invalid: micro_batch*dp=24 does not divide global batch 512"),
        (dict(vp=2), "invalid: vp>1 needs pp>1"),
        (dict(recompute="sometimes"), "invalid: recompute"),
        (dict(zero_stage=4), "invalid: zero_stage"),
        (dict(tp=8, tp_comm_overlap=True), "tp_comm_overlap needs sequence_parallel"),
        (dict(ep=2), "invalid: ep=2"),
        (dict(tp=0), "positive integers"),
    ],
)
def test_invalid_layouts_say_why(cfg, needle):
    res, row = one(PRESETS["llama3_70b"], **cfg)
    assert not row["valid"] and not row["feasible"]
    assert needle in row["reason"]
    assert row["step_time_s"] is None and res.throughput[0] == 0.0


def test_kv_heads_and_tp_must_divide_one_another():
    m = LLM("gqa6", 8, 6144, 48, 6, 24576, 51200, 2048, False)
    res = simulate_llm(workload(m, gpus=8, batch=8), [dict(tp=4), dict(tp=2), dict(tp=8)])
    assert res.reason[0] == "invalid: tp=4 and 6 KV heads do not divide one another"
    assert res.valid[1] and not res.valid[2]


def test_interleaving_needs_whole_rounds_of_micro_batches():
    wl = replace(PRESETS["llama3_70b"], training=Training(96))
    _, row = one(wl, tp=8, pp=4, vp=5, micro_batch=8)  # 6 micro-batches over 4 stages
    assert (
        "invalid: interleaving needs the 6 micro-batches to be a multiple of pp=4" in row["reason"]
    )


def test_fp8_on_a_gpu_without_it_is_invalid():
    _, row = one(workload(GPT_22B), tp=8, micro_batch=4, precision="fp8")
    assert "no FP8" in row["reason"]


# --- behaviour -------------------------------------------------------------------------------


def fp8_case(name: str):
    """A sensible, fitting layout for each Llama 3 preset on H100."""
    # NeMo's published layouts for 8k-token Llama 3: context parallel keeps activations in HBM.
    if name == "llama3_8b":
        return PRESETS[name], dict(
            tp=1,
            pp=1,
            cp=2,
            micro_batch=1,
            zero_stage=1,
            overlap_grad_reduce=True,
            overlap_param_gather=True,
        )
    if name == "llama3_70b":
        return PRESETS[name], dict(
            tp=4,
            pp=4,
            vp=5,
            cp=2,
            micro_batch=1,
            sequence_parallel=True,
            tp_comm_overlap=True,
            overlap_grad_reduce=True,
            overlap_param_gather=True,
        )
    # 126 layers need a pipeline depth that divides them: 9 stages on 1152 GPUs.
    wl = replace(PRESETS[name], cluster=Cluster("h100_sxm", 1152))
    return wl, dict(
        tp=8,
        pp=9,
        cp=2,
        micro_batch=1,
        sequence_parallel=True,
        tp_comm_overlap=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
    )


@pytest.mark.parametrize("name", ["llama3_8b", "llama3_70b", "llama3_405b"])
def test_fp8_speeds_up_dense_llama_by_1_2_to_1_6x(name):
    wl, cfg = fp8_case(name)
    res = simulate_llm(wl, [cfg, dict(cfg, **{k: True for k in FP8_SITES})])
    assert res.feasible.all(), res.reason
    speedup = res.step_time[0] / res.step_time[1]
    assert 1.2 <= speedup <= 1.6


def test_fp8_gains_little_on_small_gemms():
    """Cast overheads and small GEMMs: a tiny model gains less from FP8 than a big one."""
    small = Workload(
        "s",
        LLM("s", 12, 768, 12, 12, 3072, 32000, 1024, False),
        Cluster("h100_sxm", 8),
        Training(64),
    )
    on = {k: True for k in FP8_SITES}
    r_small = simulate_llm(small, [dict(tp=4), dict(tp=4, **on)])
    wl, cfg = fp8_case("llama3_70b")
    r_big = simulate_llm(wl, [cfg, dict(cfg, **on)])
    gain = lambda r: r.step_time[0] / r.step_time[1]  # noqa: E731
    assert gain(r_small) < 1.15 < gain(r_big)


def test_h200_fits_what_h100_cannot():
    wl = PRESETS["llama3_70b"]
    cfg = dict(tp=8, pp=1, micro_batch=1, zero_stage=1, sequence_parallel=True)
    _, h100 = one(wl, **cfg)
    _, h200 = one(replace(wl, cluster=Cluster("h200", 64)), **cfg)
    assert not h100["fits"] and h100["reason"].startswith("out of memory")
    assert h200["fits"]


def test_h200_is_faster_where_memory_bandwidth_binds():
    """Same FLOP/s, 43 % more HBM bandwidth: element-wise work and optimizer step shrink."""
    small = Workload(
        "s",
        LLM("s", 24, 2048, 16, 16, 8192, 50304, 2048, False),
        Cluster("h100_sxm", 8),
        Training(64),
    )
    cfg = dict(tp=8, micro_batch=1, sequence_parallel=False)
    _, h100 = one(small, **cfg)
    _, h200 = one(replace(small, cluster=Cluster("h200", 8)), **cfg)
    assert h200["step_time_s"] < 0.95 * h100["step_time_s"]
    # A big compute-bound layout gains much less.
    wl, cfg = fp8_case("llama3_70b")
    _, big100 = one(wl, **cfg)
    _, big200 = one(replace(wl, cluster=Cluster("h200", 64)), **cfg)
    assert big200["step_time_s"] / big100["step_time_s"] > h200["step_time_s"] / h100["step_time_s"]


def test_llama3_70b_without_model_parallelism_does_not_fit():
    _, row = one(PRESETS["llama3_70b"], tp=1, pp=1, recompute="none", zero_stage=0)
    assert row["valid"] and not row["fits"]
    assert row["reason"].startswith("out of memory:")
    assert "GiB needed > 80 GiB HBM" in row["reason"]


def score(res) -> np.ndarray:
    """Throughput, counting a config that cannot run as zero."""
    return np.where(res.feasible, res.throughput, 0.0)


def test_best_micro_batch_depends_on_pipeline_depth():
    wl = replace(PRESETS["llama3_70b"], training=Training(128))
    mbs = [1, 2, 4, 8]
    base = dict(tp=8, cp=1, recompute="full", sequence_parallel=True, zero_stage=1)
    best = {}
    for pp in (1, 8):
        res = simulate_llm(wl, [dict(base, pp=pp, micro_batch=m) for m in mbs])
        assert res.feasible.any()
        best[pp] = mbs[int(np.argmax(score(res)))]
    assert best[1] > best[8]


def helps_and_hurts(knob, low, high, helps, hurts):
    """``knob`` going from low to high raises throughput in one context, lowers it in another."""
    for (wl, cfg), sign in ((helps, 1), (hurts, -1)):
        res = simulate_llm(wl, [dict(cfg, **{knob: low}), dict(cfg, **{knob: high})])
        s = score(res)
        assert sign * (s[1] - s[0]) > 0, (knob, sign, res.reason, s)


L8, L70 = PRESETS["llama3_8b"], PRESETS["llama3_70b"]


def test_tp_is_not_monotone():
    # 70B at tp=4 does not fit two pipeline stages; 8B only pays for more communication.
    helps_and_hurts(
        "tp", 4, 8, (L70, dict(pp=2, sequence_parallel=True)), (L8, dict(sequence_parallel=True))
    )


def test_pp_is_not_monotone():
    # 70B needs the pipeline to fit; 8B only gets a bubble.
    helps_and_hurts(
        "pp",
        1,
        4,
        (L70, dict(tp=8, sequence_parallel=True)),
        (L8, dict(tp=2, sequence_parallel=True)),
    )


def test_micro_batch_is_not_monotone():
    # Bigger GEMMs without a pipeline; a deeper bubble with few micro-batches per stage.
    helps_and_hurts(
        "micro_batch",
        1,
        2,
        (L8, dict(tp=8, recompute="full", sequence_parallel=True)),
        (
            replace(L70, training=Training(128)),
            dict(tp=8, pp=8, recompute="full", sequence_parallel=True),
        ),
    )


def test_recompute_is_not_monotone():
    # Recomputation is what lets 70B fit on two stages; for 8B it is pure overhead.
    helps_and_hurts(
        "recompute",
        "none",
        "full",
        (L70, dict(tp=8, pp=2)),
        (L8, dict(tp=2, sequence_parallel=True)),
    )


def test_zero_stage_is_not_monotone():
    # Sharding the weights makes 70B fit without model parallelism; where the model already
    # fits, ZeRO-3 re-gathers the weights every micro-batch.
    helps_and_hurts(
        "zero_stage",
        2,
        3,
        (L70, dict(tp=1, pp=1, recompute="full")),
        (L70, dict(tp=8, pp=2, sequence_parallel=True)),
    )


def test_batch_equals_one_at_a_time():
    rng = np.random.default_rng(7)
    n = 120
    cfgs = [
        dict(
            tp=int(rng.choice([1, 2, 4, 8])),
            pp=int(rng.choice([1, 2, 4, 8])),
            cp=int(rng.choice([1, 2])),
            vp=int(rng.choice([1, 2, 5])),
            micro_batch=int(rng.choice([1, 2, 4])),
            zero_stage=int(rng.integers(0, 4)),
            recompute=str(rng.choice(["none", "selective", "full"])),
            sequence_parallel=bool(rng.random() < 0.5),
            fp8_mlp_in=bool(rng.random() < 0.5),
            fp8_lm_head=bool(rng.random() < 0.3),
            overlap_grad_reduce=bool(rng.random() < 0.5),
            overlap_param_gather=bool(rng.random() < 0.5),
        )
        for _ in range(n)
    ]
    wl = PRESETS["llama3_70b"]
    batch = simulate_llm(wl, cfgs)
    assert 0 < batch.valid.sum() < n  # a mix of valid and invalid layouts
    for i, cfg in enumerate(cfgs):
        single = simulate_llm(wl, [cfg])
        assert batch.row(i) == single.row(0)
    # A struct of arrays gives the same answer as the list of dicts.
    soa = {
        k: np.array([c[k] for c in cfgs], dtype=object if k == "recompute" else None)
        for k in cfgs[0]
    }
    again = simulate_llm(wl, soa)
    np.testing.assert_array_equal(again.step_time, batch.step_time)
    np.testing.assert_array_equal(again.reason, batch.reason)


def test_needs_an_llm_workload():
    with pytest.raises(TypeError):
        simulate_llm(PRESETS["dlrm_criteo_dot"], [{}])


def test_expert_parallel_shards_experts_and_pays_for_all_to_all():
    moe = LLM("moe_8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, True, experts=8, top_k=2)
    wl = Workload("moe", moe, Cluster("h100_sxm", 64), Training(256))
    res = simulate_llm(wl, [dict(pp=4, ep=1), dict(pp=4, ep=8)])
    assert res.valid.all()
    assert res.breakdown["ep_comm"][0] == 0.0 < res.breakdown["ep_comm"][1]
    _, mlp = moe.layer_params()
    saved = (32 / 4) * mlp * (1 - 1 / 8) * 2  # 8 layers per stage, bf16 weights
    assert res.memory["weights"][0] - res.memory["weights"][1] == pytest.approx(saved)
    assert res.fits[1] and not res.fits[0]


# --- uneven pipeline stages ----------------------------------------------------------------


LLAMA_405B = PRESETS["llama3_405b"]  # 126 layers


def test_a_126_layer_model_over_16_stages_needs_an_uneven_split():
    even, _ = one(LLAMA_405B, tp=8, pp=16, sequence_parallel=True)
    assert not even.valid[0] and "does not divide 126 layers" in even.reason[0]
    for cfg in (
        {"embedding_loss_in_split": True},  # 128 slots: 7 | 8 x 14 | 7
        {"first_stage_layers": 7, "last_stage_layers": 7},
        {"embedding_loss_in_split": True, "vp": 2, "micro_batch": 1},
    ):
        res, _ = one(LLAMA_405B, tp=8, pp=16, sequence_parallel=True, **cfg)
        assert res.valid[0], (cfg, res.reason[0])
        assert 0 < float(res.step_time[0]) < np.inf


def test_an_uneven_split_prices_the_busiest_rank():
    """With 8 layers on each middle rank and 7 plus the LM head on the last, the step costs
    less than an even 128-layer split (whose last rank carries 8 layers and the head), but
    not less than 8 layers a rank do (the lighter first and last ranks wait)."""
    model = LLAMA_405B.model
    even_128 = replace(LLAMA_405B, model=replace(model, layers=128))
    ours, _ = one(LLAMA_405B, tp=8, pp=16, sequence_parallel=True, embedding_loss_in_split=True)
    theirs, _ = one(even_128, tp=8, pp=16, sequence_parallel=True)
    ratio = float(ours.step_time[0] / theirs.step_time[0])
    assert 0.85 < ratio < 1.0
    # Crowding the first rank instead makes it the slowest: a worse step.
    heavy, _ = one(LLAMA_405B, tp=8, pp=16, sequence_parallel=True, first_stage_layers=21)
    assert heavy.valid[0], heavy.reason[0]
    assert heavy.step_time[0] > ours.step_time[0] * 1.5


@pytest.mark.parametrize(
    ("cfg", "reason"),
    [
        ({"pp": 1, "first_stage_layers": 4}, "needs pp>1"),
        ({"first_stage_layers": 9, "last_stage_layers": 9}, "do not split evenly"),
        ({"first_stage_layers": 7, "embedding_loss_in_split": True}, "exclude each other"),
        ({"first_stage_layers": 7, "last_stage_layers": 7, "vp": 2}, "vp=2 model chunks"),
        ({"embedding_loss_in_split": True, "vp": 16}, "plus the embedding and the loss"),
    ],
)
def test_impossible_uneven_splits_are_invalid_and_say_why(cfg, reason):
    res, _ = one(LLAMA_405B, **{"tp": 8, "pp": 16, **cfg})
    assert not res.valid[0]
    assert reason in res.reason[0]


def test_the_first_rank_holds_fewer_layers_of_activations_with_a_lighter_first_stage():
    base = dict(tp=8, pp=16, sequence_parallel=True, recompute="selective")
    light, _ = one(LLAMA_405B, **base, first_stage_layers=4, last_stage_layers=2)
    plain, _ = one(LLAMA_405B, **base, embedding_loss_in_split=True)
    # 120 layers over 14 middle ranks do not split: the 4+2 case is refused...
    assert not light.valid[0]
    light, _ = one(LLAMA_405B, **base, first_stage_layers=4, last_stage_layers=10)
    assert light.valid[0], light.reason[0]  # 112 = 14 x 8
    # ... and where it is valid, the busiest rank is no longer the first one.
    assert light.peak_memory[0] <= plain.peak_memory[0] * 1.001


# --- FSDP and HSDP -------------------------------------------------------------------------


def _llama_8b_8k(gpus: int) -> Workload:
    m = replace(PRESETS["llama3_8b"].model, seq_len=8192)
    return Workload("llama3_8b", m, Cluster("h100_sxm", gpus), Training(gpus, precision="bf16"))


def test_fsdp_of_llama3_8b_on_8_h100_fits_where_data_parallelism_does_not():
    """torchtitan trains Llama 3 8B on 8 H100 with FSDP, local batch 1, sequence 8192."""
    wl = _llama_8b_8k(8)
    fsdp, _ = one(wl, fsdp="full", recompute="selective")
    assert fsdp.fits[0], fsdp.reason[0]
    # 16 bytes of state per parameter, all sharded 8 ways: about 2 bytes each.
    params = wl.model.params()
    state = fsdp.memory["optimizer"][0] + fsdp.memory["grads"][0] + fsdp.memory["weights"][0]
    assert state < 16.0 * params / 8 + 3 * 2**30
    ddp, _ = one(wl, zero_stage=0, recompute="selective")
    assert not ddp.fits[0] and "out of memory" in ddp.reason[0]


def test_fsdp_communicates_per_micro_batch_and_hsdp_keeps_it_in_the_node():
    wl = _llama_8b_8k(128)
    full, _ = one(wl, fsdp="full", recompute="selective")
    hybrid, _ = one(wl, fsdp="hybrid", recompute="selective")
    assert full.valid[0] and hybrid.valid[0]
    # Shards over 8 GPUs of a node instead of 128: more state per GPU...
    assert hybrid.memory["optimizer"][0] == pytest.approx(16 * full.memory["optimizer"][0])
    # ... and the gathers run over NVLink, the slow hop only for one all-reduce a step.
    wl_acc = replace(wl, training=Training(128 * 8, precision="bf16"))  # 8 micro-batches
    one_mb, _ = one(wl, fsdp="full", recompute="selective")
    eight, _ = one(wl_acc, fsdp="full", recompute="selective")
    assert eight.breakdown["dp_comm"][0] > one_mb.breakdown["dp_comm"][0]


def test_fsdp_shard_must_divide_the_data_parallel_ranks_and_modes_are_named():
    wl = _llama_8b_8k(16)
    bad, _ = one(wl, fsdp="hybrid", fsdp_shard=3)
    assert not bad.valid[0] and "fsdp_shard=3" in bad.reason[0]
    odd, _ = one(wl, fsdp="zero3")
    assert not odd.valid[0] and "fsdp must be" in odd.reason[0]


def test_fsdp_without_resharding_keeps_the_gathered_weights():
    wl = _llama_8b_8k(8)
    resharded, _ = one(wl, fsdp="full", recompute="selective")
    kept, _ = one(wl, fsdp="full", recompute="selective", fsdp_reshard_after_forward=False)
    assert kept.memory["weights"][0] > resharded.memory["weights"][0] + 10 * 2**30
    assert kept.breakdown["dp_comm"][0] <= resharded.breakdown["dp_comm"][0]

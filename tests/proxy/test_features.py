"""Features: a pure, vectorised function with fixed columns and hand-checkable arithmetic."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from cubic.proxy.features import (
    DLRM_DEFAULTS,
    LLM_DEFAULTS,
    LOSSY_CODEC_HBM_SHARE,
    OFFSET,
    ROOFLINE_PEAK_SHARE,
    TP_OVERLAP_EXPOSED,
    feature_names,
    featurize,
    lossy_ratio,
)
from cubic.sim import dlrm as sim_dlrm
from cubic.sim import llm as sim_llm
from cubic.workload import DLRM, LLM, PRESETS, Cluster, EmbeddingTable, Training, Workload
from tests.proxy.simdata import space

TINY_LLM = Workload(
    "tiny",
    LLM(
        "tiny",
        layers=4,
        hidden=1024,
        heads=8,
        kv_heads=8,
        ffn=4096,
        vocab=32000,
        seq_len=2048,
        gated_mlp=False,
    ),
    Cluster("h100_sxm", 8, 8),
    Training(global_batch=16),
)
TOY_DLRM = Workload(
    "toy",
    DLRM(
        "toy",
        (
            EmbeddingTable("big", 2_000_000, 64, 2.0),
            EmbeddingTable("mid", 20_000, 64),
            EmbeddingTable("tiny", 100, 64),
        ),
        bottom_mlp=(128, 64),
        top_mlp=(128, 1),
    ),
    Cluster("h100_sxm", 8, 8),
    Training(global_batch=8192, optimizer="sgd"),
)


def _row(wl: Workload, config: dict) -> dict[str, float]:
    return dict(zip(feature_names(wl.kind), featurize(wl, [config])[0], strict=True))


@pytest.mark.parametrize("kind", ["llm", "dlrm"])
def test_names_match_the_matrix_and_are_unique(kind: str) -> None:
    wl = PRESETS["llama3_70b" if kind == "llm" else "dlrm_criteo_dcnv2"]
    configs = space(kind).sample(np.random.default_rng(0), 50, wl.context())
    X = featurize(wl, configs)
    names = feature_names(kind)
    assert X.shape == (50, len(names))
    assert len(set(names)) == len(names)
    assert OFFSET in names
    assert np.all(np.isfinite(X))


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload kind"):
        feature_names("cnn")


@pytest.mark.parametrize("preset", ["llama3_70b", "dlrm_criteo_dcnv2"])
def test_pure_deterministic_and_vectorised(preset: str) -> None:
    wl = PRESETS[preset]
    sp = space(wl.kind)
    configs = sp.sample(np.random.default_rng(1), 200, wl.context())
    before = copy.deepcopy(configs)
    X1 = featurize(wl, configs)
    X2 = featurize(wl, configs)
    assert configs == before  # inputs untouched
    np.testing.assert_array_equal(X1, X2)
    # A dict of arrays gives the same matrix as a list of dicts.
    np.testing.assert_array_equal(featurize(wl, sp.to_arrays(configs)), X1)
    # Each row depends on its own configuration only.
    np.testing.assert_array_equal(featurize(wl, configs[7:8])[0], X1[7])


def test_missing_knobs_take_the_defaults() -> None:
    for wl, defaults in ((TINY_LLM, LLM_DEFAULTS), (TOY_DLRM, DLRM_DEFAULTS)):
        np.testing.assert_array_equal(featurize(wl, [{}]), featurize(wl, [dict(defaults)]))
        none = dict.fromkeys(defaults)
        np.testing.assert_array_equal(featurize(wl, [none]), featurize(wl, [dict(defaults)]))


def test_defaults_agree_with_the_simulators() -> None:
    for ours, theirs in ((LLM_DEFAULTS, sim_llm.DEFAULTS), (DLRM_DEFAULTS, sim_dlrm.DEFAULTS)):
        for k, v in ours.items():
            if theirs.get(k) is not None:
                assert theirs[k] == v, k


def test_one_hot_encoding() -> None:
    rows = [_row(TINY_LLM, {"recompute": r}) for r in ("none", "selective", "full", "bogus")]
    got = [[r[f"recompute_{c}"] for c in ("none", "selective", "full")] for r in rows]
    assert got == [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]]
    wl = PRESETS["dlrm_criteo_dcnv2"]
    X = featurize(wl, space("dlrm").sample(np.random.default_rng(2), 100, wl.context()))
    names = feature_names("dlrm")
    for prefix in (
        "sharding_large_",
        "sharding_medium_",
        "sharding_small_",
        "placement_large_",
        "a2a_",
    ):
        cols = [
            i
            for i, n in enumerate(names)
            if n.startswith(prefix) and n not in ("a2a_bytes_per_element", "a2a_bytes_per_sample")
        ]
        np.testing.assert_array_equal(X[:, cols].sum(axis=1), 1.0)
    r = _row(TOY_DLRM, {"sharding_large": "column_wise", "a2a_precision": "bf16"})
    assert r["sharding_large_column_wise"] == 1 and r["sharding_large_row_wise"] == 0
    assert r["a2a_bf16"] == 1 and r["a2a_fp16"] == 0 and r["a2a_bytes_per_element"] == 2


def test_booleans_and_log_sizes() -> None:
    r = _row(
        TINY_LLM,
        {
            "tp": 2,
            "pp": 2,
            "micro_batch": 4,
            "sequence_parallel": True,
            "fp8_qkv": True,
            "fp8_mlp_in": 1,
            "fp8_lm_head": "false",
        },
    )
    assert (r["log2_tp"], r["log2_pp"], r["log2_micro_batch"], r["log2_dp"]) == (1, 1, 2, 1)
    assert (r["sequence_parallel"], r["fp8_qkv"], r["fp8_mlp_in"], r["fp8_lm_head"]) == (1, 1, 1, 0)
    assert r["fp8_sites"] == 2
    # Sequence parallelism does not exist without tensor parallelism.
    assert _row(TINY_LLM, {"tp": 1, "sequence_parallel": True})["sequence_parallel"] == 0


def test_llm_derived_quantities_by_hand() -> None:
    """tp=2, pp=2 on 8 GPUs: dp=2, 4 micro-batches of 2 x 2048 tokens, ZeRO-1."""
    r = _row(
        TINY_LLM,
        {
            "tp": 2,
            "pp": 2,
            "cp": 1,
            "micro_batch": 2,
            "zero_stage": 1,
            "recompute": "none",
            "sequence_parallel": True,
        },
    )
    assert r["log2_dp"] == 1
    assert r["log2_microbatches"] == 2
    assert r["bubble_fraction"] == pytest.approx(0.25)
    assert r["log2_gemm_tokens_x_hidden"] == 21  # 4096 tokens x 1024 / 2
    # Per layer: attention 4 h^2 (kv = h), MLP 2 h f, norms 4 h; 2 layers per stage, split by
    # tp, plus the embedding (one per stage with pipelining) split by tp.
    per_layer = 4 * 1024**2 + 2 * 1024 * 4096 + 4 * 1024
    params = 2 * per_layer / 2 + 32000 * 1024 / 2
    assert params == 28_971_008
    assert r["log10_params_per_gpu"] == pytest.approx(math.log10(params))
    state = params * (2 + 4 + 12 / 2)  # weights, grads, Adam state sharded over dp=2
    assert r["state_gb"] == pytest.approx(state / 1e9)
    act_mb = 34 * 4096 * 1024 / 2 * 2  # 34 s b h / t per layer, 2 layers
    assert r["activation_gb_per_microbatch"] == pytest.approx(act_mb / 1e9)
    act_peak = act_mb * 2  # the first stage holds min(pp, m) = 2 micro-batches
    logits = 6 * 4096 * 32000 / 2
    memory = state + act_peak + logits
    assert r["memory_gb"] == pytest.approx(memory / 1e9)
    assert r["memory_ratio"] == pytest.approx(memory / (80 * 2**30))
    active = 4 * (4 * 1024**2 + 2 * 1024 * 4096) + 32000 * 1024
    flops = (6 * active + 6 * 4 * 2048 * 1024) * 16 * 2048 / 8
    assert r["log10_flops_per_gpu"] == pytest.approx(math.log10(flops))
    act_bytes = 2 * 4096 * 1024
    tp_bytes = 2 * (2 - 1) / 2 * act_bytes * 4 * 2 * 4  # 4 all-reduces x 2 layers x 4 mb
    pp_bytes = 2 * act_bytes / 2 * 4  # activation and gradient per micro-batch, split by sp
    dp_bytes = 0.5 * params * 4 + 0.5 * params * 2  # reduce-scatter grads, gather weights
    assert r["log10_tp_bytes"] == pytest.approx(math.log10(tp_bytes))
    assert r["log10_pp_bytes"] == pytest.approx(math.log10(pp_bytes))
    assert r["log10_dp_bytes"] == pytest.approx(math.log10(dp_bytes))
    assert r["log10_cp_bytes"] == 0
    # Every group fits in one node: NVLink everywhere; nothing asks to overlap. The compute
    # runs at half of BF16 peak, at the pace of the last stage (2 layers and the LM head).
    compute = flops / (989.4e12 * ROOFLINE_PEAK_SHARE)
    per_token = 6 * active + 6 * 4 * 2048 * 1024
    head = 6 * 32000 * 1024
    last = 2 * (per_token - head) / 4 + head
    step = compute * (2 * last / per_token + 0.25) + (tp_bytes + pp_bytes + dp_bytes) / 450e9
    assert r[OFFSET] == pytest.approx(math.log(16 * 2048 / step))
    assert r["log_serial_throughput"] == pytest.approx(r[OFFSET])


def test_attention_stays_bf16_and_selective_recompute_reruns_it() -> None:
    """FP8 sites speed up the weight GEMMs only: with every site in FP8 the compute is the
    GEMMs at the FP8 peak plus the attention core at the BF16 peak; selective recompute
    adds a third of the attention core, full recompute a third of everything."""
    base = {"tp": 1, "pp": 1, "cp": 1, "micro_batch": 2, "zero_stage": 1, "recompute": "none"}
    on = {k: True for k in ("fp8_qkv", "fp8_attn_out", "fp8_mlp_in", "fp8_mlp_out")}
    wl = TINY_LLM  # on H100: FP8 at twice the BF16 peak
    plain = _row(wl, base)
    fp8 = _row(wl, {**base, **on, "fp8_lm_head": True})
    attn = 6 * 4 * 2048 * 1024 * 16 * 2048 / 8
    flops = 10 ** plain["log10_flops_per_gpu"]
    bf16 = 10 ** plain["log10_compute_s"]
    assert bf16 == pytest.approx(flops / (989.4e12 * ROOFLINE_PEAK_SHARE))
    expect = ((flops - attn) / 1978.9e12 + attn / 989.4e12) / ROOFLINE_PEAK_SHARE
    assert 10 ** fp8["log10_compute_s"] == pytest.approx(expect, rel=1e-6)
    sel = _row(wl, {**base, "recompute": "selective"})
    assert 10 ** sel["log10_compute_s"] == pytest.approx(
        bf16 + attn / 3 / (989.4e12 * ROOFLINE_PEAK_SHARE)
    )
    full = _row(wl, {**base, "recompute": "full"})
    assert 10 ** full["log10_compute_s"] == pytest.approx(bf16 * 4 / 3)


def test_overlap_only_lowers_the_roofline() -> None:
    base = {"tp": 2, "pp": 1, "zero_stage": 1, "sequence_parallel": True}
    plain = _row(TINY_LLM, base)
    ovl = _row(
        TINY_LLM,
        {
            **base,
            "tp_comm_overlap": True,
            "overlap_grad_reduce": True,
            "overlap_param_gather": True,
        },
    )
    assert ovl[OFFSET] > plain[OFFSET]
    assert ovl["log_serial_throughput"] == plain["log_serial_throughput"]


def test_overlapped_tp_traffic_keeps_a_share_exposed() -> None:
    """Behind GEMMs far longer than it, overlapped TP traffic still costs its exposed share."""
    base = {"tp": 2, "pp": 1, "zero_stage": 1, "sequence_parallel": True}
    plain = _row(TINY_LLM, base)
    ovl = _row(TINY_LLM, {**base, "tp_comm_overlap": True})
    tokens = 16 * 2048
    tp_s = 10 ** plain["log10_tp_s"]
    # Model seconds of the roofline, not a timing: the GEMMs are long enough to hide it all.
    assert tp_s < 10 ** plain["log10_compute_s"]
    saved = tokens / np.exp(plain[OFFSET]) - tokens / np.exp(ovl[OFFSET])
    assert saved == pytest.approx((1.0 - TP_OVERLAP_EXPOSED) * tp_s)


def test_dlrm_derived_quantities_by_hand() -> None:
    r = _row(
        TOY_DLRM,
        {
            "sharding_large": "row_wise",
            "sharding_medium": "table_wise",
            "sharding_small": "data_parallel",
            "placement_large": "cached",
            "cache_load_factor": 0.1,
            "a2a_precision": "fp16",
            "batch_per_gpu": 1024,
        },
    )
    big = 2_000_000 * 64 * 4  # SGD keeps no state per row
    assert r["emb_gb_large"] == pytest.approx(big / 8 * 0.1 / 1e9)  # row-wise, 10 % cached
    assert r["emb_gb_medium"] == pytest.approx(20_000 * 64 * 4 / 1e9)  # one whole table
    assert r["emb_gb_small"] == pytest.approx(100 * 64 * 4 / 1e9)  # replicated
    assert r["hbm_fraction_large"] == pytest.approx(0.1)
    assert r["host_gb_per_node"] == pytest.approx(big / 1e9)
    assert r["a2a_bytes_per_element"] == 2
    # Row-wise: partial sums for the other 7 ranks' samples; table-wise: own samples.
    a2a = 2 * (2 * 64 * 1024 * 7 + 2 * 64 * 1024)
    assert r["a2a_bytes_per_sample"] == pytest.approx(a2a / 1024)
    assert r["log2_batch_per_gpu"] == 10
    assert r["lookups_per_sample"] == 4


def test_lossy_all_to_all_bytes() -> None:
    for bound, ratio in ((1e-3, 4.0), (5e-2, 10.0)):
        assert lossy_ratio(np.array([bound]))[0] == pytest.approx(ratio)
        r = _row(TOY_DLRM, {"a2a_precision": "lossy", "lossy_error_bound": bound})
        assert r["a2a_bytes_per_element"] == pytest.approx(4.0 / ratio)
        assert r["log10_lossy_error_bound"] == pytest.approx(math.log10(bound))
    # The space's placeholder bound (0.0 when not lossy) does not matter.
    assert _row(TOY_DLRM, {"lossy_error_bound": 0.0}) == _row(TOY_DLRM, {})
    # An adaptive bound is its own column, and only with a lossy exchange.
    adaptive = {"a2a_precision": "lossy", "lossy_adaptive": True}
    assert _row(TOY_DLRM, adaptive)["lossy_adaptive"] == 1
    assert _row(TOY_DLRM, {**adaptive, "lossy_adaptive": False})["lossy_adaptive"] == 0
    assert _row(TOY_DLRM, {"a2a_precision": "fp16", "lossy_adaptive": True})["lossy_adaptive"] == 0


def test_the_exchange_codec_is_a_memory_bound_pass_on_the_roofline() -> None:
    """Encoding below fp32 reads 4 bytes and writes q per element, decoding the reverse, at
    HBM bandwidth; on one NVLink node with the exchange pipelined behind the dense part that
    pass is all the lower precision costs, so fp32 has the higher roofline."""
    one_node = replace(PRESETS["dlrm_criteo_dot"], cluster=Cluster("a100_80gb", 8, 8))
    base = {"batch_per_gpu": 16384, "pipeline_sparse": True, "sharding_large": "table_wise"}
    fp32 = _row(one_node, {**base, "a2a_precision": "fp32"})
    assert fp32["log10_codec_s"] == _row(one_node, base)["log10_codec_s"]
    hbm = one_node.gpu.hbm_gbs * 1e9
    for precision, q in (("fp16", 2.0), ("fp8", 1.0)):
        r = _row(one_node, {**base, "a2a_precision": precision})
        elements = 10 ** r["log10_a2a_bytes"] / q
        assert 10 ** r["log10_codec_s"] == pytest.approx(elements * 2 * (4 + q) / hbm)
        assert r[OFFSET] < fp32[OFFSET]
    # Across nodes, with the exchange in the open, the bytes saved outweigh the pass.
    wide = replace(one_node, cluster=Cluster("a100_80gb", 64, 8))
    serial = {**base, "pipeline_sparse": False}
    assert (
        _row(wide, {**serial, "a2a_precision": "fp8"})[OFFSET]
        > _row(wide, {**serial, "a2a_precision": "fp32"})[OFFSET]
    )


def test_a_lossy_codec_runs_at_its_compressors_throughput() -> None:
    """An error-bounded compressor is no cast: its pass over the fp32 side runs at a share
    of HBM bandwidth, so at the same bytes on the wire a lossy exchange costs more codec
    time than a cast would, and on a node where fp8 beats fp32 lossy does not."""
    wide = replace(PRESETS["dlrm_criteo_dot"], cluster=Cluster("a100_80gb", 64, 8))
    base = {"batch_per_gpu": 16384, "pipeline_sparse": True, "sharding_large": "table_wise"}
    lossy = _row(wide, {**base, "a2a_precision": "lossy", "lossy_error_bound": 1e-3})
    q = 4.0 / lossy_ratio(np.array([1e-3]))[0]
    elements = 10 ** lossy["log10_a2a_bytes"] / q
    hbm = wide.gpu.hbm_gbs * 1e9
    codec = 10 ** lossy["log10_codec_s"]
    assert codec == pytest.approx(elements * 2 * 4 / (LOSSY_CODEC_HBM_SHARE * hbm))
    assert codec > elements * 2 * (4 + q) / hbm
    fp8 = _row(wide, {**base, "a2a_precision": "fp8"})
    assert fp8[OFFSET] > lossy[OFFSET]


def test_features_do_not_depend_on_the_simulator() -> None:
    code = (
        "import sys, cubic.proxy; "
        "print(sorted(m for m in sys.modules if m.startswith('cubic.sim')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_numerics_are_the_reduced_precision_sites() -> None:
    from cubic.proxy.features import numerics, numerics_names

    wl = PRESETS["dlrm_criteo_dot"]
    configs = [
        {"a2a_precision": "fp32"},
        {"a2a_precision": "fp8", "fp8_bottom_mlp": True},
        {"a2a_precision": "lossy", "lossy_error_bound": 0.05},
        {"a2a_precision": "lossy", "lossy_error_bound": 0.01},
    ]
    n = numerics(wl, configs)
    names = numerics_names("dlrm")
    assert n.shape == (4, len(names)) and np.all(n >= 0)
    assert not n[0].any()
    assert n[1, names.index("a2a_fp8")] == 1 and n[1, names.index("fp8_bottom_mlp")] == 1
    # A lossy exchange enters with its bound, so a cost learned at one bound scales to another.
    lossy = names.index("a2a_lossy_bound")
    assert n[2, lossy] == pytest.approx(5 * n[3, lossy]) and n[2].sum() == n[2, lossy]
    llm = numerics(TINY_LLM, [{"fp8_qkv": True, "fp8_lm_head": True}, {}])
    assert llm.tolist() == [[1, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    with pytest.raises(ValueError):
        numerics_names("cnn")


def test_a_sites_format_sets_its_roofline_and_its_error_column() -> None:
    """On a B200 a GEMM site's format moves the roofline to its format's peak and its
    numerics column to its relative error; ``mlp_in_format: fp8`` is the FP8 switch."""
    from cubic.proxy.features import numerics

    wl = replace(TINY_LLM, cluster=Cluster("b200", 8, 8))
    rows = [
        {},
        {"fp8_mlp_in": True},
        {"mlp_in_format": "fp8"},
        {"mlp_in_format": "mxfp8"},
        {"mlp_in_format": "mxfp4"},
        {"mlp_in_format": "mxfp4", "mxfp4_error_reduction": True},
    ]
    X = featurize(wl, rows)
    names = feature_names("llm")
    roof = X[:, names.index(OFFSET)]
    assert roof[0] < roof[1] == roof[2] == roof[3] < roof[5] < roof[4]
    assert X[:, names.index("fp8_sites")].tolist() == [0, 1, 1, 0, 0, 0]
    col = numerics(wl, rows)[:, 2]  # fp8_mlp_in's column: the site's error
    assert col.tolist() == pytest.approx([0.0, 1.0, 1.0, 1.0, 6.0, 4.4])


def _memory(wl: Workload, configs: list[dict]) -> np.ndarray:
    return featurize(wl, configs)[:, feature_names("llm").index("memory_ratio")]


def test_the_memory_arithmetic_sizes_the_busiest_rank_of_an_uneven_split():
    """Llama 3.1 405B over 16 stages with the embedding and loss in the split: 8 layers on a
    middle rank, 7 and the embedding on the first; the estimate follows the simulator."""
    wl = replace(PRESETS["llama3_405b"], cluster=Cluster("h100_sxm", 512, 8))
    cfg = {"tp": 4, "pp": 16, "cp": 4, "sequence_parallel": True, "recompute": "none"}
    uneven = {**cfg, "embedding_loss_in_split": True}
    est = _memory(wl, [uneven])[0]
    sim = sim_llm.simulate_llm(wl, [uneven])
    truth = sim.peak_memory[0] / wl.gpu.hbm_bytes
    assert abs(est / truth - 1.0) < 0.06
    # The whole-model average (126 / 16 layers plus the embedding on every rank) is higher.
    assert est < _memory(wl, [{**cfg, "pp": 1}])[0]


def test_an_fp8_gemm_keeps_its_input_for_backward_in_one_byte() -> None:
    """The QKV, MLP-in and MLP-out GEMMs in FP8 save their inputs as the cast copy: per token
    and layer h / t, h / t and f / t bytes fewer with sequence parallelism (the attention
    output stays BF16). Under full recompute the layers in flight keep only their input,
    whatever the sites."""
    h100 = replace(TINY_LLM, cluster=Cluster("h100_sxm", 8, 8))
    base = {"tp": 2, "pp": 2, "micro_batch": 2, "sequence_parallel": True, "recompute": "none"}
    off = {f"fp8_{k}": False for k in ("qkv", "attn_out", "mlp_in", "mlp_out", "lm_head")}
    bf16 = _row(h100, {**base, **off})
    fp8 = _row(h100, {**base, **off, "fp8_qkv": True, "fp8_mlp_in": True, "fp8_mlp_out": True})
    attn = _row(h100, {**base, **off, "fp8_attn_out": True})
    tokens, layers = 2 * 2048, 2
    saved = tokens * layers * (1024 / 2 + 1024 / 2 + 4096 / 2)
    diff = bf16["activation_gb_per_microbatch"] - fp8["activation_gb_per_microbatch"]
    assert diff == pytest.approx(saved / 1e9)
    assert attn["activation_gb_per_microbatch"] == bf16["activation_gb_per_microbatch"]
    assert fp8["memory_gb"] < bf16["memory_gb"]
    full = {**base, "recompute": "full"}
    kept = [
        _row(h100, {**full, **off, "fp8_mlp_out": on})["activation_gb_per_microbatch"]
        for on in (True, False)
    ]
    assert kept[0] == pytest.approx(kept[1])


def test_the_memory_arithmetic_knows_fsdp_shards_every_byte_of_state():
    wl = replace(PRESETS["llama3_8b"], cluster=Cluster("h100_sxm", 8, 8))
    ddp, full, hybrid = _memory(
        wl,
        [
            {"zero_stage": 0, "recompute": "full"},
            {"fsdp": "full", "recompute": "full"},
            {"fsdp": "hybrid", "fsdp_shard": 2, "recompute": "full"},
        ],
    )
    assert full < hybrid < ddp
    sim = sim_llm.simulate_llm(wl, [{"fsdp": "full", "recompute": "full"}])
    assert abs(full / (sim.peak_memory[0] / wl.gpu.hbm_bytes) - 1.0) < 0.25

"""Features of (workload, configuration) pairs for the proxy models.

:func:`featurize` is a pure, vectorised function: the same inputs always give the same
matrix, and nothing is measured or simulated. The columns are fixed per workload kind
(:func:`feature_names`), so one model learns from every study of that kind and transfers
across models, GPUs and cluster sizes. Three groups of columns:

* the knobs: log2 of parallel degrees and sizes, one-hot string choices, booleans as 0/1;
* the workload: model shape, cluster size and the GPU's published peaks and bandwidths;
* bookkeeping derived from both with a few lines of arithmetic each (bytes per GPU against
  HBM, bytes moved per step per parallel dimension, FLOPs per GPU, the pipeline bubble) and
  the roofline they imply: the throughput if every GEMM ran at peak (for an LLM, at the
  share of peak large runs publish, :data:`ROOFLINE_PEAK_SHARE`) and every transfer ran
  at link speed, hidden only where the configuration asks for overlap. These are counts
  and published figures, not a performance model: nothing is fitted to the studies or to
  the simulator. They let trees split on the quantities an engineer reasons with ("does it
  fit?", "how much goes over the NIC?") instead of rediscovering products of knobs from a
  few dozen trials.

Knobs a configuration leaves out (or sets to None) take :data:`LLM_DEFAULTS` or
:data:`DLRM_DEFAULTS`; an unknown string value gets an all-zero one-hot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cubic.formats import (
    BF16,
    ERROR_REDUCTION_KNOB,
    FORMATS,
    FP8,
    MXFP4_ER,
    MXFP4_ER_GEMM_OVERHEAD,
    format_knob,
    site_codes,
)
from cubic.formats import error as format_error
from cubic.pipeline import activation_layers, stage_layers
from cubic.workload import DLRM, LLM, Workload

Configs = Mapping[str, Any] | Sequence[Mapping[str, Any]]

FP8_SITES = ("fp8_qkv", "fp8_attn_out", "fp8_mlp_in", "fp8_mlp_out", "fp8_lm_head")
#: Megatron-Core's defaults for knobs a configuration does not name.
LLM_DEFAULTS: dict[str, Any] = {
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "vp": 1,
    "ep": 1,
    "micro_batch": 1,
    "zero_stage": 1,
    "recompute": "none",
    "sequence_parallel": False,
    "tp_comm_overlap": False,
    "overlap_grad_reduce": False,
    "overlap_param_gather": False,
    "fp8_qkv": False,
    "fp8_attn_out": False,
    "fp8_mlp_in": False,
    "fp8_mlp_out": False,
    "fp8_lm_head": False,
    # A site's format knob (None: its FP8 switch decides) and MXFP4 error reduction.
    **{format_knob(k): None for k in FP8_SITES},
    ERROR_REDUCTION_KNOB: False,
    "first_stage_layers": None,
    "last_stage_layers": None,
    "embedding_loss_in_split": False,
    "fsdp": "none",
    "fsdp_shard": None,
}
#: TorchRec's usual choices for knobs a configuration does not name.
DLRM_DEFAULTS: dict[str, Any] = {
    "sharding_large": "row_wise",
    "sharding_medium": "table_wise",
    "sharding_small": "data_parallel",
    "placement_large": "hbm",
    "cache_load_factor": 0.2,
    "a2a_precision": "fp32",
    "lossy_error_bound": 1e-3,
    "lossy_adaptive": False,
    "batch_per_gpu": 4096,
    "fp8_bottom_mlp": False,
    "fp8_top_mlp": False,
    "fp8_interaction": False,
    "pipeline_sparse": False,
    "allow_tf32": False,
}

RECOMPUTE = ("none", "selective", "full")
LLM_BOOLS = (
    "sequence_parallel",
    "tp_comm_overlap",
    "overlap_grad_reduce",
    "overlap_param_gather",
    *FP8_SITES,
)
SHARDINGS = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
PLACEMENTS = ("hbm", "host", "cached")
A2A_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "lossy")
A2A_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
DLRM_BOOLS = ("fp8_bottom_mlp", "fp8_top_mlp", "fp8_interaction", "pipeline_sparse", "allow_tf32")
TABLE_CLASSES = ("large", "medium", "small")
#: Table classes by rows, as the DLRM search space names them.
LARGE_ROWS, MEDIUM_ROWS = 1_000_000, 10_000
#: TorchRec's column-wise shard width.
CW_SHARD_DIM = 32
#: Optimizer state bytes per parameter: fp32 master weights plus moments (ZeRO paper; SGD
#: with momentum).
OPT_STATE_BYTES = {"adam": 12.0, "adagrad": 8.0, "rowwise_adagrad": 4.0, "sgd": 8.0}
#: Sparse optimizer state bytes per embedding element (row-wise Adagrad: one per row, ~0).
EMB_STATE_BYTES = {"adam": 8.0, "adagrad": 4.0, "rowwise_adagrad": 0.0, "sgd": 0.0}
#: Column the models learn relative to: log of the roofline throughput (below). Learning
#: log(throughput / roofline), an efficiency, is what transfers across workloads and makes
#: a few dozen trials enough to rank configurations.
OFFSET = "log_roofline_throughput"
#: The share of peak the roofline's compute runs at. At peak, transfers that overlap the
#: compute look exposed where in practice they hide (compute takes two to three times
#: longer than at peak), and the roofline overrated every config that does not overlap.
#: Large training runs reach about half of peak: Llama 3 405B 38-43 % BF16 MFU on 8,192
#: to 16,384 H100s (Dubey et al. 2024, table 4); Megatron-LM 41-48 % on H100 (its README).
ROOFLINE_PEAK_SHARE = 0.5
#: Of the tensor-parallel traffic a configuration overlaps with its GEMMs (userbuffers), the
#: share that stays exposed however long the GEMMs run: the first chunk of each decomposed
#: collective has nothing to hide behind, and the GEMMs beside the rest lose the SMs its
#: kernels hold. An assumption, not a published figure: taken as free, overlapped TP traffic
#: rated tp = 8 layouts above the tp = 4 ones with context parallelism that run faster.
TP_OVERLAP_EXPOSED = 0.25

_WORKLOAD_COMMON = (
    "log2_num_gpus",
    "gpus_per_node",
    "log2_nodes",
    "log2_global_batch",
    "peak_bf16_tflops",
    "peak_fp8_tflops",
    "has_fp8",
    "hbm_gb",
    "hbm_tbs",
    "nvlink_gbs",
    "nic_gbs",
    "pcie_gbs",
    "opt_state_bytes",
    "training_fp32",
    "log_peak_throughput",
)
_LLM_NAMES = (
    "log2_tp",
    "log2_pp",
    "log2_cp",
    "log2_vp",
    "log2_ep",
    "log2_dp",
    "log2_micro_batch",
    "zero_stage",
    *(f"recompute_{r}" for r in RECOMPUTE),
    *LLM_BOOLS,
    "fp8_sites",
    "log10_params",
    "log10_active_params",
    "layers",
    "log2_hidden",
    "log2_ffn",
    "heads",
    "kv_heads",
    "log2_seq_len",
    "log2_vocab",
    "experts",
    "top_k",
    "gated_mlp",
    *_WORKLOAD_COMMON,
    "log2_microbatches",
    "bubble_fraction",
    "log2_gemm_tokens_x_hidden",
    "log10_flops_per_gpu",
    "fp8_flop_share",
    "log10_params_per_gpu",
    "state_gb",
    "activation_gb_per_microbatch",
    "activation_gb_peak",
    "memory_gb",
    "memory_ratio",
    "state_ratio",
    "activation_ratio",
    "log10_tp_bytes",
    "log10_cp_bytes",
    "log10_pp_bytes",
    "log10_dp_bytes",
    "dp_crosses_nodes",
    "pp_crosses_nodes",
    "log10_compute_s",
    "log10_tp_s",
    "log10_cp_s",
    "log10_pp_s",
    "log10_dp_grad_s",
    "log10_dp_param_s",
    "comm_to_compute",
    "log_serial_throughput",
    OFFSET,
)
_DLRM_NAMES = (
    *(f"sharding_{c}_{s}" for c in TABLE_CLASSES for s in SHARDINGS),
    *(f"placement_large_{p}" for p in PLACEMENTS),
    "hbm_fraction_large",
    *(f"a2a_{p}" for p in A2A_PRECISIONS),
    "log10_lossy_error_bound",
    "lossy_adaptive",
    "a2a_bytes_per_element",
    "log2_batch_per_gpu",
    *DLRM_BOOLS,
    "num_tables",
    "embedding_dim",
    "log10_embedding_params",
    "log10_dense_params",
    "log10_dense_flops_per_sample",
    "dcnv2",
    "lookups_per_sample",
    *_WORKLOAD_COMMON,
    *(f"emb_gb_{c}" for c in TABLE_CLASSES),
    "emb_hbm_gb",
    "host_gb_per_node",
    "lookup_imbalance",
    "log10_a2a_bytes",
    "a2a_bytes_per_sample",
    "log10_allreduce_bytes",
    "log10_host_lookup_bytes",
    "log10_dense_flops_per_gpu",
    "fp8_dense_share",
    "memory_gb",
    "memory_ratio",
    "log10_compute_s",
    "log10_a2a_s",
    "log10_codec_s",
    "log10_host_lookup_s",
    "log10_allreduce_s",
    "log10_lookup_s",
    "comm_to_compute",
    "log_serial_throughput",
    OFFSET,
)


def _for_kind(kind: str, llm: tuple[str, ...], dlrm: tuple[str, ...]) -> list[str]:
    if kind not in ("llm", "dlrm"):
        raise ValueError(f"unknown workload kind {kind!r}; expected 'llm' or 'dlrm'")
    return list(llm if kind == "llm" else dlrm)


def feature_names(kind: str) -> list[str]:
    """Ordered column names of :func:`featurize` for a workload kind ('llm' or 'dlrm')."""
    return _for_kind(kind, _LLM_NAMES, _DLRM_NAMES)


#: The columns a config's memory depends on (its layout and the estimate's terms), not how
#: fast it runs: a job's reported peak tells about configs close in these, whatever their
#: overlap flags or communication.
_LLM_MEMORY = (
    *(
        n
        for n in _LLM_NAMES[: _LLM_NAMES.index("fp8_sites") + 1]
        if n not in ("tp_comm_overlap", "overlap_grad_reduce")
    ),
    "log2_microbatches",
    *_LLM_NAMES[_LLM_NAMES.index("state_gb") : _LLM_NAMES.index("activation_ratio") + 1],
)
_DLRM_MEMORY = (
    *_DLRM_NAMES[: _DLRM_NAMES.index("log2_batch_per_gpu") + 1],
    "pipeline_sparse",
    *(f"emb_gb_{c}" for c in TABLE_CLASSES),
    "emb_hbm_gb",
    "memory_gb",
    "memory_ratio",
)


#: The knobs' own columns (log2 degrees, one-hot choices, switches), before the workload's
#: and the arithmetic's: where a knob's effect is additive enough to carry across layouts.
_LLM_KNOBS = _LLM_NAMES[: _LLM_NAMES.index("fp8_sites") + 1]
_DLRM_KNOBS = _DLRM_NAMES[: _DLRM_NAMES.index("allow_tf32") + 1]


def knob_columns(kind: str) -> np.ndarray:
    """Indices (into :func:`feature_names`) of the knobs' own columns."""
    names = feature_names(kind)
    return np.array([names.index(n) for n in _for_kind(kind, _LLM_KNOBS, _DLRM_KNOBS)])


def memory_columns(kind: str) -> np.ndarray:
    """Indices (into :func:`feature_names`) of the columns memory depends on."""
    names = feature_names(kind)
    return np.array([names.index(n) for n in _for_kind(kind, _LLM_MEMORY, _DLRM_MEMORY)])


def knows_knobs(kind: str, names: Sequence[str]) -> bool:
    """Whether a space names any knob of the kind's vocabulary: only then do the features'
    arithmetic (memory, bytes moved) say anything about its configs."""
    defaults = LLM_DEFAULTS if kind == "llm" else DLRM_DEFAULTS
    return any(n in defaults for n in names)


def hardware_ok(workload: Workload, X: np.ndarray, configs: Configs | None = None) -> np.ndarray:
    """Whether each config (feature rows ``X``) uses only what the GPU has: no FP8 GEMM
    site on a GPU without FP8 tensor cores (the DLRM's FP8 sites fall back to BF16) and,
    given the ``configs`` themselves, no LLM GEMM site in a block-scaled format it lacks."""
    names = feature_names(workload.kind)
    ok = np.ones(len(X), dtype=bool)
    if not workload.gpu.has_fp8 and "fp8_sites" in names:
        ok &= X[:, names.index("fp8_sites")] == 0
    lacking = [i for i, f in enumerate(FORMATS) if f.block and f.rate not in workload.gpu.formats]
    if configs is not None and workload.kind == "llm" and lacking:
        needed = (*FP8_SITES, *(format_knob(k) for k in FP8_SITES), ERROR_REDUCTION_KNOB)
        cols, _ = _columns(configs, {k: LLM_DEFAULTS[k] for k in needed})
        code = _site_codes(cols, {k: _bool(cols[k]) for k in FP8_SITES})
        for c in code.values():
            ok &= ~np.isin(c, lacking)
    return ok


def featurize(workload: Workload, configs: Configs) -> np.ndarray:
    """Feature matrix (n_configs x len(feature_names(kind))) of ``configs`` on ``workload``.

    ``configs`` is a list of dicts or a mapping of knob -> equal-length sequence (scalars
    broadcast). Float64, finite everywhere, even for configurations that cannot run.
    """
    model = workload.model
    defaults = LLM_DEFAULTS if isinstance(model, LLM) else DLRM_DEFAULTS
    cols, n = _columns(configs, defaults)
    if isinstance(model, LLM):
        feats = _llm(workload, model, cols, n)
    elif isinstance(model, DLRM):
        feats = _dlrm(workload, model, cols, n)
    else:  # pragma: no cover - Workload only holds these two
        raise TypeError(f"unsupported model {type(model).__name__}")
    names = feature_names(workload.kind)
    out = np.empty((n, len(names)))
    for j, name in enumerate(names):
        out[:, j] = feats[name]
    return np.nan_to_num(out, nan=0.0, posinf=1e30, neginf=-1e30)


# -- input handling -------------------------------------------------------------------------


def _columns(configs: Configs, defaults: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """One object array per knob; missing knobs and None take ``defaults``."""
    if isinstance(configs, Mapping):
        lengths = {
            len(v) for v in configs.values() if not isinstance(v, str | bytes) and np.ndim(v) > 0
        }
        if len(lengths) > 1:
            raise ValueError(f"configs: knobs have different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else 1

        def column(k: str) -> np.ndarray:
            v = configs.get(k)
            if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "biufU":
                return v  # typed arrays hold no None
            out = np.empty(n, dtype=object)
            if v is None or isinstance(v, str | bytes) or np.ndim(v) == 0:
                out[:] = [v] * n
            else:
                out[:] = list(v)
            return out
    else:
        rows = list(configs)
        n = len(rows)

        def column(k: str) -> np.ndarray:
            out = np.empty(n, dtype=object)
            out[:] = [r.get(k) for r in rows]
            return out

    cols = {}
    for k, d in defaults.items():
        c = column(k)
        if c.dtype == object:
            c[np.equal(c, None)] = d
        cols[k] = c
    dp = column("dp")
    cols["dp"] = dp  # a derived value some configurations carry; None where absent
    return cols, n


def _num(c: np.ndarray, default: float) -> np.ndarray:
    try:
        return np.asarray(c, dtype=float)
    except (TypeError, ValueError):
        pass
    out = np.empty(len(c))
    for i, v in enumerate(c):
        try:
            out[i] = float(v)
        except (TypeError, ValueError):
            out[i] = default
    return out


def _bool(c: np.ndarray) -> np.ndarray:
    if c.dtype.kind in "biuf":
        return (c != 0).astype(float)
    return np.array(
        [v is True or v == 1 or (isinstance(v, str) and v.lower() == "true") for v in c],
        dtype=float,
    )


def _site_codes(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each LLM GEMM site's format code (:mod:`cubic.formats`) from its FP8 switch (``b``,
    0/1) and its format knob; where no config names a format, the switches alone."""
    fmts = {k: a[format_knob(k)] for k in FP8_SITES}
    for k, f in fmts.items():
        unset = np.equal(f, None) | (f == "bf16") if f.dtype == object else f == "bf16"
        if f.dtype.kind in "OU" and unset.all():
            fmts[k] = None  # every config leaves the site to its switch
    er = None
    if any(f is not None for f in fmts.values()):
        er = _bool(a[ERROR_REDUCTION_KNOB]) > 0
    return {k: site_codes(b[k] > 0, fmts[k], er)[0] for k in FP8_SITES}


def _onehot(c: np.ndarray, name: str, choices: Sequence[str]) -> dict[str, np.ndarray]:
    s = c.astype(str)
    return {f"{name}_{x}": (s == x).astype(float) for x in choices}


def _log2(x: np.ndarray | float) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=float), 1e-9))


def _log10(x: np.ndarray | float) -> np.ndarray:
    return np.log10(np.maximum(np.asarray(x, dtype=float), 1.0))


def _workload_common(wl: Workload, flops_per_item: float, n: int) -> dict[str, np.ndarray]:
    g, c = wl.gpu, wl.cluster
    ones = np.ones(n)
    peak = g.peak("bf16")
    return {
        "log2_num_gpus": ones * np.log2(c.num_gpus),
        "gpus_per_node": ones * c.gpus_per_node,
        "log2_nodes": ones * np.log2(c.nodes),
        "log2_global_batch": ones * np.log2(wl.training.global_batch),
        "peak_bf16_tflops": ones * peak / 1e12,
        "peak_fp8_tflops": ones * g.peak("fp8") / 1e12,
        "has_fp8": ones * float(g.has_fp8),
        "hbm_gb": ones * g.hbm_gb,
        "hbm_tbs": ones * g.hbm_gbs / 1e3,
        "nvlink_gbs": ones * g.nvlink_gbs,
        "nic_gbs": ones * g.nic_gbs,
        "pcie_gbs": ones * g.pcie_gbs,
        "opt_state_bytes": ones * OPT_STATE_BYTES.get(wl.training.optimizer, 12.0),
        "training_fp32": ones * float(wl.training.precision == "fp32"),
        # Tokens (or samples) per second if every GPU ran at BF16 peak on model FLOPs only.
        "log_peak_throughput": ones * np.log(c.num_gpus * peak / max(flops_per_item, 1.0)),
    }


def _bandwidth(wl: Workload, span: np.ndarray, stride: np.ndarray) -> np.ndarray:
    """Bytes/s per GPU of a group of ``span`` ranks ``stride`` apart (Megatron rank order).

    NVLink inside a node; across nodes one NIC per member the group has in each node (NCCL
    runs one ring per rail), never more than NVLink.
    """
    g, gpn = wl.gpu, wl.cluster.gpus_per_node
    rails = np.clip(gpn // np.maximum(stride, 1.0), 1.0, None)
    inter = np.minimum(g.nvlink_gbs, rails * g.nic_gbs)
    return np.where(span * stride <= gpn, g.nvlink_gbs, inter) * 1e9


# -- LLM -----------------------------------------------------------------------------------


def _llm(wl: Workload, m: LLM, a: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    g = wl.gpu
    ngpu = float(wl.cluster.num_gpus)
    gb = float(wl.training.global_batch)
    tp, pp, cp, vp, ep, mb = (
        np.maximum(_num(a[k], 1.0), 1.0) for k in ("tp", "pp", "cp", "vp", "ep", "micro_batch")
    )
    zero = _num(a["zero_stage"], 1.0)
    dp_given = _num(a["dp"], np.nan)
    dp = np.maximum(np.where(np.isnan(dp_given), np.floor(ngpu / (tp * pp * cp)), dp_given), 1.0)
    rc = {r: (a["recompute"].astype(str) == r).astype(float) for r in RECOMPUTE}
    full = rc["full"]
    b = {k: _bool(a[k]) for k in LLM_BOOLS}
    sp = b["sequence_parallel"] * (tp > 1)
    h, f, s, V = float(m.hidden), float(m.ffn), float(m.seq_len), float(m.vocab)
    kv_t = np.maximum(m.kv_heads, tp) * m.head_dim / tp  # K (or V) width per GPU (replicated)
    micro = np.maximum(gb / (mb * dp), 1.0)  # micro-batches per step
    tokens = mb * s / cp  # tokens of one micro-batch on one GPU
    layers_rank = m.layers / pp
    lf, lm, ll = stage_layers(
        m.layers,
        pp,
        _num(a["first_stage_layers"], np.nan),
        _num(a["last_stage_layers"], np.nan),
        _bool(a["embedding_loss_in_split"]) > 0,
    )

    # Weights per GPU: local layers split by tp (experts also by ep), plus the embedding or LM
    # head (both on one rank without pipelining, unless tied).
    attn, mlp = m.layer_params()
    dense = attn + 4.0 * h + (0.0 if m.experts > 1 else mlp)
    expert = mlp if m.experts > 1 else 0.0
    n_emb = np.where((pp == 1) & (not m.tied_embeddings), 2.0, 1.0)
    # On the busiest rank: the first holds the embedding, the last the LM head.
    per_layer = (dense + expert / ep) / tp
    params = np.maximum(
        np.maximum(lf * per_layer + n_emb * V * h / tp, np.where(pp > 2, lm * per_layer, 0.0)),
        np.where(pp > 1, ll * per_layer + V * h / tp, 0.0),
    )
    # Model state (Megatron mixed precision): 2-byte weights, 4-byte main grads, optimizer
    # state; ZeRO-1 shards the optimizer over dp*cp, ZeRO-2 also grads, ZeRO-3 also weights.
    shard = dp * cp
    opt_b = OPT_STATE_BYTES.get(wl.training.optimizer, 12.0)
    state = (
        params * 2.0 / np.where(zero >= 3, shard, 1.0)
        + params * 4.0 / np.where(zero >= 2, shard, 1.0)
        + params * opt_b / np.where(zero >= 1, shard, 1.0)
    )
    # FSDP (in place of the ZeRO stage): fp32 parameters, gradients and Adam moments, all
    # sharded over its group (every data-parallel rank, or a node's for HSDP), plus the
    # gathered BF16 layer being computed and the one prefetched.
    fsdp = a["fsdp"].astype(str)
    group = _num(a["fsdp_shard"], np.nan)
    node = np.maximum(np.floor(wl.cluster.gpus_per_node / tp), 1.0)
    group = np.where(fsdp == "full", shard, np.where(np.isnan(group), node, group))
    group = np.clip(group, 1.0, shard)
    gathered = 2.0 * np.maximum(dense / tp, V * h / tp) * 2.0
    state = np.where((fsdp == "full") | (fsdp == "hybrid"), params * 16.0 / group + gathered, state)
    # Activations per layer per micro-batch (Korthikanti et al. 2022 with flash attention):
    # 34 s b h / t bytes with sequence parallelism, s b h (10 + 24 / t) without; full
    # recompute keeps only the layer input, 2 s b h (/ t with sequence parallelism).
    layer_token = np.where(sp > 0, 34.0 * h / tp, h * (10.0 + 24.0 / tp))
    # A GEMM in FP8 (or a block-scaled format) keeps its input for the backward pass as the
    # cast copy, not in BF16 (Transformer Engine saves the quantised tensor the weight
    # gradient is computed from): the QKV and MLP inputs (split by tp only with sequence
    # parallelism) and the MLP output projection's. The output projection's input is the
    # attention output, which the attention kernel keeps in BF16 for its own backward.
    code = _site_codes(a, b)
    stored = np.array([x.stored_bytes for x in FORMATS])
    h_split = np.where(sp > 0, tp, 1.0)
    saved_wide = {
        "fp8_qkv": h / h_split,
        "fp8_mlp_in": h / h_split,
        "fp8_mlp_out": f * m.top_k / tp,
    }
    fp8_saved = sum(
        np.where(code[k] > BF16, 2.0 - stored[np.maximum(code[k], BF16)], 0.0) * w
        for k, w in saved_wide.items()
    )
    layer_token = layer_token - (fp8_saved if g.has_fp8 else 0.0)
    per_token = np.where(full > 0, 2.0 * h / h_split, layer_token)
    act_mb = tokens * per_token * layers_rank
    # The busiest rank's layers in flight: min(pp, m) micro-batches of the first stage in
    # 1F1B, more chunks with interleaving, the other ranks' with an uneven split.
    in_flight = activation_layers(lf, lm, ll, pp, vp, micro)
    logits = 6.0 * tokens * V / tp  # bf16 logits and their fp32 copy at the loss
    # Full recompute rebuilds one layer's activations at a time during the backward pass.
    act_peak = tokens * per_token * in_flight + np.where(full > 0, tokens * layer_token, 0.0)
    memory = state + act_peak + logits
    hbm = g.hbm_bytes

    # FLOPs per GPU per step; full recompute reruns the forward (+1/3).
    flops = m.flops_per_token() * gb * s / ngpu * (1.0 + full / 3.0)
    # The attention core runs in BF16 whatever the GEMM sites' formats; selective recompute
    # reruns its forward (+1/3).
    attn = m.attention_flops_per_token() * gb * s / ngpu
    gemm_flops = flops - attn * (1.0 + full / 3.0)
    attn_flops = attn * (1.0 + (full + rc["selective"]) / 3.0)
    # Share of those FLOPs in FP8 GEMMs, by each site's weights.
    kvd = float(m.kv_heads * m.head_dim)
    site_w = {
        "fp8_qkv": h * (h + 2 * kvd),
        "fp8_attn_out": h * h,
        "fp8_mlp_in": (m.mlp_mats - 1) * h * f * m.top_k,
        "fp8_mlp_out": h * f * m.top_k,
        "fp8_lm_head": V * h / m.layers,
    }
    total_w = sum(site_w.values())
    is8 = {k: (code[k] == FP8).astype(float) for k in FP8_SITES}
    fp8_share = sum(is8[k] * w for k, w in site_w.items()) / total_w if g.has_fp8 else 0.0 * tp
    peak16, peak8 = g.peak("bf16"), g.peak("fp8")
    blocked = {k: code[k] > FP8 for k in FP8_SITES}
    if any(x.any() for x in blocked.values()):
        # Block-scaled sites at their own peaks (MXFP8 and MXFP6 at the FP8 rate on
        # Blackwell, MXFP4 and NVFP4 at twice it), MXFP4's error reduction with its overhead.
        peak_of = np.array([g.peak(x.rate) if x.rate else peak16 for x in FORMATS])
        peak_of[MXFP4_ER] /= 1.0 + MXFP4_ER_GEMM_OVERHEAD
        mx_share = sum(np.where(blocked[k], w, 0.0) for k, w in site_w.items()) / total_w
        mx_s = sum(
            np.where(blocked[k], w / peak_of[np.maximum(code[k], BF16)], 0.0)
            for k, w in site_w.items()
        )
        compute_s = gemm_flops * (
            (1.0 - fp8_share - mx_share) / peak16 + fp8_share / peak8 + mx_s / total_w
        )
    else:
        compute_s = gemm_flops * ((1.0 - fp8_share) / peak16 + fp8_share / peak8)
    compute_s = (compute_s + attn_flops / peak16) / ROOFLINE_PEAK_SHARE

    # Bytes each GPU sends per step, by parallel dimension.
    act_bytes = 2.0 * tokens * h
    tp_bytes = np.where(
        tp > 1,
        2.0 * (tp - 1.0) / tp * act_bytes * 4.0 * (1.0 + full / 2.0) * layers_rank * micro,
        0.0,
    )  # 2 all-reduces forward, 2 backward
    cp_bytes = np.where(
        cp > 1, (cp - 1.0) * 2.0 * tokens * 2.0 * kv_t * 3.0 * layers_rank * micro, 0.0
    )  # K and V around the ring, forward and twice in backward
    pp_bytes = np.where(pp > 1, 2.0 * act_bytes / np.where(sp > 0, tp, 1.0) * micro * vp, 0.0)
    # Data parallel (over dp*cp ranks): fp32 gradients all-reduced (ZeRO-0) or
    # reduce-scattered (once per step; per micro-batch from ZeRO-2 on), 2-byte weights
    # all-gathered after the step (ZeRO-1/2) or before every use (ZeRO-3: forward and backward).
    frac = np.where(shard > 1, (shard - 1.0) / shard, 0.0)
    dp_grad = frac * params * 4.0 * np.where(zero == 0, 2.0, np.where(zero >= 2, micro, 1.0))
    dp_param = frac * params * 2.0 * np.where(zero == 0, 0.0, np.where(zero >= 3, 2.0 * micro, 1.0))
    dp_bytes = dp_grad + dp_param
    gpn = wl.cluster.gpus_per_node
    dp_cross = (tp * cp * dp > gpn).astype(float)
    pp_cross = ((tp * cp * dp < ngpu) & (tp * cp * dp * pp > gpn)).astype(float)
    tp_s = tp_bytes / _bandwidth(wl, tp, np.ones(n))
    cp_s = cp_bytes / _bandwidth(wl, cp, tp)
    pp_s = pp_bytes / _bandwidth(wl, pp, tp * cp * dp)
    bw_dp = _bandwidth(wl, shard, tp)
    dp_grad_s, dp_param_s = dp_grad / bw_dp, dp_param / bw_dp
    # Roofline step time: the compute at ROOFLINE_PEAK_SHARE of its formats' peaks on the
    # busiest pipeline stage, the pipeline bubble, and every transfer exposed except those
    # the configuration asks to overlap, which hide behind the compute they overlap with
    # (TP behind GEMMs, all but TP_OVERLAP_EXPOSED of it; gradient reduction behind the
    # backward pass, 2/3 of the compute; parameter gathers behind the forward, 1/3); the
    # serial variant exposes every transfer.
    b_ovl = {
        k: b[k] > 0 for k in ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")
    }
    # The pipeline runs at its busiest stage's pace: the LM head (2 V h forward FLOPs per
    # token) sits on the last stage, on top of its share of the layers.
    layer_fl = (m.flops_per_token() - 6.0 * V * h) / m.layers
    stage_fl = np.maximum(
        np.maximum(lf, np.where(pp > 2, lm, 0.0)) * layer_fl, ll * layer_fl + 6.0 * V * h
    )
    imbalance = np.where(pp > 1, np.maximum(pp * stage_fl / m.flops_per_token(), 1.0), 1.0)
    busy = compute_s * (imbalance + (pp - 1.0) / (vp * micro))
    serial = busy + tp_s + cp_s + pp_s + dp_grad_s + dp_param_s
    roofline = (
        busy
        + cp_s
        + pp_s
        + np.where(
            b_ovl["tp_comm_overlap"] & (sp > 0),
            np.maximum(tp_s - compute_s, TP_OVERLAP_EXPOSED * tp_s),
            tp_s,
        )
        + np.where(
            b_ovl["overlap_grad_reduce"],
            np.maximum(dp_grad_s - compute_s * 2.0 / 3.0, 0.0),
            dp_grad_s,
        )
        + np.where(
            b_ovl["overlap_param_gather"] & (zero >= 1),
            np.maximum(dp_param_s - compute_s / 3.0, 0.0),
            dp_param_s,
        )
    )
    step_tokens = gb * s

    out: dict[str, np.ndarray] = {
        "log2_tp": _log2(tp),
        "log2_pp": _log2(pp),
        "log2_cp": _log2(cp),
        "log2_vp": _log2(vp),
        "log2_ep": _log2(ep),
        "log2_dp": _log2(dp),
        "log2_micro_batch": _log2(mb),
        "zero_stage": zero,
        **{f"recompute_{r}": v for r, v in rc.items()},
        **b,
        "sequence_parallel": sp,
        "fp8_sites": sum(is8[k] for k in FP8_SITES),
        "log10_params": np.full(n, np.log10(m.params())),
        "log10_active_params": np.full(n, np.log10(m.active_params())),
        "layers": np.full(n, float(m.layers)),
        "log2_hidden": np.full(n, np.log2(h)),
        "log2_ffn": np.full(n, np.log2(f)),
        "heads": np.full(n, float(m.heads)),
        "kv_heads": np.full(n, float(m.kv_heads)),
        "log2_seq_len": np.full(n, np.log2(s)),
        "log2_vocab": np.full(n, np.log2(V)),
        "experts": np.full(n, float(m.experts)),
        "top_k": np.full(n, float(m.top_k)),
        "gated_mlp": np.full(n, float(m.gated_mlp)),
        **_workload_common(wl, m.flops_per_token(), n),
        "log2_microbatches": _log2(micro),
        "bubble_fraction": (pp - 1.0) / (vp * micro),
        "log2_gemm_tokens_x_hidden": _log2(tokens * h / tp),
        "log10_flops_per_gpu": _log10(flops),
        "fp8_flop_share": fp8_share * np.ones(n),
        "log10_params_per_gpu": _log10(params),
        "state_gb": state / 1e9,
        "activation_gb_per_microbatch": act_mb / 1e9,
        "activation_gb_peak": act_peak / 1e9,
        "memory_gb": memory / 1e9,
        "memory_ratio": memory / hbm,
        "state_ratio": state / hbm,
        "activation_ratio": (act_peak + logits) / hbm,
        "log10_tp_bytes": _log10(tp_bytes),
        "log10_cp_bytes": _log10(cp_bytes),
        "log10_pp_bytes": _log10(pp_bytes),
        "log10_dp_bytes": _log10(dp_bytes),
        "dp_crosses_nodes": dp_cross,
        "pp_crosses_nodes": pp_cross,
        "log10_compute_s": np.log10(compute_s),
        "log10_tp_s": _log10_s(tp_s),
        "log10_cp_s": _log10_s(cp_s),
        "log10_pp_s": _log10_s(pp_s),
        "log10_dp_grad_s": _log10_s(dp_grad_s),
        "log10_dp_param_s": _log10_s(dp_param_s),
        "comm_to_compute": (serial - busy) / compute_s,
        "log_serial_throughput": np.log(step_tokens / serial),
        OFFSET: np.log(step_tokens / roofline),
    }
    return out


def _log10_s(seconds: np.ndarray) -> np.ndarray:
    """log10 of a time, floored at a microsecond (zero for a dimension that is not used)."""
    return np.log10(np.maximum(seconds, 1e-6))


# -- DLRM ----------------------------------------------------------------------------------


#: Throughput of an error-bounded compressor of the cuSZ family (prediction, quantisation
#: and encoding per element) as a share of HBM bandwidth, where a cast runs at HBM speed.
#: Published cuSZ figures put it at 100-200 GB/s on an A100 whose HBM moves 2 TB/s; a
#: third is the fused, better-tuned end a production exchange would use, and a price that
#: still lets a few trials of a study move it either way.
LOSSY_CODEC_HBM_SHARE = 0.3


def lossy_ratio(error_bound: np.ndarray) -> np.ndarray:
    """Assumed compression ratio of an error-bounded lossy all-to-all.

    Error-bounded compressors of the cuSZ family reach about 4x on fp32 embeddings at a
    1e-3 relative bound and about 10x at 5e-2; between, log-linear in the bound.
    """
    eb = np.clip(np.asarray(error_bound, dtype=float), 1e-6, 0.5)
    slope = np.log(10.0 / 4.0) / np.log(5e-2 / 1e-3)
    return np.maximum(1.0, 4.0 * (eb / 1e-3) ** slope)


def _dlrm(wl: Workload, m: DLRM, a: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    g, c = wl.gpu, wl.cluster
    ranks, gpn, nodes = float(c.num_gpus), float(min(c.gpus_per_node, c.num_gpus)), c.nodes
    opt = wl.training.optimizer
    bpg = np.maximum(_num(a["batch_per_gpu"], 4096.0), 1.0)
    shard = {cl: _onehot(a[f"sharding_{cl}"], f"sharding_{cl}", SHARDINGS) for cl in TABLE_CLASSES}
    place = _onehot(a["placement_large"], "placement_large", PLACEMENTS)
    clf = np.clip(_num(a["cache_load_factor"], 0.2), 0.0, 1.0)
    # Share of the large tables' rows in HBM: all, none (host/UVM), or the cached share.
    hbm_frac = place["placement_large_hbm"] + place["placement_large_cached"] * clf
    prec = _onehot(a["a2a_precision"], "a2a", A2A_PRECISIONS)
    bound = _num(a["lossy_error_bound"], 1e-3)
    bound = np.where(bound > 0, bound, 1e-3)
    q = sum(prec[f"a2a_{p}"] * nb for p, nb in A2A_BYTES.items())
    q = q + prec["a2a_lossy"] * 4.0 / lossy_ratio(bound)
    q = np.where(q > 0, q, 4.0)
    bools = {k: _bool(a[k]) for k in DLRM_BOOLS}

    # Per table class: bytes (fp32 rows plus sparse optimizer state), the largest table,
    # pooled width, and lookups per sample.
    state_b = EMB_STATE_BYTES.get(opt, 0.0)
    emb_rank: dict[str, np.ndarray] = {}
    a2a = np.zeros(n)
    allreduce = np.zeros(n)
    imbalance = np.ones(n)
    lookups_large = 0.0
    lookups_total = 0.0
    for cl in TABLE_CLASSES:
        tables = [t for t in m.tables if _table_class(t.rows) == cl]
        sh = shard[cl]
        if not tables:
            emb_rank[cl] = np.zeros(n)
            continue
        sizes = np.array([t.rows * t.dim * (4.0 + state_b) for t in tables])
        total, largest = sizes.sum(), sizes.max()
        width = float(sum(t.dim for t in tables))
        lookups = np.array([t.pooling for t in tables])
        look_share = lookups.max() / lookups.sum()
        lookups_total += lookups.sum()
        if cl == "large":
            lookups_large = lookups.sum()
        k_cw = max(1.0, m.embedding_dim / CW_SHARD_DIM)
        # Bytes on the fullest rank: whole tables cannot split (table-wise), column shards
        # split k ways, table-row-wise splits inside a node; data-parallel replicates.
        per_rank = (
            sh[f"sharding_{cl}_table_wise"] * max(total / ranks, largest)
            + sh[f"sharding_{cl}_row_wise"] * total / ranks
            + sh[f"sharding_{cl}_column_wise"] * max(total / ranks, largest / k_cw)
            + sh[f"sharding_{cl}_table_row_wise"] * max(total / ranks, largest / gpn)
            + sh[f"sharding_{cl}_data_parallel"] * total
        )
        emb_rank[cl] = per_rank * (hbm_frac if cl == "large" else 1.0)
        # Lookup skew: the busiest rank's share of lookups over the mean share.
        imbalance = np.maximum(imbalance, sh[f"sharding_{cl}_table_wise"] * look_share * ranks)
        imbalance = np.maximum(
            imbalance, sh[f"sharding_{cl}_column_wise"] * look_share * ranks / k_cw
        )
        # Pooled embeddings each rank sends per step, one direction: its local batch for
        # tables others own (table/column-wise), partial sums of the global batch (row-wise),
        # both within and across nodes (table-row-wise); replicas only all-reduce gradients.
        a2a = a2a + q * width * (
            (sh[f"sharding_{cl}_table_wise"] + sh[f"sharding_{cl}_column_wise"]) * bpg
            + sh[f"sharding_{cl}_row_wise"] * bpg * (ranks - 1.0)
            + sh[f"sharding_{cl}_table_row_wise"] * bpg * gpn
        )
        allreduce = (
            allreduce
            + sh[f"sharding_{cl}_data_parallel"] * sum(t.rows * t.dim for t in tables) * 4.0
        )
    a2a = 2.0 * a2a  # forward embeddings, backward gradients
    dense_p = m.dense_params()
    allreduce = 2.0 * (ranks - 1.0) / ranks * (allreduce + 4.0 * dense_p)
    large_bytes = sum(
        t.rows * t.dim * (4.0 + state_b) for t in m.tables if _table_class(t.rows) == "large"
    )
    host_gb = (1.0 - place["placement_large_hbm"]) * large_bytes / nodes / 1e9
    # Large-table lookups served from host memory over PCIe (a cache's misses ~ uncached share).
    row_bytes = 3.0 * 4.0 * m.embedding_dim  # gather, read and write back in the fused backward
    host_lookup = bpg * lookups_large * row_bytes * (1.0 - hbm_frac)
    lookup_bytes = bpg * lookups_total * row_bytes

    dense_flops = m.dense_flops_per_sample()
    flops_gpu = dense_flops * bpg
    bottom = sum(
        x * y for x, y in zip((m.dense_features, *m.bottom_mlp[:-1]), m.bottom_mlp, strict=True)
    )
    top_in = m.interaction_width()
    top = sum(x * y for x, y in zip((top_in, *m.top_mlp[:-1]), m.top_mlp, strict=True))
    inter = 2.0 * top_in * m.dcn_rank * m.dcn_layers if m.interaction == "dcnv2" else 0.0
    tot = bottom + top + inter
    fp8_share = (
        (
            bools["fp8_bottom_mlp"] * bottom
            + bools["fp8_top_mlp"] * top
            + bools["fp8_interaction"] * inter
        )
        / tot
        * float(g.has_fp8)
    )
    compute_s = flops_gpu * ((1.0 - fp8_share) / g.peak("bf16") + fp8_share / g.peak("fp8"))
    act_elems = sum(m.bottom_mlp) + sum(m.top_mlp) + (len(m.tables) + 1) * m.bottom_mlp[-1] + top_in
    emb_hbm = sum(emb_rank.values())
    memory = (
        emb_hbm
        + dense_p * (4.0 + 4.0 + OPT_STATE_BYTES.get(opt, 4.0))
        + bpg * act_elems * 4.0 * 2.0
        + a2a
    )
    net = _bandwidth(wl, np.full(n, ranks), np.ones(n))
    a2a_s = a2a / net
    allreduce_s = allreduce / net
    host_s = host_lookup / (g.pcie_gbs * 1e9)
    lookup_s = lookup_bytes * imbalance / (g.hbm_gbs * 1e9)
    # Encoding the exchange below fp32 and decoding it back is a memory-bound pass over every
    # element on both sides (read 4 bytes, write q; read q, write 4), and it cannot hide:
    # where the exchange is fast (one node, NVLink) or hidden anyway, it costs more than the
    # bytes it saves, and fp32 wins.
    # An error-bounded lossy codec is no cast: it reads and writes the fp32 side at its own,
    # lower throughput (LOSSY_CODEC_HBM_SHARE).
    cast_s = np.where(q < 4.0, a2a / q * 2.0 * (4.0 + q), 0.0) / (g.hbm_gbs * 1e9)
    lossy_s = a2a / q * 2.0 * 4.0 / (LOSSY_CODEC_HBM_SHARE * g.hbm_gbs * 1e9)
    codec_s = np.where(prec["a2a_lossy"] > 0, lossy_s, cast_s)
    # Roofline step time: dense GEMMs at peak, embedding rows at HBM (and PCIe) bandwidth on
    # the busiest rank, the exchange's codec (casts at HBM bandwidth, a lossy codec at its
    # compressor's), the all-to-all hidden behind the dense compute when pipelined, and
    # DDP's gradient all-reduce behind the backward pass (2/3 of the dense compute).
    busy = compute_s + lookup_s + host_s + codec_s
    serial = busy + a2a_s + allreduce_s
    roofline = (
        busy
        + np.where(bools["pipeline_sparse"] > 0, np.maximum(a2a_s - compute_s, 0.0), a2a_s)
        + np.maximum(allreduce_s - compute_s * 2.0 / 3.0, 0.0)
    )

    out: dict[str, np.ndarray] = {
        **{k: v for sh in shard.values() for k, v in sh.items()},
        **place,
        "hbm_fraction_large": hbm_frac,
        **prec,
        "log10_lossy_error_bound": prec["a2a_lossy"] * np.log10(bound),
        # Per-table and per-phase bounds within the same error budget: more compression at
        # the bound's error score (how much depends on the tables, which the trees learn).
        "lossy_adaptive": prec["a2a_lossy"] * _bool(a["lossy_adaptive"]),
        "a2a_bytes_per_element": q,
        "log2_batch_per_gpu": _log2(bpg),
        **bools,
        "num_tables": np.full(n, float(len(m.tables))),
        "embedding_dim": np.full(n, float(m.embedding_dim)),
        "log10_embedding_params": np.full(n, np.log10(max(m.embedding_params(), 1.0))),
        "log10_dense_params": np.full(n, np.log10(max(dense_p, 1.0))),
        "log10_dense_flops_per_sample": np.full(n, np.log10(max(dense_flops, 1.0))),
        "dcnv2": np.full(n, float(m.interaction == "dcnv2")),
        "lookups_per_sample": np.full(n, lookups_total),
        **_workload_common(wl, dense_flops, n),
        **{f"emb_gb_{cl}": v / 1e9 for cl, v in emb_rank.items()},
        "emb_hbm_gb": emb_hbm / 1e9,
        "host_gb_per_node": host_gb,
        "lookup_imbalance": imbalance,
        "log10_a2a_bytes": _log10(a2a),
        "a2a_bytes_per_sample": a2a / bpg,
        "log10_allreduce_bytes": _log10(allreduce * np.ones(n)),
        "log10_host_lookup_bytes": _log10(host_lookup),
        "log10_dense_flops_per_gpu": _log10(flops_gpu),
        "fp8_dense_share": fp8_share,
        "memory_gb": memory / 1e9,
        "memory_ratio": memory / g.hbm_bytes,
        "log10_compute_s": np.log10(compute_s),
        "log10_a2a_s": _log10_s(a2a_s),
        "log10_codec_s": _log10_s(codec_s),
        "log10_host_lookup_s": _log10_s(host_s),
        "log10_allreduce_s": _log10_s(allreduce_s),
        "log10_lookup_s": _log10_s(lookup_s),
        "comm_to_compute": (a2a_s + allreduce_s + host_s) / compute_s,
        "log_serial_throughput": np.log(bpg * ranks / serial),
        OFFSET: np.log(bpg * ranks / roofline),
    }
    return out


def _table_class(rows: int) -> str:
    return "large" if rows >= LARGE_ROWS else "medium" if rows >= MEDIUM_ROWS else "small"


# -- numerics --------------------------------------------------------------------------------

#: The knobs that trade numerical accuracy for speed, one column per reduced-precision site.
#: A study's error score adds up over the sites a configuration switches on, so these
#: columns are the design of an additive (non-negative) error model. An error-bounded lossy
#: exchange enters with its bound: the error it adds is at most proportional to the bound.
_NUMERICS_LLM = FP8_SITES
_NUMERICS_DLRM = (
    "fp8_bottom_mlp",
    "fp8_top_mlp",
    "fp8_interaction",
    "allow_tf32",
    "a2a_fp16",
    "a2a_bf16",
    "a2a_fp8",
    "a2a_lossy_bound",
)


def numerics_names(kind: str) -> list[str]:
    """Ordered column names of :func:`numerics` for a workload kind."""
    return _for_kind(kind, _NUMERICS_LLM, _NUMERICS_DLRM)


def numerics(workload: Workload, configs: Configs) -> np.ndarray:
    """The reduced-precision sites each config switches on (n_configs x sites), >= 0.

    Booleans are 0/1, an all-to-all precision is one-hot (fp32 is the reference, all zero)
    and the lossy exchange is its error bound.
    """
    model = workload.model
    if isinstance(model, LLM):
        cols, n = _columns(configs, LLM_DEFAULTS)
        code = _site_codes(cols, {k: _bool(cols[k]) for k in FP8_SITES})
        feats = {k: format_error(c) for k, c in code.items()}
    else:
        cols, n = _columns(configs, DLRM_DEFAULTS)
        prec = _onehot(cols["a2a_precision"], "a2a", A2A_PRECISIONS)
        bound = np.maximum(_num(cols["lossy_error_bound"], 1e-3), 0.0)
        feats = {k: _bool(cols[k]) for k in DLRM_BOOLS}
        feats.update(prec)
        feats["a2a_lossy_bound"] = prec["a2a_lossy"] * bound
    names = numerics_names(workload.kind)
    out = np.empty((n, len(names)))
    for j, name in enumerate(names):
        out[:, j] = feats[name]
    return np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)

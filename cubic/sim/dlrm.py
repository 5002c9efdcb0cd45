"""Simulated DLRM training: TorchRec-style sharded embedding tables plus data-parallel MLPs.

An analytical model of one training step of a DLRM (Naumov et al. 2019) or of the MLPerf
DLRM-DCNv2 reference (multi-hot Criteo 1TB, low-rank cross network), trained the way
TorchRec does it, after Mudigere et al. 2022, "Software-hardware co-design for fast and
scalable training of deep learning recommendation models":

* embedding tables sharded with ``torchrec.distributed``'s sharding types (table-wise,
  row-wise, column-wise, table-row-wise, data-parallel) and looked up with FBGEMM's fused
  table-batched embedding (TBE) kernels, which apply the sparse optimizer inside the
  backward pass, so a lookup costs the bytes of its row and optimizer state;
* rows in HBM, in host memory reached over PCIe (UVM), or in host memory behind an HBM
  cache of the hottest rows (FBGEMM's UVM caching);
* pooled embeddings exchanged by an all-to-all (table-wise, column-wise), a reduce-scatter of
  the global batch's partial sums (row-wise), or both (table-row-wise), and their
  gradients the same way back, in fp32, fp16/bf16, fp8 or error-bounded lossy compression at
  a fixed or an adaptive bound (:mod:`cubic.sim.lossy_a2a`);
* bottom MLP, interaction (dot or DCNv2) and top MLP replicated on every rank and
  synchronised with DDP's fp32 all-reduce, optionally with FP8 GEMMs per site;
* a step time set by the slowest rank, plus a fixed host cost per step that eager
  PyTorch and TorchRec pay (see ``HOST_OVERHEAD_S``).

Every knob is an array, so one call prices many configurations; the only Python loops run
over tables, table shards and layers.

Simplifications, each chosen to keep the model closed-form:

* Tables fall into three classes by rows (large >= 1,000,000, medium >= 10,000, small), and
  each class has one sharding type, as one planner constraint per class would give.
* Table-wise and column-wise shards go to ranks like TorchRec's ``GreedyPerfPartitioner``:
  shards in decreasing order of cost, each to the least-loaded rank that still has room in a
  storage budget that, like the planner's, reserves a share of HBM instead of computing
  activations. Shards are ordered by a static key (lookups times width, then rows).
  Table-row-wise tables go to nodes the same way; their rows split evenly inside the node.
* Ids spread evenly over a table's rows, so row-wise shards are balanced.
* The all-to-all is priced at the average bytes per rank; only lookups are imbalanced.
* Row accesses follow a Zipf law, so an HBM cache of the hottest rows hits far more often
  than its size suggests; lookups of a batch beyond the cache's rows go to host memory, as
  FBGEMM's LRU cache cannot hold a batch larger than itself. Optimizer state of cached and
  host-placed tables stays in host memory, as FBGEMM places it with the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from cubic.hardware import GPU
from cubic.sim import collectives as cc
from cubic.sim.arrays import as_arrays
from cubic.sim.lossy_a2a import (
    ERR_LOSSY_PER_BOUND,
    LOSSY_HBM_FRAC,
    adaptive_exchange,
    lossy_ratio,
)
from cubic.sim.result import SimResult
from cubic.workload import DLRM, PRESETS, Cluster, Training, Workload

Configs = Mapping[str, Any] | Sequence[Mapping[str, Any]]

# ---------------------------------------------------------------------------------------------
# Constants. One set for every workload and GPU. HOST_OVERHEAD_S and ZIPF_A are fitted to
# the TorchRec DLRM reference (mlcommons/training recommendation_v2/torchrec_dlrm README,
# 1-8 A100 40GB; 6 % mean error over its five runs); the rest come from public sources or
# hardware arithmetic.
# ---------------------------------------------------------------------------------------------

#: Table classes by rows.
LARGE_ROWS = 1_000_000
MEDIUM_ROWS = 10_000

#: Fraction of HBM bandwidth that FBGEMM TBE reaches on random row gathers and scatters.
EMB_HBM_EFF = 0.5
#: Fraction of PCIe bandwidth for random row access to host memory over UVM. TorchRec's
#: planner prices FUSED_UVM lookups at a tenth of the HBM-to-DDR bandwidth
#: (``kernel_bw_lookup`` in torchrec/distributed/planner/constants.py).
UVM_EFF = 0.1
#: Zipf exponent of row access frequencies (Criteo-like skew). With it, an HBM cache of 20 %
#: of a 40M-row table's rows serves about 80 % of lookups.
ZIPF_A = 0.9
#: Extra HBM bytes per cached lookup for the cache bookkeeping (index linearisation,
#: unique/sort, LRU find and insert kernels of FBGEMM's cache).
CACHE_BYTES_PER_ID = 64.0
#: Column-wise shard width: TorchRec's planner constant MIN_CW_DIM (32 in early 2022).
CW_SHARD_DIM = 32

#: Fraction of peak that large dense GEMMs reach, and the per-GEMM fixed cost (launch,
#: tail wave) that makes small GEMMs inefficient.
GEMM_EFF = 0.7
GEMM_FIXED_S = 6e-6
#: The same under CUDA graphs: no launch latency, only the tail wave.
GRAPH_GEMM_FIXED_S = 2e-6
#: FP8 GEMMs: fraction of FP8 peak, and the cost of the per-tensor scaling casts (amax and
#: conversion kernels per operand) that make FP8 slower on small layers.
FP8_GEMM_EFF = 0.6
FP8_CAST_FIXED_S = 4e-6
#: Fraction of peak reached by the dot interaction's tiny batched GEMMs (27 x 128 per sample).
DOT_EFF = 0.15
#: Memory-bound elementwise work of the dense part: reads and writes per activation element
#: over forward and backward (bias, ReLU, their gradients, the interaction's concat/gather),
#: and the fraction of HBM bandwidth such kernels reach.
ACT_PASSES = 6.0
ACT_EFF = 0.8
#: Fraction of the dense backward pass behind which DDP's bucketed all-reduce can hide.
DP_OVERLAP = 0.8
#: With ``pipeline_sparse``, the input distribution (id all-to-all, split-size sync, batch
#: copy) of the next batch runs during the current step, as in TrainPipelineSparseDist, and
#: the pooled all-to-all may also hide behind this share of the dense compute after the
#: bottom MLP (TorchRec's later pipelines overlap the embedding exchange with dense work).
PIPE_A2A_OVERLAP = 0.5
#: Host time per step that the GPU cannot hide: eager PyTorch and TorchRec Python, kernel
#: launches and the in-process data loader. TorchRec's input distribution reads the split
#: sizes back to the host every step, so this adds to the GPU time instead of overlapping it.
HOST_OVERHEAD_S = 8.75e-3
#: Host time per step of a runtime that replays the whole step as CUDA graphs (HugeCTR's
#: ``use_cuda_graph``): graph launches and the loss read-back only.
GRAPH_OVERHEAD_S = 0.2e-3
#: Hotness-balanced plan (HugeCTR's embedding planner, as in its MLPerf DLRM-DCNv2
#: submissions): the model-parallel tables are split into shards until the lookups per
#: rank (or per node, for the hierarchical plan) balance; what is left is this share of the
#: mean lookup time on the busiest rank.
BALANCED_IMBALANCE = 0.2
#: With ``overlap_embedding`` (HugeCTR's intra- and inter-iteration overlap), the share of
#: the dense forward and backward behind which the embedding lookups and the pooled
#: exchange of the balanced plan run.
EMB_OVERLAP = 0.6
#: Share of a NIC's ring bandwidth that the balanced plan's exchange across nodes reaches:
#: an all-to-all of many small messages with incast at the receivers, which also carries the
#: partial sums of tables split over several ranks. Fitted to the MLPerf Training v3.1
#: DLRM-DCNv2 results (8, 64 and 128 H100).
A2A_NET_EFF = 0.3
#: Fixed cost per step and per doubling of the nodes of a multi-node job: the exchange's
#: synchronisation across nodes, stragglers and jitter (what a bandwidth model leaves out).
NODE_SYNC_S = 0.05e-3
#: Stall of an unpipelined input distribution: the split-size exchange and its host sync,
#: before the id all-to-all and the host-to-device batch copy can start.
INPUT_SYNC_S = 0.5e-3
#: Error-bounded lossy compression of the exchange (its throughput, ratio curve, error score
#: and the adaptive bounds) lives in :mod:`cubic.sim.lossy_a2a`.
#: Memory: CUDA context, NCCL and cuBLAS workspaces; allocator reserve as a share of HBM (the
#: reference passes HeuristicalStorageReservation(percentage=0.05)); share of host memory
#: that host-placed tables may use (the rest holds the OS and the data loader).
RUNTIME_BYTES = 2.5e9
HBM_RESERVE_FRAC = 0.05
HOST_USABLE_FRAC = 0.8
#: Input batches held at once by TrainPipelineSparseDist (its three stages).
PIPE_STAGES = 3

#: Numerical-error score. FP8 GEMM sites by sensitivity: the bottom MLP sees raw dense
#: features and is followed by the interaction, the top MLP produces the logit, and the
#: interaction's pairwise dot products of 128-wide vectors lose most to a 3-bit mantissa.
#: The all-to-all carries every embedding into every interaction term, so an FP8 exchange
#: costs about as much as an FP8 top MLP; a lossy exchange costs in proportion to its bound
#: (an adaptive one at most as much: the bound is its budget).
ERR_FP8_SITE = {"fp8_bottom_mlp": 0.3, "fp8_top_mlp": 1.0, "fp8_interaction": 1.5}
ERR_A2A = {"fp32": 0.0, "fp16": 0.02, "bf16": 0.1, "fp8": 1.0}

SHARDINGS = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
TW, RW, CW, TWRW, DP = range(5)
PLACEMENTS = ("hbm", "host", "cached")
HBM, HOST, CACHED = range(3)
A2A_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
CLASSES = ("large", "medium", "small")
PLANS = ("per_class", "balanced")

DEFAULTS: dict[str, Any] = {
    "sharding_large": "row_wise",
    "sharding_medium": "table_wise",
    "sharding_small": "data_parallel",
    "placement_large": "hbm",
    "cache_load_factor": 0.2,
    "a2a_precision": "fp32",
    "lossy_error_bound": 1e-3,
    # Adapt the lossy exchange's bound per table and per training phase within the error
    # budget that lossy_error_bound sets (Feng et al., SC'24; see cubic.sim.lossy_a2a).
    "lossy_adaptive": False,
    "batch_per_gpu": 4096,
    "fp8_bottom_mlp": False,
    "fp8_top_mlp": False,
    "fp8_interaction": False,
    "pipeline_sparse": False,
    # Embedding plan: 'per_class' (one sharding type per table class, placed like TorchRec's
    # planner) or 'balanced' (every model-parallel table split into shards until the lookups
    # per rank balance, exchanged hierarchically inside and across nodes, as HugeCTR does).
    "embedding_plan": "per_class",
    # Replay the step as CUDA graphs (HugeCTR): no eager host overhead per step.
    "cuda_graphs": False,
    # Overlap embedding lookups and exchange with the dense part (balanced plan).
    "overlap_embedding": False,
    # Precision of the dense gradients' all-reduce: fp32 (DDP) or fp16 (mixed precision).
    "allreduce_precision": "fp32",
    # PyTorch >= 1.12 runs fp32 matmuls in true FP32 unless this is set; earlier releases
    # used TF32 tensor cores by default.
    "allow_tf32": False,
}

#: Values a config may carry that follow from the knobs (the shipped space derives them).
DERIVED = frozenset({"global_batch"})

#: Rows per table of the TorchRec reference runs (``--num_embeddings_per_feature`` in the
#: README's common flags: the full Criteo 1TB vocabularies, 91.1 GB of fp32 tables).
TORCHREC_REFERENCE_ROWS = (
    45833188,
    36746,
    17245,
    7413,
    20243,
    3,
    7114,
    1441,
    62,
    29275261,
    1572176,
    345138,
    10,
    2209,
    11267,
    128,
    4,
    974,
    14,
    48937457,
    11316796,
    40094537,
    452104,
    12606,
    104,
    35,
)


# ---------------------------------------------------------------------------------------------
# Formulas that tests check by hand.
# ---------------------------------------------------------------------------------------------


def optimizer_state_bytes(optimizer: str, dim) -> np.ndarray:
    """Optimizer state bytes per embedding row of width ``dim`` (fp32 states).

    FBGEMM's row-wise Adagrad keeps one value per row; Adagrad one per element; Adam two.
    """
    dim = np.asarray(dim, dtype=float)
    per = {
        "sgd": 0.0 * dim,
        "rowwise_adagrad": 4.0 + 0.0 * dim,
        "adagrad": 4.0 * dim,
        "adam": 8.0 * dim,
    }
    return per[optimizer]


def lookup_bytes(dim, optimizer: str) -> np.ndarray:
    """Row bytes that one lookup moves over a step (fp32 weights).

    Forward gathers the row; the fused backward reads it again and writes it back, and reads
    and writes its optimizer state.
    """
    dim = np.asarray(dim, dtype=float)
    return 3.0 * 4.0 * dim + 2.0 * optimizer_state_bytes(optimizer, dim)


def a2a_bytes_per_element(precision, error_bound=1e-3) -> np.ndarray:
    """Bytes per pooled-embedding element on the wire at ``precision``.

    ``lossy`` is error-bounded compression of fp32 data whose ratio grows with the bound.
    """
    precision = np.asarray(precision, dtype=object)
    out = np.full(precision.shape, np.nan)
    for name, nbytes in A2A_BYTES.items():
        out = np.where(precision == name, nbytes, out)
    return np.where(precision == "lossy", 4.0 / lossy_ratio(error_bound), out)


def a2a_bytes(batch_per_gpu, pooled_dim, precision, error_bound=1e-3) -> np.ndarray:
    """Bytes of pooled embeddings one rank sends per direction in a table-wise all-to-all.

    Each rank ends up with its ``batch_per_gpu`` samples times the summed width
    ``pooled_dim`` of the tables that others own, at the wire precision.
    """
    return (
        np.asarray(batch_per_gpu, dtype=float)
        * np.asarray(pooled_dim, dtype=float)
        * a2a_bytes_per_element(precision, error_bound)
    )


def cache_hit_rate(cache_fraction, rows, zipf_a: float | None = None) -> np.ndarray:
    """Share of lookups served by an HBM cache of the hottest ``cache_fraction`` of rows.

    Under a Zipf law with exponent ``a`` the top ``k`` of ``N`` rows take
    ``(k^(1-a) - 1) / (N^(1-a) - 1)`` of accesses (``ln k / ln N`` at ``a = 1``).
    """
    n = np.maximum(np.asarray(rows, dtype=float), 1.0)
    k = np.clip(np.asarray(cache_fraction, dtype=float) * n, 1.0, n)
    e = 1.0 - (ZIPF_A if zipf_a is None else zipf_a)
    if abs(e) < 1e-9:
        hit = np.log(k) / np.maximum(np.log(n), 1e-12)
    else:
        hit = (k**e - 1.0) / np.where(n > 1.0, n**e - 1.0, 1.0)
    return np.where(n > 1.0, np.clip(hit, 0.0, 1.0), 1.0)


def greedy_place(perf, storage, active, capacity, bins: int, extra=None):
    """Assign shards to ``bins`` ranks like TorchRec's GreedyPerfPartitioner.

    ``perf``, ``storage`` and ``active`` are lists of per-configuration arrays, one per shard
    in placement order; each active shard goes to the least-loaded bin (by perf) among those
    with room, or to the emptiest bin when none has room. Returns the per-bin perf, storage
    and ``extra`` (another per-shard quantity that follows the shards) loads, each of shape
    ``(n_configs, bins)``.
    """
    n_cfg = len(capacity)
    pl = np.zeros((n_cfg, bins))
    sl = np.zeros((n_cfg, bins))
    xl = np.zeros((n_cfg, bins))
    extra = extra if extra is not None else [None] * len(perf)
    for p, s, a, x in zip(perf, storage, active, extra, strict=True):
        ia = np.flatnonzero(a)
        if not len(ia):
            continue
        s_a = s[ia]
        sl_a = sl[ia]
        room = sl_a <= (capacity[ia] - s_a)[:, None]
        r = np.argmin(np.where(room, pl[ia], np.inf), axis=1)
        full = ~room[np.arange(len(ia)), r]
        if full.any():
            r[full] = np.argmin(sl_a[full], axis=1)
        pl[ia, r] += p[ia]
        sl[ia, r] += s_a
        if x is not None:
            xl[ia, r] += x[ia]
    return pl, sl, xl


# ---------------------------------------------------------------------------------------------
# The simulator.
# ---------------------------------------------------------------------------------------------


def _codes(values: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Index of each value in ``names``; -1 for an unknown value."""
    out = np.full(len(values), -1, dtype=np.int64)
    for i, name in enumerate(names):
        out[values == name] = i
    return out


def _table_class(rows: int) -> str:
    """The class of a table of ``rows`` rows (:data:`CLASSES`)."""
    return "large" if rows >= LARGE_ROWS else "medium" if rows >= MEDIUM_ROWS else "small"


def _fail(reason: np.ndarray, mask: np.ndarray, message) -> None:
    """Record ``message`` for configurations in ``mask`` that have no reason yet."""
    m = mask & (reason == "")
    if m.any():
        reason[m] = message if isinstance(message, str) else message[m]


def _peak(gpu: GPU, precision: str) -> float:
    if precision not in gpu.peak_tflops and precision not in ("fp8", "fp16"):
        precision = "bf16"
    return gpu.peak(precision)


def _dense_parts(model: DLRM):
    """GEMM shapes (in, out) per site and activation elements per sample of the dense part."""
    bottom, top, inter = [], [], []
    width = model.dense_features
    for w in model.bottom_mlp:
        bottom.append((width, w))
        width = w
    f = len(model.tables) + 1
    d = model.bottom_mlp[-1]
    x = model.interaction_width()
    act = float(sum(model.bottom_mlp) + sum(model.top_mlp) + f * d + x)
    if model.interaction == "dcnv2":
        for _ in range(model.dcn_layers):
            inter += [(x, model.dcn_rank), (model.dcn_rank, x)]
            act += model.dcn_rank + 2.0 * x
    width = x
    for w in model.top_mlp:
        top.append((width, w))
        width = w
    return bottom, top, inter, act


def _gemm_time(b, shapes, peak, fp8, peak8, act_bytes, hbm_bw, fixed=GEMM_FIXED_S):
    """Forward and backward time (three GEMMs per layer) of layers ``shapes`` at batch ``b``.

    FP8 layers run at FP8 peak but pay for scaling casts: the weight (twice: as is and
    transposed) and an FP8 copy of the input activation and of the output gradient, plus a
    fixed cost per GEMM, so FP8 only pays off on large GEMMs.
    """
    t = np.zeros_like(b)
    for k, n in shapes:
        flops = 2.0 * b * k * n
        hi = flops / (peak * GEMM_EFF) + fixed
        cast = (2.0 * k * n * (act_bytes + 1.0) + b * (k + n)) / (hbm_bw * ACT_EFF)
        lo = flops / (peak8 * FP8_GEMM_EFF) + fixed + FP8_CAST_FIXED_S + cast / 3.0
        t = t + 3.0 * np.where(fp8, lo, hi)
    return t


def simulate_dlrm(workload: Workload, configs: Configs) -> SimResult:
    """Step time, throughput (samples/s), memory and numerical-error score per configuration.

    Knobs (defaults in :data:`DEFAULTS`): ``sharding_large``/``_medium``/``_small`` (one of
    :data:`SHARDINGS`), ``placement_large`` (hbm, host, cached), ``cache_load_factor``,
    ``a2a_precision`` (fp32, fp16, bf16, fp8, lossy), ``lossy_error_bound``,
    ``lossy_adaptive`` (per-table and per-phase bounds within that bound's error budget),
    ``batch_per_gpu``, ``fp8_bottom_mlp``, ``fp8_top_mlp``, ``fp8_interaction``,
    ``pipeline_sparse`` and ``allow_tf32``.
    """
    model = workload.model
    if not isinstance(model, DLRM):
        raise TypeError(f"simulate_dlrm needs a DLRM workload, got {workload.kind!r}")
    a, n_cfg = as_arrays(configs, DEFAULTS)
    gpu = workload.gpu
    n = int(workload.cluster.num_gpus)
    gpn = max(1, min(int(workload.cluster.gpus_per_node), n))
    nodes = -(-n // gpn)
    opt = workload.training.optimizer
    prec = workload.training.precision
    reason = np.full(n_cfg, "", dtype=object)

    # ---- knobs --------------------------------------------------------------------------
    shard = {c: _codes(np.asarray(a[f"sharding_{c}"], dtype=object), SHARDINGS) for c in CLASSES}
    for c in CLASSES:
        _fail(reason, shard[c] < 0, f"unknown sharding_{c}; expected one of {SHARDINGS}")
    _fail(
        reason,
        shard["large"] == DP,
        "data_parallel sharding of large tables: every rank would hold a full replica",
    )
    place = _codes(np.asarray(a["placement_large"], dtype=object), PLACEMENTS)
    _fail(reason, place < 0, f"unknown placement_large; expected one of {PLACEMENTS}")
    clf = np.asarray(a["cache_load_factor"], dtype=float)
    _fail(
        reason, (place == CACHED) & ~((clf > 0) & (clf <= 1)), "cache_load_factor must be in (0, 1]"
    )
    qprec = np.asarray(a["a2a_precision"], dtype=object)
    bound = np.asarray(a["lossy_error_bound"], dtype=float)
    lossy = qprec == "lossy"
    _fail(reason, lossy & ~(bound > 0), "lossy_error_bound must be positive")
    q = a2a_bytes_per_element(qprec, np.where(bound > 0, bound, 1e-3))
    _fail(reason, np.isnan(q), "unknown a2a_precision; expected fp32, fp16, bf16, fp8 or lossy")
    q = np.where(np.isnan(q), 4.0, q)
    # Adaptive bounds: fewer bytes and a lower share of the bound's error score, priced once
    # per distinct (bound, table classes exchanged).
    adaptive = np.asarray(a["lossy_adaptive"], dtype=bool) & lossy
    err_lossy = np.ones(n_cfg)  # error of the lossy exchange as a share of its bound's
    if adaptive.any():
        exchanged = np.stack([shard[c] != DP for c in CLASSES], axis=1)[adaptive]
        table_cls = np.array([CLASSES.index(_table_class(t.rows)) for t in model.tables])
        q[adaptive], err_lossy[adaptive] = adaptive_exchange(
            model.tables, table_cls, np.where(bound > 0, bound, 1e-3)[adaptive], exchanged
        )
    b = np.asarray(a["batch_per_gpu"], dtype=float)
    _fail(reason, ~(b >= 1), "batch_per_gpu must be at least 1")
    b = np.maximum(b, 1.0)
    pipe = np.asarray(a["pipeline_sparse"], dtype=bool)
    tf32 = np.asarray(a["allow_tf32"], dtype=bool)
    plan = np.asarray(a["embedding_plan"], dtype=object)
    bal_plan = plan == "balanced"
    _fail(reason, ~((plan == "per_class") | bal_plan), f"unknown embedding_plan; expected {PLANS}")
    graphs = np.asarray(a["cuda_graphs"], dtype=bool)
    ovl_emb = np.asarray(a["overlap_embedding"], dtype=bool) & bal_plan
    arp = np.asarray(a["allreduce_precision"], dtype=object)
    _fail(
        reason,
        ~((arp == "fp32") | (arp == "fp16") | (arp == "bf16")),
        "unknown allreduce_precision; expected fp32, fp16 or bf16",
    )
    ar_elem = np.where(arp == "fp32", 4.0, 2.0)
    fp8 = {k: np.asarray(a[k], dtype=bool) & gpu.has_fp8 for k in ERR_FP8_SITE}
    big_b = b * n  # global batch: every table-wise shard sees all of it

    hbm_bw = gpu.hbm_gbs * 1e9
    pcie_bw = gpu.pcie_gbs * 1e9
    state_row = optimizer_state_bytes(opt, 1.0)  # per element (adagrad, adam) or per row
    ones = np.ones(n_cfg)

    # ---- embeddings, table by table -----------------------------------------------------
    uni_t = np.zeros(n_cfg)  # per-rank lookup time of balanced shards (RW, DP)
    uni_mem = np.zeros(n_cfg)  # per-rank HBM of balanced shards
    cache_mem = np.zeros(n_cfg)  # per-rank HBM cache of balanced shards
    host_total = np.zeros(n_cfg)  # host bytes of host-placed / cached tables, whole job
    dp_elems = np.zeros(n_cfg)  # replicated table elements (gradient all-reduce, optimizer)
    dims = {s: np.zeros(n_cfg) for s in (TW, RW, TWRW, DP)}  # pooled widths by sharding
    ids = np.zeros(n_cfg)  # ids per sample sent in the input distribution
    lookups_rank = np.zeros(n_cfg)  # lookups per rank (TBE workspace)
    bal_t = np.zeros(n_cfg)  # balanced plan: mean per-rank time of the model-parallel tables
    bal_mem = np.zeros(n_cfg)  # ... their HBM per rank
    bal_dim = np.zeros(n_cfg)  # ... their summed pooled width
    dp_t = np.zeros(n_cfg)  # data-parallel tables' lookup time (either plan)
    dp_mem = np.zeros(n_cfg)
    items: list[tuple[Any, ...]] = []  # table-wise / column-wise shards
    twrw_items: list[tuple[Any, ...]] = []
    is_host = place == HOST
    is_cached = place == CACHED
    per_class = {}
    for c in CLASSES:
        sc = shard[c]
        m = {code: sc == code for code in range(5)}
        rdiv = np.where(m[RW], float(n), np.where(m[TWRW], float(gpn), 1.0))
        per_class[c] = (
            m,
            rdiv,
            np.where(m[DP], b, big_b / rdiv),
            np.where(m[DP], b, big_b),
            m[RW] | m[DP],
            np.where(m[DP], b, big_b / n),
        )
    lookup_bw = hbm_bw * EMB_HBM_EFF
    uvm_bw = pcie_bw * UVM_EFF
    for i, t in enumerate(model.tables):
        cls = _table_class(t.rows)
        m, rdiv, lk_per, samples, bal, lk_rank = per_class[cls]
        k = max(1, t.dim // CW_SHARD_DIM)
        dim_s = np.where(m[CW], t.dim / k, float(t.dim))
        rows_s = t.rows / rdiv
        lk_s = t.pooling * lk_per  # lookups per step on one shard
        row_b = 4.0 * dim_s
        st_b = state_row * (1.0 if opt == "rowwise_adagrad" else dim_s)
        traffic = 3.0 * row_b + 2.0 * st_b  # bytes of one lookup where the rows live
        full_b = rows_s * (row_b + st_b)
        t_look = traffic / lookup_bw
        hbm_b = full_b
        host_b = 0.0 * full_b
        in_cache = host_b
        if cls == "large" and (is_host | is_cached).any():
            cache_rows = clf * rows_s
            hit = np.minimum(cache_hit_rate(clf, rows_s), cache_rows / np.maximum(lk_s, 1.0))
            t_cached = (3.0 * row_b + CACHE_BYTES_PER_ID) / lookup_bw + (
                (1.0 - hit) * 2.0 * row_b + 2.0 * st_b
            ) / uvm_bw
            t_look = np.where(is_host, traffic / uvm_bw, np.where(is_cached, t_cached, t_look))
            in_cache = np.where(is_cached, cache_rows * row_b, 0.0)
            hbm_b = np.where(is_host, 0.0, np.where(is_cached, in_cache, full_b))
            host_b = np.where(is_host | is_cached, full_b, 0.0)
            host_total += host_b * np.where(m[CW], float(k), rdiv)
        out_t = 2.0 * 4.0 * dim_s / (hbm_bw * ACT_EFF)  # pooled output write + grad read
        shard_t = lk_s * t_look + samples * out_t

        uni_t += np.where(bal, shard_t, 0.0)
        dp_b = np.where(m[DP], t.rows * t.dim * 4.0, 0.0)  # replicas also keep a gradient
        # Balanced plan: the table's lookups and rows spread evenly over every rank, in HBM.
        st_full = state_row * (1.0 if opt == "rowwise_adagrad" else float(t.dim))
        per_lookup = (12.0 * t.dim + 2.0 * st_full) / lookup_bw
        mp = ~m[DP]
        bal_t += np.where(mp, t.pooling * per_lookup + 8.0 * t.dim / (hbm_bw * ACT_EFF), 0.0) * (
            big_b / n
        )
        bal_mem += np.where(mp, t.rows * (4.0 * t.dim + st_full) / n, 0.0)
        bal_dim += np.where(mp, float(t.dim), 0.0)
        dp_t += np.where(m[DP], shard_t, 0.0)
        dp_mem += np.where(m[DP], hbm_b, 0.0) + dp_b
        uni_mem += np.where(bal, hbm_b - in_cache, 0.0) + dp_b
        cache_mem += np.where(bal, in_cache, 0.0)
        dp_elems += np.where(m[DP], float(t.rows * t.dim), 0.0)
        dims[TW] += np.where(m[TW] | m[CW], float(t.dim), 0.0)
        for code in (RW, TWRW, DP):
            dims[code] += np.where(m[code], float(t.dim), 0.0)
        ids += np.where(m[DP], 0.0, np.where(m[CW], t.pooling * k, t.pooling))
        lookups_rank += lk_rank * t.pooling
        key = t.pooling * t.dim
        items.append((key, t.rows, i, 0, m[TW] | m[CW], shard_t, hbm_b, in_cache))
        if k > 1 and m[CW].any():
            for j in range(1, k):
                items.append((key / k, t.rows, i, j, m[CW], shard_t, hbm_b, in_cache))
        if m[TWRW].any():
            twrw_items.append((key, t.rows, i, m[TWRW], shard_t, hbm_b, in_cache))

    # ---- dense part ---------------------------------------------------------------------
    dense_prec = {"fp8": "bf16", "mixed": "bf16", "tf32": "tf32"}.get(prec, prec)
    peak_d = _peak(gpu, dense_prec)
    peak = np.where(tf32 & (dense_prec == "fp32"), _peak(gpu, "tf32"), peak_d)
    peak8 = gpu.peak("fp8")
    act_b = 4.0 if dense_prec in ("fp32", "tf32") else 2.0
    bottom, top, inter, act_elems = _dense_parts(model)
    fixed = np.where(graphs, GRAPH_GEMM_FIXED_S, GEMM_FIXED_S)
    t_bottom = _gemm_time(b, bottom, peak, fp8["fp8_bottom_mlp"], peak8, act_b, hbm_bw, fixed)
    t_top = _gemm_time(b, top, peak, fp8["fp8_top_mlp"], peak8, act_b, hbm_bw, fixed)
    f = len(model.tables) + 1
    d = model.bottom_mlp[-1]
    if model.interaction == "dot":
        flops = 3.0 * 2.0 * f * f * d * b
        cast = b * f * d * 2.0 / (hbm_bw * ACT_EFF) + 3 * FP8_CAST_FIXED_S
        t_inter = (
            np.where(
                fp8["fp8_interaction"], flops / (peak8 * DOT_EFF) + cast, flops / (peak * DOT_EFF)
            )
            + 3 * fixed
        )
    else:
        t_inter = _gemm_time(b, inter, peak, fp8["fp8_interaction"], peak8, act_b, hbm_bw, fixed)
    t_act = b * act_elems * act_b * ACT_PASSES / (hbm_bw * ACT_EFF)
    bottom_share = sum(model.bottom_mlp) / act_elems
    t_dense = t_bottom + t_top + t_inter + t_act
    t_bottom_all = t_bottom + bottom_share * t_act

    # ---- memory besides table-wise shards (per rank) -------------------------------------
    dense_params = model.dense_params()
    opt_dense = {"adam": 8.0, "adagrad": 4.0, "rowwise_adagrad": 4.0, "sgd": 0.0}[opt]
    mem_dense = dense_params * (8.0 + opt_dense) * ones
    mem_act = b * act_elems * act_b * 2.0
    pooled = b * (dims[TW] + dims[RW] + dims[TWRW] + dims[DP])
    partial = big_b * dims[RW] + big_b * dims[TWRW] / nodes  # RW/TWRW partial sums per rank
    wire = (b * dims[TW] + partial) * (4.0 + q) * 2.0
    stages = np.where(pipe, PIPE_STAGES, 1)
    in_batch = b * (model.dense_features * 4.0 + 4.0 + sum(t.pooling for t in model.tables) * 8)
    mem_buf = pooled * 4.0 * 2.0 + wire + stages * in_batch + lookups_rank * 16.0
    mem_runtime = (RUNTIME_BYTES + HBM_RESERVE_FRAC * gpu.hbm_bytes) * ones
    other = mem_dense + mem_act + mem_buf + mem_runtime

    # ---- greedy placement of table-row-wise (nodes) and table-wise/column-wise (ranks) ---
    # Like TorchRec's planner, place by per-sample cost against a storage budget that
    # reserves space for activations rather than computing them; the placement then depends
    # on a few knobs only, so each distinct combination is placed once.
    plan_cap = (
        gpu.hbm_bytes * (1.0 - HBM_RESERVE_FRAC) - RUNTIME_BYTES - mem_dense - uni_mem - cache_mem
    )
    _, clf_idx = np.unique(np.where(is_cached, clf, 0.0), return_inverse=True)
    key = clf_idx.reshape(-1).astype(np.int64)
    for code in (shard["large"], shard["medium"], shard["small"], place):
        key = key * 8 + (code + 1)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    scale = big_b[first]

    def place_once(its, act, perf, stor, extra, capacity, bins):
        loads = greedy_place(
            [it[perf][first] / scale for it in its],
            [it[stor][first] for it in its],
            [it[act][first] for it in its],
            capacity[first],
            bins,
            [it[extra][first] for it in its],
        )
        return loads[0][inv] * big_b[:, None], loads[1][inv], loads[2][inv]

    twrw_t = np.zeros(n_cfg)
    twrw_imb = np.zeros(n_cfg)
    twrw_mem = np.zeros(n_cfg)
    twrw_cache = np.zeros(n_cfg)
    if twrw_items:
        twrw_items.sort(key=lambda it: (-it[0], -it[1], it[2]))
        bins = min(nodes, len(twrw_items))
        pl_, sl_, xl_ = place_once(twrw_items, 3, 4, 5, 6, plan_cap, bins)
        twrw_t = pl_.sum(axis=1) / nodes
        twrw_imb = pl_.max(axis=1) - twrw_t
        w_ = np.argmax(sl_, axis=1)
        twrw_mem = sl_[np.arange(n_cfg), w_]
        twrw_cache = xl_[np.arange(n_cfg), w_]
    items.sort(key=lambda it: (-it[0], -it[1], it[2], it[3]))
    bins = max(1, min(n, len(items)))
    perf_load, stor_load, cache_load = place_once(items, 4, 5, 6, 7, plan_cap - twrw_mem, bins)
    tw_mean = perf_load.sum(axis=1) / n
    tw_imb = perf_load.max(axis=1) - tw_mean
    worst = np.argmax(stor_load, axis=1)
    tw_mem = stor_load[np.arange(n_cfg), worst]
    tw_cache = cache_load[np.arange(n_cfg), worst]

    t_lookup = np.where(bal_plan, bal_t + dp_t, uni_t + tw_mean + twrw_t)
    t_imb = np.where(bal_plan, BALANCED_IMBALANCE * bal_t, tw_imb + twrw_imb)

    # ---- communication ------------------------------------------------------------------
    bw_n, lat_n = cc.tier(gpu, gpn, n, 1)
    bw_g, lat_g = cc.tier(gpu, gpn, gpn, 1)
    bw_x, lat_x = cc.tier(gpu, gpn, nodes, gpn)

    def _gate(nbytes, t):
        return np.where(nbytes > 0, t, 0.0)

    nb_tw = b * dims[TW] * q  # == a2a_bytes(b, dims[TW], qprec, bound)
    nb_rw = big_b * dims[RW] * q
    nb_twrw_in = big_b * dims[TWRW] / nodes * q
    nb_twrw_x = b * dims[TWRW] * q
    one_way = (
        _gate(nb_tw, cc.all_to_all(nb_tw, n, bw_n, lat_n))
        + _gate(nb_rw, cc.reduce_scatter(nb_rw, n, bw_n, lat_n))
        + _gate(nb_twrw_in, cc.reduce_scatter(nb_twrw_in, gpn, bw_g, lat_g))
        + _gate(nb_twrw_x, cc.all_to_all(nb_twrw_x, nodes, bw_x, lat_x))
    )
    # Balanced plan: a hierarchical all-to-all of the pooled embeddings, over NVLink inside
    # the node, then rail to rail across nodes.
    nb_bal = b * bal_dim * q
    hier = _gate(nb_bal, cc.all_to_all(nb_bal, gpn, bw_g, lat_g)) + np.where(
        nodes > 1, _gate(nb_bal, cc.all_to_all(nb_bal, nodes, bw_x * A2A_NET_EFF, lat_x)), 0.0
    )
    one_way = np.where(bal_plan, hier, one_way)
    pooled_comm = 2.0 * one_way  # forward embeddings, backward gradients
    elems = 2.0 * (
        b * dims[TW]
        + big_b * dims[RW]
        + big_b * dims[TWRW] / nodes
        + np.where(nodes > 1, b * dims[TWRW], 0.0)
    )
    elems = np.where(bal_plan, 2.0 * b * bal_dim, elems)
    has_comm = one_way > 0
    t_quant = (
        np.select(
            [lossy, q < 4.0],
            [
                elems * 4.0 * 2.0 / (LOSSY_HBM_FRAC * hbm_bw),
                elems * (2.0 * (4.0 + q) + np.where(q < 2.0, 4.0, 0.0)) / (hbm_bw * ACT_EFF),
            ],
            0.0,
        )
        * has_comm
    )
    budget = t_bottom_all + np.where(pipe, PIPE_A2A_OVERLAP * (t_dense - t_bottom_all), 0.0)
    budget = np.where(ovl_emb, EMB_OVERLAP * t_dense, budget)
    a2a_exposed = np.maximum(0.0, pooled_comm - budget)
    # Overlapped balanced plan: lookups and exchange run on their own streams beside the
    # dense part; what the dense part cannot cover stays on the critical path.
    emb_work = t_lookup + t_imb + pooled_comm
    emb_hidden = np.minimum(emb_work, EMB_OVERLAP * t_dense)
    nb_ids = b * ids * 8.0 + b * len(model.tables) * 4.0
    t_ids = _gate(b * ids, cc.all_to_all(nb_ids, n, bw_n, lat_n))
    t_h2d = in_batch / pcie_bw
    input_dist = t_ids + t_h2d + INPUT_SYNC_S
    # pipelined: batch i+1's input distribution runs during batch i's whole step
    input_exposed = np.where(
        pipe, np.maximum(0.0, input_dist - t_dense - HOST_OVERHEAD_S), input_dist
    )
    t_a2a = a2a_exposed + t_quant + input_exposed

    ar_bytes = ar_elem * dense_params + 4.0 * dp_elems
    # Two-level all-reduce (NCCL's rails, or HugeCTR's grouped all-reduce): reduce-scatter
    # over NVLink inside the node, all-reduce of each GPU's share across the nodes (every
    # NIC of the node busy at once), all-gather inside the node.
    t_ar = np.where(
        nodes > 1,
        2.0 * cc.reduce_scatter(ar_bytes, gpn, bw_g, lat_g)
        + cc.all_reduce(ar_bytes / gpn, nodes, bw_x, lat_x),
        cc.all_reduce(ar_bytes, n, bw_n, lat_n),
    )
    t_dp = np.maximum(0.0, t_ar - DP_OVERLAP * (2.0 / 3.0) * t_dense)
    t_dp = np.where(ovl_emb, np.maximum(0.0, t_ar - DP_OVERLAP * (t_lookup + t_dense)), t_dp)

    opt_bytes = (dense_params + dp_elems) * (12.0 + 2.0 * opt_dense)
    t_opt = opt_bytes / (hbm_bw * ACT_EFF) + 20e-6

    t_host = np.where(graphs, GRAPH_OVERHEAD_S, HOST_OVERHEAD_S) + NODE_SYNC_S * math.log2(nodes)
    t_a2a = np.where(ovl_emb, t_quant + input_exposed + pooled_comm, t_a2a)
    # With overlap, the hidden part of the embedding work comes off the lookups first.
    hid_lookup = np.where(ovl_emb, np.minimum(emb_hidden, t_lookup + t_imb), 0.0)
    hid_a2a = np.where(ovl_emb, emb_hidden - hid_lookup, 0.0)
    share = np.where(t_lookup + t_imb > 0, t_lookup / np.maximum(t_lookup + t_imb, 1e-30), 1.0)
    t_lookup = t_lookup - hid_lookup * share
    t_imb = t_imb - hid_lookup * (1.0 - share)
    t_a2a = t_a2a - hid_a2a
    step = t_lookup + t_imb + t_a2a + t_dense + t_dp + t_opt + t_host

    # ---- memory and feasibility ---------------------------------------------------------
    mem_cache = np.where(bal_plan, 0.0, cache_mem + tw_cache + twrw_cache)
    mem_shards = np.where(
        bal_plan,
        bal_mem * (1.0 + BALANCED_IMBALANCE) + dp_mem,
        uni_mem + tw_mem + twrw_mem - tw_cache - twrw_cache,
    )
    peak_mem = mem_shards + mem_cache + other
    parts = {
        "embedding_shards": mem_shards,
        "embedding_cache": mem_cache,
        "dense": mem_dense,
        "activations": mem_act,
        "buffers": mem_buf,
        "runtime": mem_runtime,
    }
    hbm = gpu.hbm_bytes
    oom = peak_mem > hbm
    names = np.array(
        [
            "embedding shards",
            "embedding cache",
            "dense weights and optimizer",
            "activations",
            "input and all-to-all buffers",
            "runtime",
        ],
        dtype=object,
    )
    part_arr = np.stack(list(parts.values()), axis=1)
    big = np.argmax(part_arr, axis=1)
    if oom.any():
        gb = part_arr[np.arange(n_cfg), big] / 1e9
        msg = (
            np.char.mod("out of memory: %.1f GB of ", gb).astype(object)
            + names[big]
            + f" > {gpu.hbm_gb:g} GB HBM on rank "
            + np.char.mod("%d", worst).astype(object)
        )
        reason_oom = np.full(n_cfg, "", dtype=object)
        _fail(reason_oom, oom, msg)
    else:
        reason_oom = np.full(n_cfg, "", dtype=object)
    host_node = np.where(bal_plan, 0.0, host_total / nodes)
    host_cap = gpu.host_mem_gb_per_node * 1e9 * HOST_USABLE_FRAC
    host_oom = host_node > host_cap
    if host_oom.any():
        msg = (
            np.char.mod(
                "out of host memory: %.1f GB of host-placed embeddings", host_node / 1e9
            ).astype(object)
            + f" > {host_cap / 1e9:g} GB usable per node"
        )
        _fail(reason_oom, host_oom & ~oom, msg)
    valid = reason == ""
    fits = ~(oom | host_oom)
    reason = np.where(valid, reason_oom, reason)

    # ---- outputs ------------------------------------------------------------------------
    err = np.zeros(n_cfg)
    for k, w in ERR_FP8_SITE.items():
        err += w * fp8[k]
    for name, w in ERR_A2A.items():
        err += np.where(qprec == name, w, 0.0)
    err += np.where(lossy, ERR_LOSSY_PER_BOUND * np.maximum(bound, 0.0) * err_lossy, 0.0)

    ok = valid & fits
    throughput = np.where(ok, big_b / step, 0.0)
    flops = model.dense_flops_per_sample() * big_b
    mfu = np.where(ok, flops / (n * peak * step), 0.0)
    breakdown = {
        "embedding_lookup": t_lookup,
        "imbalance": t_imb,
        "a2a": t_a2a,
        "dense_compute": t_dense,
        "dp_comm": t_dp,
        "optimizer": t_opt,
        "host_overhead": t_host,
    }
    return SimResult(
        kind="dlrm",
        step_time=step,
        throughput=throughput,
        throughput_unit="samples/s",
        mfu=mfu,
        peak_memory=peak_mem,
        fits=fits,
        valid=valid,
        reason=reason.astype(str),
        error_score=err,
        breakdown=breakdown,
        memory=parts,
    )


# ---------------------------------------------------------------------------------------------
# Calibration rows and benchmark.
# ---------------------------------------------------------------------------------------------


#: Settings of NVIDIA's HugeCTR DLRM-DCNv2 submissions to MLPerf Training (v3.1:
#: ``NVIDIA/benchmarks/dlrm_dcnv2/implementations/hugectr``, ``train.py`` and the
#: ``config_DGXH100_*.sh`` files): the embedding planner's hotness-balanced plan ('auto' on
#: one node, 'hier_auto' with hierarchical communication on several), small tables
#: data-parallel (``DP_SHARDING_THRESHOLD``), CUDA graphs, intra- and inter-iteration overlap,
#: mixed precision (FP16 dense part, exchange and gradient all-reduce), AdaGrad, the
#: asynchronous raw data reader.
HUGECTR_CONFIG: dict[str, Any] = {
    "embedding_plan": "balanced",
    "sharding_large": "table_wise",
    "sharding_medium": "table_wise",
    "sharding_small": "data_parallel",
    "placement_large": "hbm",
    "a2a_precision": "fp16",
    "allreduce_precision": "fp16",
    "cuda_graphs": True,
    "overlap_embedding": True,
    "pipeline_sparse": True,
}


def _dcnv2_case(row: Mapping[str, Any]) -> tuple[Workload, dict[str, Any]]:
    """A published DLRM-DCNv2 run (MLPerf's multi-hot Criteo 1TB, the ``dlrm_criteo_dcnv2``
    preset) as HugeCTR ran it (:data:`HUGECTR_CONFIG`)."""
    base = PRESETS["dlrm_criteo_dcnv2"]
    num_gpus = int(row["num_gpus"])
    gpn = int(row.get("gpus_per_node") or 8)
    gb = int(row["global_batch"])
    mb = int(row.get("micro_batch") or 0) or gb // num_gpus
    wl = Workload(
        name=str(row.get("id") or "dlrm_dcnv2"),
        model=base.model,
        cluster=Cluster(str(row["gpu"]), num_gpus, gpn),
        training=Training(
            global_batch=mb * num_gpus,
            optimizer="adagrad",
            precision=str(row.get("precision") or "fp16"),
        ),
    )
    return wl, dict(HUGECTR_CONFIG, batch_per_gpu=mb)


def row_case(row: Mapping[str, Any]) -> tuple[Workload, dict[str, Any]]:
    """Workload and config of one published DLRM run (a ``workload == 'dlrm'`` row).

    Rows of ``dlrm_model`` ``criteo_1tb_dcnv2_multihot`` go to :func:`_dcnv2_case`; the
    rest are TorchRec DLRM reference runs, priced as below.

    What the reference (mlcommons/training ``recommendation_v2/torchrec_dlrm``, README
    "Preliminary Training Results", A100 40GB) ran, from its README and ``dlrm_main.py``:

    * Tables: the ``dlrm_criteo_dot`` preset's 26 tables of width 128 with the README's
      ``--num_embeddings_per_feature`` (full Criteo 1TB vocabularies, 91.1 GB in fp32, not
      capped at 40M rows); one lookup per table; dot interaction; MLPs 13-512-256-128 and
      479-1024-1024-512-256-1.
    * Optimizer: SGD for embeddings (fused into the backward) and dense part: the runs do not
      pass ``--adagrad``.
    * Precision: fp32 from the row. The runs predate PyTorch 1.12 (CUDA 11, NCCL 2.10,
      January 2022), whose matmuls used TF32 tensor cores by default, so ``allow_tf32``.
    * Pipeline: ``TrainPipelineSparseDist`` always, so ``pipeline_sparse``.
    * Sharding: the planner's choice is not published. With one lookup per table, a row-wise
      reduce-scatter of the global batch costs more than table-wise imbalance, and every
      table fits a 40 GB device, so large and medium tables are table-wise; tables of a few
      thousand rows are data-parallel, which the planner's estimate makes nearly free.
    * Placement: HBM when the plan fits; otherwise (one GPU: 91 GB of tables on 40 GB) the
      planner falls back to FBGEMM's UVM cache with its default load factor 0.2
      (``UVM_CACHING_RATIO``).
    """
    if row.get("dlrm_model") == "criteo_1tb_dcnv2_multihot":
        return _dcnv2_case(row)
    base = PRESETS["dlrm_criteo_dot"]
    tables = tuple(
        replace(t, rows=r) for t, r in zip(base.model.tables, TORCHREC_REFERENCE_ROWS, strict=True)
    )
    num_gpus = int(row["num_gpus"])
    gpn = int(row.get("gpus_per_node") or 8)
    mb = int(row.get("micro_batch") or 0) or int(row["global_batch"]) // num_gpus
    wl = Workload(
        name=str(row.get("id") or "torchrec_dlrm"),
        model=replace(base.model, name="torchrec_dlrm_criteo_1tb", tables=tables),
        cluster=Cluster(str(row["gpu"]), num_gpus, gpn),
        training=Training(
            global_batch=mb * num_gpus,
            optimizer="sgd",
            precision=str(row.get("precision") or "fp32"),
        ),
    )
    config: dict[str, Any] = {
        "sharding_large": "table_wise",
        "sharding_medium": "table_wise",
        "sharding_small": "data_parallel",
        "placement_large": "hbm",
        "cache_load_factor": 0.2,
        "a2a_precision": "fp32",
        "batch_per_gpu": mb,
        "pipeline_sparse": True,
        "allow_tf32": True,
    }
    if not bool(simulate_dlrm(wl, [config]).fits[0]):
        config["placement_large"] = "cached"
    return wl, config


def bench_dlrm(n: int = 100_000, seed: int = 0) -> float:
    """Configurations per second that :func:`simulate_dlrm` prices (DCNv2 preset, 8 GPUs)."""
    rng = np.random.default_rng(seed)
    wl = PRESETS["dlrm_criteo_dcnv2"]

    def pick(choices: Sequence[Any]) -> np.ndarray:
        return np.asarray(choices, dtype=object)[rng.integers(0, len(choices), n)]

    configs = {
        "sharding_large": pick(SHARDINGS[:4]),
        "sharding_medium": pick(SHARDINGS),
        "sharding_small": pick(SHARDINGS),
        "placement_large": pick(PLACEMENTS),
        "cache_load_factor": rng.choice([0.05, 0.1, 0.2, 0.4], n),
        "a2a_precision": pick(("fp32", "fp16", "bf16", "fp8", "lossy")),
        "lossy_error_bound": rng.choice([1e-3, 1e-2, 5e-2], n),
        "lossy_adaptive": rng.random(n) < 0.5,
        "batch_per_gpu": rng.choice([512, 1024, 2048, 4096, 8192, 16384], n),
        "fp8_bottom_mlp": rng.random(n) < 0.5,
        "fp8_top_mlp": rng.random(n) < 0.5,
        "fp8_interaction": rng.random(n) < 0.5,
        "pipeline_sparse": rng.random(n) < 0.5,
    }
    t0 = time.perf_counter()
    simulate_dlrm(wl, configs)
    return n / (time.perf_counter() - t0)

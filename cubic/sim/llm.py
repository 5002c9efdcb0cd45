"""Analytical performance and memory model of Megatron-style LLM training.

One call prices a whole batch of configurations (a struct of arrays) with NumPy, so a search
can ask about hundreds of thousands of layouts per second. The model is the one engineers
reason with:

* compute: the GEMMs of each transformer layer (QKV with grouped-query attention, attention
  scores and values, output projection, MLP with two or three matrices, the LM head on the
  last stage), split by tensor (and context) parallelism, at an efficiency that rises with
  the GEMM's size; backward is twice the forward. Non-GEMM work (norms, residuals,
  activations, softmax, cross entropy, FP8 casts) is priced as memory traffic over HBM
  bandwidth. FLOP counts follow Narayanan et al. (SC21) and Korthikanti et al. (2022).
* activation recomputation: ``full`` reruns every layer's forward, ``selective`` only the
  attention core (Korthikanti et al. 2022).
* communication: tensor-parallel all-reduces (or reduce-scatter + all-gather with sequence
  parallelism), context-parallel ring exchange of K and V, expert-parallel all-to-alls,
  pipeline point-to-point sends, data-parallel gradient reduction and parameter gathers per
  ZeRO stage (Rajbhandari et al. 2020), each priced by :mod:`cubic.sim.collectives` and
  partly hidden where Megatron-LM overlaps it.
* pipeline: the 1F1B bubble ``(p-1)/m`` and the interleaved one ``(p-1)/(v m)``
  (Narayanan et al. SC21).
* memory: Megatron-LM's distributed-optimizer accounting (2-byte weights, fp32 main
  gradients, 12 bytes of Adam state per parameter: 18 bytes, the figure Korthikanti et al.
  report; ZeRO stages 1/2/3 shard the optimizer state, then the gradients, then the weights
  over the data-parallel ranks as in Rajbhandari et al. 2020) and Korthikanti et al.'s
  activation formula, generalised to gated MLPs, grouped-query attention and flash attention,
  with the number of micro-batches the first pipeline stage keeps in flight.

The free constants below were fitted once against the published runs in
``cubic/data/published_runs.csv`` (see :mod:`cubic.sim.calibrate`): one set explains every
source, with a mean absolute error of about 4 % on step time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cubic.formats import (
    BF16,
    BLOCK_SCALED,
    ERROR_REDUCTION_KNOB,
    FORMATS,
    FP8,
    MXFP4,
    MXFP4_ER,
    MXFP4_ER_GEMM_OVERHEAD,
    NAMES,
    UNKNOWN,
    UNSET,
    format_knob,
    site_codes,
)
from cubic.formats import codes as format_codes
from cubic.formats import error as format_error
from cubic.hardware import GPU
from cubic.pipeline import stage_layers
from cubic.sim import collectives as coll
from cubic.sim.arrays import as_arrays
from cubic.sim.result import SimResult
from cubic.workload import LLM, PRESETS, Workload

# ---------------------------------------------------------------------------------------------
# Calibrated constants: one set for every GPU and every source. Refit them all together with
# cubic.sim.calibrate.validate() as the yardstick, never one source at a time.
# ---------------------------------------------------------------------------------------------
#: Largest fraction of dense peak that a big BF16/FP16 GEMM reaches inside a training step
#: (cuBLAS reaches 75-85 % in isolation; clocks under sustained load and fused epilogues
#: take the rest).
GEMM_EFF_MAX = 0.70
#: GEMM size (ideal seconds at peak) at which efficiency is half of GEMM_EFF_MAX: small
#: GEMMs (small micro-batches, high TP) lose to launch latency, tails and wave quantisation.
GEMM_T_HALF = 2.0e-6
#: How sharply efficiency saturates with GEMM size: eff = max / (1 + (t_half / t) ** alpha).
GEMM_ALPHA = 0.75
#: The ceiling of an FP8 GEMM's fraction of its (doubled) peak, relative to the BF16 ceiling
#: on the same GPU (0.70 x 0.94 x 0.96, about 1250 TFLOP/s on an H100 for a large GEMM).
#: Fitted with HOPPER_BF16_EFF and FP8_T_HALF_SCALE to the NeMo 24.07 FP8 rows and the
#: Megatron-Core H100 BF16 rows together.
FP8_GEMM_EFF = 0.96
#: Hopper and Blackwell BF16 GEMMs reach a smaller fraction of their peak than Ampere's
#: inside a training step (power and clock limits under sustained tensor-core load): the
#: share of GEMM_EFF_MAX they keep.
HOPPER_BF16_EFF = 0.94
#: FP8 GEMMs saturate later with size than BF16 ones: the half-efficiency point in ideal
#: seconds at FP8 peak is this multiple of GEMM_T_HALF, so small GEMMs (thin TP shards,
#: short micro-batches) gain less from FP8 than large ones.
FP8_T_HALF_SCALE = 2.0
#: Per-step slowdown for each doubling of the nodes a job spans: stragglers, jitter and the
#: synchronisation of collectives over more switches (torchtitan's Llama 3.1 8B runs lose
#: 2.3 % per GPU from 8 to 128 H100; published weak-scaling sweeps 2-4 % from 8 to 256 nodes).
NODE_JITTER = 0.002
#: Fraction of BF16 peak a fused flash-attention kernel reaches on the causal FLOPs it
#: counts (about 340 TFLOP/s on an H100: FlashAttention-2 and cuDNN's fused attention).
FLASH_EFF = 0.34
#: Flash attention's backward does 2.5x the forward's FLOPs: it recomputes the scores
#: (Dao, FlashAttention-2, 2023).
FLASH_BWD = 2.5
#: Fraction of HBM bandwidth that element-wise kernels (norms, residuals, activations,
#: softmax, casts, the optimizer) reach.
ELEM_BW_EFF = 0.82
#: Fixed work per optimizer step besides the update itself: data loading, loss and
#: grad-norm reductions, host synchronisation, logging (published throughputs are end to end).
STEP_OVERHEAD_S = 0.04
#: With ``tp_comm_overlap`` (userbuffers GEMM/communication overlap), the fraction of the
#: tensor-parallel traffic hidden behind GEMMs.
TP_OVERLAP = 0.72
#: Without it, the fraction of the backward TP collectives Megatron still hides behind the
#: weight-gradient GEMMs (asynchronous input-gradient all-reduce / all-gather).
TP_BWD_ASYNC = 0.93
#: Fraction of the attention compute behind which context-parallel K/V exchange hides.
CP_OVERLAP = 0.80
#: Fraction of pipeline point-to-point time left on the critical path.
PP_EXPOSED = 0.16
#: Runtime memory besides model state and activations: CUDA context, NCCL buffers,
#: allocator reserve (bytes), plus fragmentation as a fraction of activations. Not fitted to
#: times: chosen so that every published run fits and the memory figures of Korthikanti et
#: al. (which leave them out) stay comparable.
MEM_BASE = 2.5 * 2**30
MEM_FRAG = 0.05

# ---------------------------------------------------------------------------------------------
# Fixed accounting (not fitted): counts of bytes moved or stored, from the sources named.
# ---------------------------------------------------------------------------------------------
#: Element-wise traffic per token per layer in forward, in elements: two norms (read and
#: write h each), two residual adds fused with bias and dropout (read 2h, write h, mask).
ELEM_H = 11.0
#: Forward element-wise traffic of the attention softmax without flash attention, per token
#: per head per key (fused scale-mask-softmax read/write, dropout read/write and 1-byte mask).
ELEM_SOFTMAX = 4.5
#: Backward element-wise traffic relative to forward.
ELEM_BWD = 2.0
#: Bytes per logit moved by Megatron-LM's (unfused) vocab-parallel cross entropy: forward
#: upcast (2+4), max (4), subtract (4+4), exp (4+4), sum (4), divide (4+4); backward scale
#: (4+4) and downcast (4+2).
CE_BYTES = 56.0
#: Bytes per FP8 GEMM input element for the cast (read 2, write 1) and, with per-tensor
#: current scaling (Transformer Engine's recipe in NeMo since 24.12), the amax pass that
#: reads the tensor once more before it can be scaled.
FP8_CAST_BYTES = 3.0
FP8_AMAX_BYTES = 2.0
#: The same per format code of :data:`cubic.formats.FORMATS` (BF16: none): the cast reads the
#: 2-byte source and writes the element with its share of the block scale; only the formats
#: with a per-tensor scale (FP8, NVFP4's FP32 one) need the amax pass first, since an MX
#: block's scale comes from the block inside the cast. ``STORED_BYTES`` is what each writes per
#: element (and what a saved GEMM input keeps).
STORED_BYTES = np.array([0.0] + [f.stored_bytes for f in FORMATS[1:]])
CAST_BYTES = np.where(STORED_BYTES > 0, FP8_CAST_BYTES - 1.0 + STORED_BYTES, 0.0)
AMAX_BYTES = np.array([FP8_AMAX_BYTES * f.tensor_scale for f in FORMATS])
#: Optimizer step bytes per locally-updated parameter (Adam: read fp32 grad, read/write fp32
#: master, m and v, write the 2-byte weight, plus the grad-norm pass).
OPT_STEP_BYTES = {"adam": 34.0, "adagrad": 26.0, "rowwise_adagrad": 22.0, "sgd": 22.0}
#: Optimizer state per parameter: fp32 master weights + states (Rajbhandari et al. 2020).
OPT_STATE_BYTES = {"adam": 12.0, "adagrad": 8.0, "rowwise_adagrad": 4.0, "sgd": 8.0}
#: FSDP2 keeps fp32 sharded parameters (the optimizer's master copy), fp32 sharded gradients
#: and Adam's two fp32 moments: 16 bytes per parameter, all sharded; it gathers BF16 weights
#: and reduce-scatters FP32 gradients (torchtitan's mixed-precision defaults).
FSDP_STATE_BYTES = 16.0
FSDP_REDUCE_BYTES = 4.0
#: Megatron's DDP gradient bucket (parameters); the last bucket's reduction is never hidden.
DP_BUCKET_PARAMS = 40e6
#: Logit bytes held at the loss: bf16 logits and their fp32 copy (Megatron-LM cross entropy).
LOGIT_BYTES = 6.0

#: Numerical-error weight of each GEMM site run in FP8 (sums to 1 with every site on). The LM
#: head and attention output projection are the most sensitive (their outputs feed the
#: softmax over the vocabulary and the residual stream directly); NVIDIA Transformer Engine
#: and DeepSeek-V3 keep the output head in higher precision for that reason.
FP8_ERROR_WEIGHTS = {
    "fp8_qkv": 0.15,
    "fp8_attn_out": 0.25,
    "fp8_mlp_in": 0.10,
    "fp8_mlp_out": 0.15,
    "fp8_lm_head": 0.35,
}
FP8_SITES = tuple(FP8_ERROR_WEIGHTS)
#: Each site's format knob (``qkv_format``...): any format of :data:`cubic.formats.NAMES`;
#: unset, it follows the site's FP8 switch. A site's error is its weight times its format's
#: relative error (:data:`cubic.formats.ERROR`, FP8 per tensor = 1).
FORMAT_KNOBS = {k: format_knob(k) for k in FP8_SITES}

#: Knobs and their defaults (Megatron-Core's). ``dp`` defaults to num_gpus // (tp*pp*cp).
DEFAULTS: dict[str, Any] = {
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "vp": 1,
    "dp": None,
    "ep": 1,
    "micro_batch": 1,
    "zero_stage": 1,
    "recompute": "none",
    "sequence_parallel": False,
    "fp8_qkv": False,
    "fp8_attn_out": False,
    "fp8_mlp_in": False,
    "fp8_mlp_out": False,
    "fp8_lm_head": False,
    # A GEMM site's format (cubic.formats.NAMES); None: FP8 where its fp8_<site> is on, else
    # BF16. mxfp4_error_reduction: overflow-aware and macro-block scaling on MXFP4 sites.
    **dict.fromkeys(FORMAT_KNOBS.values()),
    ERROR_REDUCTION_KNOB: False,
    "precision": None,
    "overlap_grad_reduce": False,
    "overlap_param_gather": False,
    "tp_comm_overlap": False,
    # Uneven pipeline stages (Megatron-Core): transformer layers on the first and on the last
    # pipeline rank (None: an even split), or the embedding and the loss each counted as one
    # layer of the split (account_for_embedding/loss_in_pipeline_split).
    "first_stage_layers": None,
    "last_stage_layers": None,
    "embedding_loss_in_split": False,
    # PyTorch FSDP2 (torchtitan, Megatron-Core's torch_fsdp2): 'none', 'full' (shard over all
    # data-parallel ranks) or 'hybrid' (HSDP: shard within groups of ``fsdp_shard`` ranks,
    # one node's by default, replicate across them). Replaces zero_stage when on.
    "fsdp": "none",
    "fsdp_shard": None,
    "fsdp_reshard_after_forward": True,
    # Not in the search spaces by default; the calibration sets them per source.
    "flash_attention": True,
    # None: fp32 main gradients for BF16 (Megatron-LM forces them), 16-bit ones for FP16.
    "fp32_grads": None,
}

#: Values a config may carry that follow from the knobs (the shipped space derives them).
DERIVED = frozenset({"num_microbatches"})

RECOMPUTE = ("none", "selective", "full")
GIB = float(2**30)


def hbm_capacity(gpu: GPU) -> float:
    """Usable HBM bytes (:attr:`cubic.hardware.GPU.hbm_bytes`)."""
    return gpu.hbm_bytes


def gemm_efficiency(
    ideal_s, eff_max: float | np.ndarray | None = None, t_half: float | np.ndarray | None = None
) -> np.ndarray:
    """Fraction of peak a GEMM reaches, from its ideal time at peak (a saturating curve).

    ``max / (1 + (t_half / t_ideal) ** alpha)``: a big GEMM runs at ``GEMM_EFF_MAX`` of
    peak; small ones (small micro-batch x sequence, or weights split thin by TP) lose to
    launch latency, tail effects and wave quantisation. Measuring size in ideal seconds
    rather than FLOPs makes the same shape relatively less efficient on a faster GPU.
    """
    x = np.maximum(np.asarray(ideal_s, dtype=float), 1e-12)
    top = GEMM_EFF_MAX if eff_max is None else eff_max
    half = GEMM_T_HALF if t_half is None else t_half
    return top / (1.0 + (half / x) ** GEMM_ALPHA)


def link(gpu: GPU, gpus_per_node: int, size, stride) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth, latency) of a collective over ``size`` ranks ``stride`` apart.

    :func:`cubic.sim.collectives.tier`, except that a group spanning nodes with ``k`` members
    per node drives ``k`` NICs at once: NCCL builds one ring per rail, so only one hop in
    ``k`` crosses the network and the group's bus bandwidth is ``k`` NICs (capped by
    NVLink). This is why a DGX A100 data-parallel all-reduce reaches about 180 GB/s of bus
    bandwidth with 8 x 25 GB/s NICs, while a group with one GPU per node gets one NIC.
    """
    bw, lat = coll.tier(gpu, gpus_per_node, size, stride)
    stride = np.asarray(stride, dtype=float)
    intra = stride * np.asarray(size) <= gpus_per_node
    rails = np.clip(np.floor(gpus_per_node / np.maximum(stride, 1.0)), 1.0, None)
    inter = np.minimum(gpu.nvlink_gbs * coll.NVLINK_EFF, rails * gpu.nic_gbs * coll.NIC_EFF)
    return np.where(intra, bw, inter * 1e9), lat


def bubble_fraction(pp, vp, microbatches) -> np.ndarray:
    """Pipeline bubble over ideal time: (p-1)/m for 1F1B, (p-1)/(v m) interleaved (SC21)."""
    pp, vp, m = (np.asarray(x, dtype=float) for x in (pp, vp, microbatches))
    return (pp - 1.0) / (vp * m)


def layers_in_flight(layers, pp, vp, microbatches) -> np.ndarray:
    """Layers whose activations the first pipeline stage holds at its peak.

    1F1B keeps ``min(p, m)`` micro-batches of its ``L/p`` layers; the interleaved schedule's
    warm-up keeps ``2(p-1) + (v-1)p + 1`` model chunks of ``L/(p v)`` layers, which is
    ``L (1 + (p-1)/(p v))`` as in Korthikanti et al. (2022), capped by ``m v`` chunks.
    """
    L, p, v, m = (np.asarray(x, dtype=float) for x in (layers, pp, vp, microbatches))
    chunks = np.where(v > 1, np.minimum(m * v, 2 * (p - 1) + (v - 1) * p + 1), np.minimum(m, p))
    return chunks * L / (p * v)


def activation_bytes_per_layer(
    model: LLM,
    tokens,
    tp=1,
    sequence_parallel=False,
    recompute="none",
    flash_attention=False,
    elem_bytes: float = 2.0,
    fp8_saved=None,
) -> np.ndarray:
    """Activation bytes one layer keeps for backward for ``tokens`` (micro-batch x sequence).

    Korthikanti et al. (2022), eq. 1-2, generalised: per token ``10h`` bytes that tensor
    parallelism alone does not split (norm inputs, the QKV and MLP inputs, dropout masks) and
    ``2h + 4 kv + 2h + 2f (mats-1) + 2f`` that it does (Q, K, V with grouped-query heads, the
    output-projection input, the MLP's intermediate tensors), plus ``5 a s`` for the
    attention scores, softmax and dropout unless flash attention recomputes them. For a GPT
    (``kv = h``, ``f = 4h``, two matrices) this is ``sbh (10 + 24/t + 5as/(ht))``, and
    ``34 sbh / t`` with sequence parallelism. Selective recompute drops the ``5as`` term;
    full recompute keeps only the layer input (``2sbh``, ``/t`` with sequence parallelism).
    ``fp8_saved`` (bytes per token) is subtracted where FP8 GEMMs keep their inputs in 1 byte.
    """
    tokens = np.asarray(tokens, dtype=float)
    t = np.asarray(tp, dtype=float)
    sp = np.asarray(sequence_parallel, dtype=bool)
    rc = _recompute_code(recompute)
    flash = np.asarray(flash_attention, dtype=bool)
    h, f = float(model.hidden), float(model.ffn)
    kvd = float(model.kv_heads * model.head_dim)
    kvd_t = np.maximum(kvd, t * model.head_dim) / t
    scale = elem_bytes / 2.0
    rep = 10.0 * h * scale
    split = (
        4.0 * h
        + 4.0 * kvd_t * t
        + 2.0 * f * (model.mlp_mats - 1) * model.top_k
        + 2.0 * f * model.top_k
    ) * scale
    quad = np.where(flash | (rc >= 1), 0.0, 5.0 * model.heads * model.seq_len)
    per_token = np.where(sp, rep / t, rep) + (split + quad) / t
    if fp8_saved is not None:
        per_token = per_token - np.asarray(fp8_saved, dtype=float)
    full = 2.0 * h * scale / np.where(sp, t, 1.0)
    return tokens * np.where(rc == 2, full, per_token)


def layer_flops(model: LLM, tokens, tp=1, flash_attention=True) -> dict[str, np.ndarray]:
    """Forward FLOPs of one transformer layer on one GPU, by GEMM site.

    ``tokens`` are the micro-batch's tokens on this GPU (``micro_batch * seq_len / cp``).
    QKV projects ``h`` to ``h + 2 kv`` (grouped-query K/V heads split by TP, or replicated
    when TP exceeds them); attention scores and values cost ``2 tokens seq h`` each, halved
    for the causal mask where flash attention skips masked blocks (Megatron's unfused softmax
    computes the full square); the MLP has ``mlp_mats`` matrices of ``h x ffn`` per active
    expert. Backward costs twice these (Narayanan et al. SC21, eq. 3): for a GPT,
    ``3 (24 t h^2 + 4 t s h)`` per layer.
    """
    T = np.asarray(tokens, dtype=float)
    t = np.asarray(tp, dtype=float)
    h, f, s = float(model.hidden), float(model.ffn), float(model.seq_len)
    kvd_t = np.maximum(model.kv_heads, t) * model.head_dim / t
    k = float(model.top_k if model.experts > 1 else 1)
    causal = np.where(np.asarray(flash_attention, dtype=bool), 0.5, 1.0)
    return {
        "qkv": 2.0 * T * h * (h / t + 2.0 * kvd_t),
        "attn": 4.0 * T * s * h * causal / t,
        "attn_out": 2.0 * T * h * h / t,
        "mlp_in": 2.0 * T * h * f * (model.mlp_mats - 1) * k / t,
        "mlp_out": 2.0 * T * f * h * k / t,
        "router": 2.0 * T * h * model.experts * (model.experts > 1) + 0.0 * t,
    }


def lm_head_flops(model: LLM, tokens, tp=1) -> np.ndarray:
    """Forward FLOPs of the output layer (vocabulary split by TP) on the last stage."""
    return 2.0 * np.asarray(tokens, dtype=float) * model.hidden * model.vocab / np.asarray(tp)


def _recompute_code(recompute) -> np.ndarray:
    """0 none, 1 selective, 2 full; -1 for a value that is none of these."""
    r = np.asarray(recompute)
    if r.dtype.kind in "iuf":
        return np.where(np.isin(r, (0, 1, 2)), r, -1).astype(np.int8)
    if r.dtype.kind == "b":
        return np.where(r, 2, 0).astype(np.int8)
    code = np.full(r.shape, -1, dtype=np.int8)
    code[(r == "none") | (r == "") | np.equal(r, None) | (r == "no")] = 0
    code[r == "selective"] = 1
    code[r == "full"] = 2
    return code


def _fsdp_code(mode) -> np.ndarray:
    """0 none, 1 full, 2 hybrid; -1 for a value that is none of these."""
    r = np.asarray(mode)
    if r.dtype.kind == "b":
        return np.where(r, 1, 0).astype(np.int8)
    code = np.full(r.shape, -1, dtype=np.int8)
    code[(r == "none") | np.equal(r, None) | (r == "") | (r == False)] = 0  # noqa: E712
    code[(r == "full") | (r == True)] = 1  # noqa: E712
    code[r == "hybrid"] = 2
    return code


def _bool(a: np.ndarray) -> np.ndarray:
    if a.dtype == bool:
        return a
    if a.dtype.kind in "iuf":
        return a != 0
    return (a == True) | (a == 1) | (a == "true") | (a == "True")  # noqa: E712


def _num(a: np.ndarray, fill: float) -> np.ndarray:
    """Knob values as floats; ``None`` becomes ``fill``, anything non-numeric NaN (invalid)."""
    if a.dtype.kind in "iufb":
        return a.astype(float)
    a = np.where(np.equal(a, None), fill, a)
    try:
        return a.astype(float)
    except (TypeError, ValueError):
        return np.vectorize(_to_float, otypes=[float])(a)


def _to_float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


_SPEC = re.compile(r"%(\.\d+f|d|s)")


def _fmt(template: str, *cols: np.ndarray) -> np.ndarray:
    """Vectorised ``template % (col0[i], col1[i], ...)``: one message per entry."""
    pieces = _SPEC.split(template)
    if (len(pieces) - 1) // 2 != len(cols):
        raise ValueError(f"{template!r} needs {(len(pieces) - 1) // 2} columns")
    out = np.full(len(cols[0]) if cols else 1, pieces[0], dtype=object)
    for i, col in enumerate(cols):
        spec, text = pieces[1 + 2 * i], pieces[2 + 2 * i]
        out = out + np.char.mod("%" + spec, np.asarray(col)).astype(object) + text
    return out


def simulate_llm(
    workload: Workload, configs: Mapping[str, Any] | Sequence[Mapping[str, Any]]
) -> SimResult:
    """Price a batch of Megatron-style training configurations of ``workload``'s LLM.

    ``configs`` is a mapping of knob -> array (all of one length) or a list of dicts; knobs
    a configuration leaves out take :data:`DEFAULTS`:

    * ``tp``, ``pp``, ``cp``, ``ep``, ``dp``: tensor, pipeline, context, expert and data
      parallel degrees (``dp`` defaults to ``num_gpus // (tp*pp*cp)``); ``vp``: model chunks
      per pipeline rank (1 = 1F1B, more = interleaved); ``micro_batch`` in sequences.
    * ``zero_stage``: 0 DDP, 1 optimizer state sharded (Megatron's distributed optimizer),
      2 and gradients (reduce-scattered every micro-batch), 3 and weights (FSDP: gathered for
      every micro-batch's forward and backward).
    * ``recompute``: ``none``, ``selective`` (attention core) or ``full`` (every layer).
    * ``sequence_parallel``, ``tp_comm_overlap`` (needs sequence parallelism),
      ``overlap_grad_reduce``, ``overlap_param_gather``: Megatron-LM's switches.
    * ``fp8_qkv``, ``fp8_attn_out``, ``fp8_mlp_in``, ``fp8_mlp_out``, ``fp8_lm_head``: GEMM
      sites run in FP8 with per-tensor scaling; ``precision='fp8'`` turns on all but the LM
      head (and those whose format is named). ``qkv_format``, ``attn_out_format``,
      ``mlp_in_format``, ``mlp_out_format``, ``lm_head_format`` name a site's format instead
      (:data:`cubic.formats.NAMES`: also the block-scaled MXFP8, MXFP6, NVFP4 and MXFP4
      where the GPU has them); unset or ``bf16``, the FP8 switch decides.
      ``mxfp4_error_reduction`` applies overflow-aware and macro-block scaling to the MXFP4
      sites (slower GEMMs, smaller error).
    * ``flash_attention`` (default on) and ``fp32_grads`` (default: on unless training in
      FP16) describe the software stack rather than a layout.

    Returns a :class:`SimResult`: step time and its ``breakdown`` (``compute``,
    ``recompute``, exposed ``tp_comm``, ``cp_comm``, ``ep_comm``, ``pp_comm``, ``dp_comm``,
    the pipeline ``bubble``, ``optimizer`` (which includes the fixed per-step work) and
    ``jitter``, the slowdown that grows with the number of nodes),
    tokens/s, MFU against BF16 peak, peak memory per GPU and its parts on the busiest
    pipeline rank, the numerical-error score (each low-precision site's weight in
    :data:`FP8_ERROR_WEIGHTS` times its format's relative error), and why a configuration is
    invalid or does not fit.
    """
    model = workload.model
    if not isinstance(model, LLM):
        raise TypeError(f"simulate_llm needs an LLM workload, got {model.kind!r}")
    gpu = workload.gpu
    gpn = workload.cluster.gpus_per_node
    ngpu = float(workload.cluster.num_gpus)
    gb = float(workload.training.global_batch)
    arr, n = as_arrays(configs, DEFAULTS)

    # --- knobs ------------------------------------------------------------------------------
    t = _num(arr["tp"], 1.0)
    p = _num(arr["pp"], 1.0)
    c = _num(arr["cp"], 1.0)
    v = _num(arr["vp"], 1.0)
    ep = _num(arr["ep"], 1.0)
    b = _num(arr["micro_batch"], 1.0)
    z = _num(arr["zero_stage"], 1.0)
    derived_dp = np.floor(ngpu / np.maximum(t * p * c, 1.0))
    d = _num(arr["dp"], np.nan) if "dp" in arr else derived_dp.copy()
    d = np.where(np.isnan(d), derived_dp, d)
    nan = np.full(n, np.nan)
    f_l = _num(arr["first_stage_layers"], np.nan) if "first_stage_layers" in arr else nan
    l_l = _num(arr["last_stage_layers"], np.nan) if "last_stage_layers" in arr else nan
    emb_split = _bool(arr["embedding_loss_in_split"])
    fsdp = _fsdp_code(arr["fsdp"])
    fsdp_shard = _num(arr["fsdp_shard"], np.nan) if "fsdp_shard" in arr else nan
    reshard = _bool(arr["fsdp_reshard_after_forward"])
    rc = _recompute_code(arr["recompute"])
    sp = _bool(arr["sequence_parallel"])
    flash = _bool(arr["flash_attention"])
    grads_default = workload.training.precision != "fp16"
    fp32_grads = (
        _bool(np.where(np.equal(arr["fp32_grads"], None), grads_default, arr["fp32_grads"]))
        if "fp32_grads" in arr
        else np.full(n, grads_default)
    )
    ovl_g = _bool(arr["overlap_grad_reduce"])
    ovl_p = _bool(arr["overlap_param_gather"])
    tpo = _bool(arr["tp_comm_overlap"])
    site = {k: _bool(arr[k]) for k in FP8_SITES}
    if "precision" in arr:  # FP8 on every layer GEMM whose format the config leaves unset
        all_fp8 = arr["precision"] == "fp8"
        for k in FP8_SITES[:-1]:
            named = FORMAT_KNOBS[k] in arr and all_fp8.any()
            unset = format_codes(arr[FORMAT_KNOBS[k]]) == UNSET if named else True
            site[k] = site[k] | (all_fp8 & unset)
    # Each GEMM site's format code (cubic.formats): the FP8 switch, or its format knob.
    er = _bool(arr[ERROR_REDUCTION_KNOB])
    code, conflict = {}, {}
    for k in FP8_SITES:
        code[k], conflict[k] = site_codes(site[k], arr.get(FORMAT_KNOBS[k]), er)
    any_fp8 = np.zeros(n, dtype=bool)
    for k in FP8_SITES:
        any_fp8 |= code[k] == FP8
    err = np.zeros(n)
    for k, w in FP8_ERROR_WEIGHTS.items():
        err = err + w * format_error(code[k])

    # --- validity ---------------------------------------------------------------------------
    L, h, a, kvh = model.layers, model.hidden, model.heads, model.kv_heads
    E, topk = model.experts, model.top_k
    knobs_ok = ~np.isnan(t + p + c + v + ep + b + z + d)
    t, p, c, v, ep, b, z, d = (np.where(np.isnan(x), 1.0, x) for x in (t, p, c, v, ep, b, z, d))
    reason = np.full(n, "", dtype=object)
    checks: list[tuple[np.ndarray, str, tuple[np.ndarray, ...]]] = []
    pos = (t >= 1) & (p >= 1) & (c >= 1) & (v >= 1) & (ep >= 1) & (b >= 1) & (d >= 1)
    integral = np.all([x == np.floor(x) for x in (t, p, c, v, ep, b, d, z)], axis=0)
    checks.append(
        (
            ~(knobs_ok & pos & integral),
            "invalid: parallel degrees and micro_batch must be positive integers",
            (),
        )
    )
    checks.append((rc < 0, "invalid: recompute must be 'none', 'selective' or 'full'", ()))
    checks.append((~np.isin(z, (0, 1, 2, 3)), "invalid: zero_stage must be 0, 1, 2 or 3", ()))
    tpc = t * p * c
    checks.append(
        (
            np.fmod(ngpu, np.maximum(tpc, 1.0)) != 0,
            "invalid: tp*pp*cp=%d does not divide %d GPUs",
            (tpc, np.full(n, ngpu)),
        )
    )
    checks.append(
        (tpc * d != ngpu, "invalid: tp*pp*cp*dp=%d is not the %d GPUs", (tpc * d, np.full(n, ngpu)))
    )
    checks.append(
        (
            np.fmod(a, np.maximum(t, 1)) != 0,
            "invalid: tp=%d does not divide %d attention heads",
            (t, np.full(n, a)),
        )
    )
    checks.append(
        (
            (np.fmod(kvh, np.maximum(t, 1)) != 0) & (np.fmod(t, kvh) != 0),
            "invalid: tp=%d and %d KV heads do not divide one another",
            (t, np.full(n, kvh)),
        )
    )
    stages, stage_checks = _stage_layers(L, p, v, f_l, l_l, emb_split)
    checks.extend(stage_checks)
    checks.append(
        (
            np.fmod(gb, np.maximum(b * d, 1)) != 0,
            "invalid: micro_batch*dp=%d does not divide global batch %d",
            (b * d, np.full(n, gb)),
        )
    )
    checks.append(((v > 1) & (p <= 1), "invalid: vp>1 needs pp>1", ()))
    m = gb / np.maximum(b * d, 1.0)
    checks.append(
        (
            (v > 1) & (np.fmod(np.floor(m), np.maximum(p, 1)) != 0),
            "invalid: interleaving needs the %d micro-batches to be a multiple of pp=%d",
            (np.floor(m), p),
        )
    )
    checks.append(
        (
            (c > 1) & (np.fmod(model.seq_len, np.maximum(2 * c, 1)) != 0),
            "invalid: cp=%d needs seq_len divisible by 2*cp",
            (c,),
        )
    )
    checks.append(
        (
            (ep > 1)
            & ((np.fmod(E, np.maximum(ep, 1)) != 0) | (np.fmod(d * c, np.maximum(ep, 1)) != 0)),
            "invalid: ep=%d must divide the experts and dp*cp",
            (ep,),
        )
    )
    checks.append(
        (
            any_fp8 & (not gpu.has_fp8),
            "invalid: %s has no FP8 tensor cores",
            (np.full(n, gpu.name, dtype=object),),
        )
    )
    checks.extend(_format_checks(gpu, code, conflict, arr))
    checks.append((tpo & (t > 1) & ~sp, "invalid: tp_comm_overlap needs sequence_parallel", ()))
    checks.append((fsdp < 0, "invalid: fsdp must be 'none', 'full' or 'hybrid'", ()))
    shard_default = np.maximum(np.floor(gpn / np.maximum(t, 1.0)), 1.0)
    S = np.where(fsdp == 1, d * c, np.where(np.isnan(fsdp_shard), shard_default, fsdp_shard))
    S = np.where(fsdp >= 1, np.minimum(S, np.maximum(d * c, 1.0)), 1.0)
    checks.append(
        (
            (fsdp == 2) & ((S < 1) | (np.floor(S) != S) | (np.fmod(d * c, np.maximum(S, 1)) != 0)),
            "invalid: fsdp_shard=%d must divide the %d data-parallel ranks",
            (S, d * c),
        )
    )
    if E > 1:
        no_moe = "invalid: fsdp is not modelled with experts (use zero_stage)"
        checks.append((fsdp >= 1, no_moe, ()))
    valid = np.ones(n, dtype=bool)
    for bad, msg, cols in reversed(checks):
        bad = np.asarray(bad, dtype=bool) & np.ones(n, dtype=bool)
        if bad.any():
            idx = np.flatnonzero(bad)
            reason[idx] = _fmt(msg, *(np.asarray(col)[idx] for col in cols)) if cols else msg
        valid &= ~bad
    # Work on safe values everywhere; invalid entries are masked at the end.
    one = np.ones(n)
    t, p, c, v, ep, b, d = (np.where(valid, x, 1.0) for x in (t, p, c, v, ep, b, d))
    z = np.where(valid, z, 1.0)
    fs = valid & (fsdp >= 1)  # FSDP replaces the ZeRO stage
    z = np.where(fs, 0.0, z)
    S = np.where(fs, S, 1.0)
    rc = np.where(valid, rc, 0)
    code = {k: np.where(valid, c, BF16) for k, c in code.items()}
    m = gb / (b * d)
    sp = sp & (t > 1)
    tpo = tpo & sp

    # --- shapes -----------------------------------------------------------------------------
    prec = workload.training.precision
    elem = 4.0 if prec == "fp32" else 2.0
    base_prec = "fp32" if prec == "fp32" else ("fp16" if prec == "fp16" else "bf16")
    peak16 = gpu.peak(base_prec) * one
    peak_bf16 = gpu.peak("bf16")
    hbm = gpu.hbm_gbs * 1e9 * ELEM_BW_EFF
    s, f, V = float(model.seq_len), float(model.ffn), float(model.vocab)
    dh = float(model.head_dim)
    kvd_t = np.maximum(kvh, t) * dh / t  # per-GPU K (or V) width; KV heads replicate
    mats = float(model.mlp_mats)
    T = b * s / c  # tokens per micro-batch per GPU
    # Transformer layers on the first, a middle and the last pipeline rank.
    Lf, Lm, Ll = (np.where(valid, x, L / p) for x in stages)
    moe = E > 1
    n_exp_local = np.where(moe, E / ep, 1.0)

    eff16 = GEMM_EFF_MAX * (HOPPER_BF16_EFF if gpu.has_fp8 else 1.0)
    # Peak per format code: BF16 sites run at the training precision's, the others at their
    # own (MXFP8 and MXFP6 at the FP8 rate on Blackwell, MXFP4 and NVFP4 at twice it).
    peak_of = np.array([gpu.peak(f.rate) if f.rate else 0.0 for f in FORMATS])
    any_er = any(bool((c == MXFP4_ER).any()) for c in code.values())

    def gemm(flops, fmt, per_call=1.0):
        """Seconds for GEMM FLOPs issued as ``per_call`` equal GEMMs (one per local expert).

        A GEMM narrower than 16 bits (``fmt``: format codes) runs at its format's peak times
        its own saturating efficiency, which needs a larger GEMM (``FP8_T_HALF_SCALE``) to
        approach its ceiling; MXFP4 with error reduction pays its GEMM overhead on top."""
        low = fmt != BF16
        pk = np.where(low, peak_of[fmt], peak16)
        eff_max = np.where(low, eff16 * FP8_GEMM_EFF, eff16)
        half = np.where(low, GEMM_T_HALF * FP8_T_HALF_SCALE, GEMM_T_HALF)
        sec = flops / (pk * gemm_efficiency(flops / (per_call * pk), eff_max, half))
        if any_er:
            sec = sec * np.where(fmt == MXFP4_ER, 1.0 + MXFP4_ER_GEMM_OVERHEAD, 1.0)
        return sec

    # Forward GEMMs of one layer (per micro-batch, per GPU).
    fl = layer_flops(model, T, t, flash)
    f_attn = fl["attn"]
    f_lm = lm_head_flops(model, T, t)

    t_qkv = gemm(fl["qkv"], code["fp8_qkv"])
    t_out = gemm(fl["attn_out"], code["fp8_attn_out"])
    t_in = gemm(fl["mlp_in"], code["fp8_mlp_in"], n_exp_local)
    t_mo = gemm(fl["mlp_out"], code["fp8_mlp_out"], n_exp_local)
    t_router = gemm(fl["router"], np.zeros(n, dtype=np.int8)) if moe else 0.0
    t_lm = gemm(f_lm, code["fp8_lm_head"])
    gemm_fwd = t_qkv + t_out + t_in + t_mo + t_router
    # Attention core: a fused flash kernel, or two batched GEMMs plus a softmax.
    attn_flash = f_attn / (peak16 * gemm_efficiency(f_attn / peak16, FLASH_EFF))
    attn_plain = f_attn / (peak16 * gemm_efficiency(f_attn / (2.0 * peak16)))
    softmax_bytes = ELEM_SOFTMAX * 2.0 * T * a * s / t
    attn_fwd = np.where(flash, attn_flash, attn_plain + softmax_bytes / hbm)
    attn_bwd = np.where(
        flash, FLASH_BWD * attn_flash, 2.0 * attn_plain + ELEM_BWD * softmax_bytes / hbm
    )
    # Element-wise traffic: h-wide work is replicated across TP ranks unless SP splits it.
    h_split = np.where(sp, t, 1.0)
    act_elems = (3.0 if model.gated_mlp else 2.0) * f * topk
    moe_perm = 4.0 * h * topk if moe else 0.0
    ew_fwd_bytes = (
        elem * T * (ELEM_H * h / h_split + (2.0 * (h / t + kvd_t)) + (act_elems + moe_perm) / t)
    )
    # FP8 casts: every FP8 GEMM input (activations forward, output gradients backward) is
    # read for its amax, then read and written as FP8; the weights are cast (and transposed
    # for the backward) once per micro-batch. Attention, norms, embeddings and the LM head
    # (unless fp8_lm_head) stay in BF16. Elements per token of each site's inputs: forward
    # activation, backward output gradient, and the weight's per micro-batch.
    layer_sites = FP8_SITES[:-1]
    x_in = dict(zip(layer_sites, (h, h / t, h, f * topk / t), strict=True))
    x_grad = dict(
        zip(layer_sites, (h / t + 2 * kvd_t, h, f * (mats - 1) * topk / t, h), strict=True)
    )
    x_w = dict(
        zip(
            layer_sites,
            (h * (h / t + 2 * kvd_t), h * h / t, h * f * (mats - 1) * topk / t, f * h * topk / t),
            strict=True,
        )
    )
    is8 = {k: code[k] == FP8 for k in FP8_SITES}
    act_cast = FP8_CAST_BYTES + FP8_AMAX_BYTES
    w_cast = FP8_CAST_BYTES * sum(is8[k] * x_w[k] for k in layer_sites)
    cast_in = T * sum(is8[k] * x_in[k] for k in layer_sites)
    cast_fwd = act_cast * cast_in + w_cast
    cast_bwd = (
        act_cast * T * sum(is8[k] * x_grad[k] for k in layer_sites)
        + FP8_CAST_BYTES * cast_in / 3.0
        + w_cast / 3.0
    )
    # Block-scaled sites: the same passes at their own bytes per element (an MX tensor's
    # transposed copy is quantised afresh along the other axis: its stored bytes).
    blocked = {k: code[k] > FP8 for k in FP8_SITES}
    any_blocked = any(bool(x.any()) for x in blocked.values())
    if any_blocked:
        cb = {k: np.where(blocked[k], CAST_BYTES[code[k]], 0.0) for k in FP8_SITES}
        ab = {k: cb[k] + np.where(blocked[k], AMAX_BYTES[code[k]], 0.0) for k in FP8_SITES}
        sb = {k: np.where(blocked[k], STORED_BYTES[code[k]], 0.0) for k in FP8_SITES}
        mx_w = sum(cb[k] * x_w[k] for k in layer_sites)
        mx_wt = sum(sb[k] * x_w[k] for k in layer_sites)
        cast_fwd = cast_fwd + T * sum(ab[k] * x_in[k] for k in layer_sites) + mx_w
        cast_bwd = cast_bwd + (
            T * sum(ab[k] * x_grad[k] + sb[k] * x_in[k] for k in layer_sites) + mx_wt
        )
    ew_fwd = (ew_fwd_bytes + cast_fwd) / hbm
    ew_bwd = (ELEM_BWD * ew_fwd_bytes + cast_bwd) / hbm

    layer_fwd = gemm_fwd + attn_fwd + ew_fwd
    layer_bwd = 2.0 * gemm_fwd + attn_bwd + ew_bwd
    layer_rc = np.where(rc == 2, layer_fwd, np.where(rc == 1, attn_fwd, 0.0))

    # LM head and cross entropy (last stage); embedding look-up (first stage).
    lm_cast = FP8_CAST_BYTES * T * h * is8["fp8_lm_head"] * 2.0
    if any_blocked:
        lm_cast = lm_cast + cb["fp8_lm_head"] * T * h * 2.0
    ce = CE_BYTES * T * V / t
    head_fwd = t_lm + (0.75 * ce + lm_cast / 2.0 + elem * T * h * 3.0 / h_split) / hbm
    head_bwd = 2.0 * t_lm + (0.25 * ce + lm_cast / 2.0) / hbm

    # --- tensor-parallel communication ------------------------------------------------------
    bw_t, lat_t = link(gpu, gpn, t, 1.0)
    ar = coll.all_reduce(elem * T * h, t, bw_t, lat_t)  # = reduce-scatter + all-gather
    tp_fwd = 2.0 * ar
    tp_bwd = 2.0 * ar
    tp_rc = np.where(rc == 2, tp_fwd, 0.0)
    tp_exp_plain = tp_fwd + tp_rc + (1.0 - TP_BWD_ASYNC) * tp_bwd
    tp_all = tp_fwd + tp_rc + tp_bwd
    gemm_time_layer = gemm_fwd * (3.0 + (rc == 2))  # forward, recomputed forward, backward
    tp_exp_ovl = np.maximum(tp_all * (1.0 - TP_OVERLAP), tp_all - gemm_time_layer)
    tp_layer = np.where(tpo, tp_exp_ovl, tp_exp_plain)

    # --- context-parallel ring exchange of K and V -----------------------------------------
    bw_c, lat_c = link(gpu, gpn, c, t)
    kv_bytes = elem * T * 2.0 * kvd_t
    cp_step = coll.p2p(kv_bytes, bw_c, lat_c)
    cp_f = np.where(c > 1, (c - 1.0) * cp_step, 0.0)
    cp_fwd = np.maximum(cp_f - CP_OVERLAP * attn_fwd, 0.0)
    cp_bwd = np.maximum(2.0 * cp_f - CP_OVERLAP * attn_bwd, 0.0)
    cp_layer = cp_fwd + cp_bwd + np.where(rc == 2, cp_fwd, 0.0)

    # --- expert-parallel all-to-all (MoE): dispatch and combine, forward and backward -----
    if moe:
        bw_x, lat_x = link(gpu, gpn, ep, t)
        a2a = coll.all_to_all(elem * T * h * topk / np.where(sp, t, 1.0), ep, bw_x, lat_x)
        ep_layer = (4.0 + 2.0 * (rc == 2)) * a2a
    else:
        ep_layer = np.zeros(n)

    # --- per micro-batch time on the slowest pipeline rank ----------------------------------
    head_compute = head_fwd + head_bwd
    per_layer_t = layer_fwd + layer_bwd + layer_rc + tp_layer + cp_layer + ep_layer
    # The first rank also holds the head at pp == 1; a middle rank exists at pp > 2.
    single = np.where(p == 1, 1.0, 0.0)
    t_first = Lf * per_layer_t + single * head_compute
    t_mid = np.where(p > 2, Lm * per_layer_t, 0.0)
    t_last = Ll * per_layer_t + head_compute
    crit = np.argmax(np.stack([t_first, t_mid, t_last]), axis=0)  # 0 first, 1 middle, 2 last
    Lc = np.choose(crit, [Lf, Lm, Ll])  # layers on the critical rank
    head_c = np.where(crit == 2, 1.0, single) * head_compute
    body_compute = Lc * (layer_fwd + layer_bwd)
    body_rc = Lc * layer_rc
    body_tp = Lc * tp_layer
    body_cp = Lc * cp_layer
    body_ep = Lc * ep_layer
    # Pipeline sends: forward activation and backward gradient per model chunk boundary.
    bw_p, lat_p = link(gpu, gpn, p, t * c * d)
    p2p = coll.p2p(elem * T * h / t, bw_p, lat_p)
    pp_mb = np.where(p > 1, PP_EXPOSED * 2.0 * v * p2p, 0.0)
    mb_max = np.maximum(np.maximum(t_first, t_mid), t_last) + pp_mb
    mb_avg = (L * per_layer_t + head_compute) / p + pp_mb

    # --- parameters per GPU -----------------------------------------------------------------
    attn_p, mlp_p = model.layer_params()
    expert_p = mlp_p if moe else 0.0
    dense_layer = attn_p + (0.0 if moe else mlp_p) + 4.0 * h
    emb = V * h / t
    # The output layer is its own matrix unless tied to the embedding on a single stage
    # (with pp > 1 Megatron keeps a tied copy on the last stage).
    head = np.where((p == 1) & model.tied_embeddings, 0.0, emb)
    per_dense = dense_layer / t
    per_exp = expert_p / (t * ep)
    exp_f, exp_m, exp_l = Lf * per_exp, Lm * per_exp, Ll * per_exp
    # First rank holds the embedding, last rank the LM head (one rank holds both at pp == 1).
    p_first = Lf * per_dense + exp_f + emb + single * head
    p_mid = np.where(p > 2, Lm * (per_dense + per_exp), 0.0)
    p_last = Ll * per_dense + exp_l + head + single * emb
    p_rank = np.maximum(np.maximum(p_first, p_mid), p_last)
    exp_body = np.maximum(np.maximum(exp_f, np.where(p > 2, exp_m, 0.0)), exp_l)
    p_dense = p_rank - exp_body

    # --- data parallel ----------------------------------------------------------------------
    grad_b = np.where(fp32_grads, 4.0, 2.0)
    n_dp = d * c
    bw_d, lat_d = link(gpu, gpn, n_dp, t)
    n_edp = n_dp / ep
    bw_e, lat_e = link(gpu, gpn, n_edp, t * ep)

    def dp_colls(params, n_grp, bw, lat):
        rs = coll.reduce_scatter(params * grad_b, n_grp, bw, lat)
        ag = coll.all_gather(params * elem, n_grp, bw, lat)
        arr_ = coll.all_reduce(params * grad_b, n_grp, bw, lat)
        return rs, ag, arr_

    rs_d, ag_d, ar_d = dp_colls(p_dense, n_dp, bw_d, lat_d)
    rs_e, ag_e, ar_e = dp_colls(exp_body, n_edp, bw_e, lat_e) if moe else (0.0, 0.0, 0.0)
    rs, ag, ar_g = rs_d + rs_e, ag_d + ag_e, ar_d + ar_e
    bucket = np.minimum(1.0, DP_BUCKET_PARAMS / np.maximum(p_rank, 1.0))
    win_bwd = Lc * layer_bwd + head_bwd / p
    win_fwd = Lc * layer_fwd + head_fwd / p

    def hidden(comm, window, on, tail):
        return np.where(on, np.maximum(comm - window, comm * tail), comm)

    grad_once = np.where(z == 0, ar_g, rs)
    dp_grad = np.where(
        z >= 2, m * hidden(rs, win_bwd, ovl_g, bucket), hidden(grad_once, win_bwd, ovl_g, bucket)
    )
    dp_grad = np.where(
        z == 3, m * hidden(rs + ag, win_bwd, ovl_g, 1.0 / np.maximum(Lc, 1)), dp_grad
    )
    dp_param = np.where(z == 0, 0.0, hidden(ag, win_fwd, ovl_p, bucket))
    dp_param = np.where(z == 3, m * hidden(ag, win_fwd, ovl_p, 1.0 / np.maximum(Lc, 1)), dp_param)
    dp_comm = dp_grad + dp_param
    # FSDP: every micro-batch gathers each layer's weights for forward (and again for backward
    # after resharding) and reduce-scatters its gradients, prefetched one layer ahead; HSDP
    # then all-reduces the sharded gradients across the replicas once per step.
    bw_s, lat_s = link(gpu, gpn, S, t)
    fs_ag = coll.all_gather(p_rank * elem, S, bw_s, lat_s)
    fs_rs = coll.reduce_scatter(p_rank * FSDP_REDUCE_BYTES, S, bw_s, lat_s)
    reps = np.maximum(n_dp / S, 1.0)
    bw_r, lat_r = link(gpu, gpn, reps, t * S)
    fs_ar = coll.all_reduce(p_rank / S * FSDP_REDUCE_BYTES, reps, bw_r, lat_r)
    first = 1.0 / np.maximum(Lc, 1.0)  # the first layer's gather waits for nothing
    fs_mb = hidden(fs_ag, win_fwd, True, first) + hidden(
        np.where(reshard, fs_ag, 0.0) + fs_rs, win_bwd, True, first
    )
    dp_comm = np.where(fs, m * fs_mb + hidden(fs_ar, win_bwd, True, first), dp_comm)

    # --- optimizer --------------------------------------------------------------------------
    opt = workload.training.optimizer
    shard = np.where(fs, S, np.where(z >= 1, n_dp, 1.0))
    eshard = np.where(z >= 1, n_edp, 1.0)
    opt_params = p_dense / shard + exp_body / eshard
    t_opt = opt_params * OPT_STEP_BYTES.get(opt, 34.0) / hbm + STEP_OVERHEAD_S

    # --- step -------------------------------------------------------------------------------
    bubble = (p - 1.0) / v * mb_avg
    pipe = m * mb_max + bubble
    nodes = max(ngpu / gpn, 1.0)
    jitter = 1.0 + NODE_JITTER * np.log2(nodes)  # reported as its own part of the step
    step = (pipe + dp_comm + t_opt) * jitter

    # --- memory (bytes per GPU, on the first and on the last pipeline rank) ------------------
    w_b = elem
    state_b = OPT_STATE_BYTES.get(opt, 12.0)
    gbuf = np.where(z >= 2, 1.0 / shard, 1.0)
    wbuf = np.where(z >= 3, 1.0 / shard, 1.0)

    def model_state(dense, experts):
        """(weights, gradients, optimizer state) bytes; experts shard over dp*cp/ep ranks."""
        ebuf_w = np.where(z >= 3, 1.0 / eshard, 1.0)
        ebuf_g = np.where(z >= 2, 1.0 / eshard, 1.0)
        weights = (dense * wbuf + experts * ebuf_w) * w_b
        weights = weights + np.where(z >= 3, 2.0 * (dense_layer / t) * w_b, 0.0)
        grads = (dense * gbuf + experts * ebuf_g) * grad_b
        optim = (dense / shard + experts / eshard) * state_b
        return weights, grads, optim

    def fsdp_state(params, weights, grads, optim):
        """FSDP's (weights, gradients, optimizer state): sharded fp32 parameters, gradients
        and moments, plus the gathered BF16 layers (the one computing and the one prefetched,
        or every layer of the rank between forward and backward without resharding) and one
        layer's unsharded gradient."""
        layer = np.maximum(dense_layer / t, np.maximum(emb, head))
        live = np.where(reshard, 2.0 * layer, params)
        sw = params * 4.0 / S + live * elem
        sg = params * 4.0 / S + layer * elem
        so = params * (FSDP_STATE_BYTES - 8.0) / S
        return (np.where(fs, sw, weights), np.where(fs, sg, grads), np.where(fs, so, optim))

    w_f, g_f, o_f = fsdp_state(p_first, *model_state(p_first - exp_f, exp_f))
    w_m, g_m, o_m = fsdp_state(p_mid, *model_state(p_mid - exp_m, exp_m))
    w_l, g_l, o_l = fsdp_state(p_last, *model_state(p_last - exp_l, exp_l))
    fp8_saved = T * 0.0 + (
        is8["fp8_qkv"] * h / h_split
        + is8["fp8_mlp_in"] * h / h_split
        + is8["fp8_mlp_out"] * f * topk / t
    ) * (elem / 2.0)
    if any_blocked:  # a block-scaled input kept for backward: its stored bytes, not 2
        sv = {k: np.where(blocked[k], 2.0 - STORED_BYTES[code[k]], 0.0) for k in FP8_SITES}
        fp8_saved = fp8_saved + (
            sv["fp8_qkv"] * h / h_split
            + sv["fp8_mlp_in"] * h / h_split
            + sv["fp8_mlp_out"] * f * topk / t
        ) * (elem / 2.0)
    per_layer = activation_bytes_per_layer(model, T, t, sp, rc, flash, elem, fp8_saved)
    layer_full = activation_bytes_per_layer(model, T, t, sp, 0, flash, elem, fp8_saved)
    # Rank r keeps p - r micro-batches in 1F1B, and 2(p - r - 1) + (v - 1) p + 1 model
    # chunks in the interleaved warm-up (see layers_in_flight), each of its layers / v.
    inflight_first = layers_in_flight(p * Lf, p, v, m)
    chunks_mid = np.where(
        v > 1, np.minimum(m * v, 2.0 * (p - 2.0) + (v - 1.0) * p + 1.0), np.minimum(m, p - 1.0)
    )
    inflight_mid = chunks_mid * Lm / v
    chunks_last = np.where(v > 1, np.minimum(m * v, (v - 1.0) * p + 1.0), 1.0)
    inflight_last = np.where(p > 1, chunks_last * Ll / v, inflight_first)
    mbs_first = np.where(v > 1, np.minimum(m, p + 1.0), np.minimum(m, p))
    emb_act = mbs_first * T * h / h_split  # embedding dropout mask, 1 byte
    logits = LOGIT_BYTES * T * V / t
    work = np.where(rc == 2, layer_full, 0.0)
    act_f = inflight_first * per_layer + emb_act + work + single * logits
    act_m = inflight_mid * per_layer + work
    act_l = inflight_last * per_layer + logits + work + single * emb_act
    over_f = MEM_BASE + MEM_FRAG * act_f
    over_m = MEM_BASE + MEM_FRAG * act_m
    over_l = MEM_BASE + MEM_FRAG * act_l
    tot_f = w_f + g_f + o_f + act_f + over_f
    tot_m = np.where(p > 2, w_m + g_m + o_m + act_m + over_m, 0.0)
    tot_l = w_l + g_l + o_l + act_l + over_l
    busiest = np.argmax(np.stack([tot_f, tot_m, tot_l]), axis=0)  # ties: the first rank

    def pick(first, mid, last):
        return np.choose(busiest, [first * one, mid * one, last * one])

    memory = {
        "weights": pick(w_f, w_m, w_l),
        "grads": pick(g_f, g_m, g_l),
        "optimizer": pick(o_f, o_m, o_l),
        "activations": pick(act_f, act_m, act_l),
        "overhead": pick(over_f, over_m, over_l),
    }
    peak = np.where(valid, np.maximum(np.maximum(tot_f, tot_m), tot_l), 0.0)
    memory = {k: np.where(valid, x, 0.0) for k, x in memory.items()}
    cap = hbm_capacity(gpu)
    fits = valid & (peak <= cap)
    oom = valid & ~fits
    if oom.any():
        idx = np.flatnonzero(oom)
        parts = np.stack([memory[k][idx] for k in ("weights", "grads", "optimizer", "activations")])
        names = np.array(["weights", "gradients", "optimizer state", "activations"])
        big = np.argmax(parts, axis=0)
        reason[idx] = _fmt(
            "out of memory: %.1f GiB needed > %.0f GiB HBM (%s %.1f GiB)",
            peak[idx] / GIB,
            np.full(idx.size, gpu.hbm_gb),
            names[big],
            parts[big, np.arange(idx.size)] / GIB,
        )

    # --- outputs ----------------------------------------------------------------------------
    breakdown = {
        "compute": m * (body_compute + head_c),
        "recompute": m * body_rc,
        "tp_comm": m * body_tp,
        "cp_comm": m * body_cp,
        "ep_comm": m * body_ep,
        "pp_comm": m * pp_mb,
        "dp_comm": dp_comm,
        "bubble": bubble,
        "optimizer": t_opt,
    }
    breakdown["jitter"] = step - (pipe + dp_comm + t_opt)
    step = np.where(valid, step, np.inf)
    tokens = gb * s
    throughput = np.where(valid, tokens / step, 0.0)
    mfu = np.where(valid, tokens * model.flops_per_token() / (step * ngpu * peak_bf16), 0.0)
    return SimResult(
        kind="llm",
        step_time=step,
        throughput=throughput,
        throughput_unit="tokens/s",
        mfu=mfu,
        peak_memory=peak,
        fits=fits,
        valid=valid,
        reason=reason,
        error_score=err,
        breakdown={k: np.where(valid, x * one, 0.0) for k, x in breakdown.items()},
        memory=memory,
    )


def _format_checks(
    gpu: GPU, code: Mapping[str, np.ndarray], conflict: Mapping[str, np.ndarray], arr: Mapping
) -> list[tuple[np.ndarray, str, tuple]]:
    """Why a GEMM site's format cannot run: a name that is no format, a format knob that
    contradicts the site's FP8 switch, or a block-scaled format the GPU's tensor cores lack."""
    checks: list[tuple[np.ndarray, str, tuple]] = []
    has = ", ".join(("bf16", *gpu.formats))
    lacking = [NAMES.index(f) for f in BLOCK_SCALED if f not in gpu.formats]
    if MXFP4 in lacking:
        lacking.append(MXFP4_ER)
    for k in FP8_SITES:
        knob, c = FORMAT_KNOBS[k], code[k]
        checks.append((c == UNKNOWN, f"invalid: {knob} must be one of {', '.join(NAMES)}", ()))
        if knob in arr and conflict[k].any():
            msg = f"invalid: {k} (FP8 with per-tensor scaling) contradicts {knob}=%s"
            checks.append((conflict[k], msg, (arr[knob],)))
        if not lacking or not np.isin(c, lacking).any():
            continue
        for name in BLOCK_SCALED:
            i = NAMES.index(name)
            if i not in lacking:
                continue
            bad = (c == i) | (c == MXFP4_ER) if i == MXFP4 else c == i
            msg = f"invalid: {knob}={name} needs {name.upper()} tensor cores; {gpu.name} has {has}"
            checks.append((bad, msg, ()))
    return checks


def _stage_layers(
    L: int, p: np.ndarray, v: np.ndarray, first: np.ndarray, last: np.ndarray, emb: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], list[tuple[np.ndarray, str, tuple]]]:
    """Transformer layers on the first, a middle and the last pipeline rank, and the
    validity checks of the split.

    Megatron-Core's rules: an even split needs ``pp * vp`` to divide the layers; with
    ``first_stage_layers`` and/or ``last_stage_layers`` the other ranks share the rest
    evenly; with ``embedding_loss_in_split`` the embedding and the loss each take the place
    of one layer, so ``pp * vp`` must divide ``layers + 2`` and the first and last ranks hold
    one layer fewer. Otherwise every rank's layers split evenly into its ``vp`` model chunks.
    """
    n = p.shape[0]
    has_f, has_l = ~np.isnan(first), ~np.isnan(last)
    uneven = has_f | has_l
    f0, l0 = np.where(has_f, first, 0.0), np.where(has_l, last, 0.0)
    lf, mid, ll = stage_layers(L, p, first, last, emb)
    whole = lambda x: np.fmod(x, np.maximum(v, 1.0)) != 0  # noqa: E731
    chunked = whole(lf) | whole(ll) | ((p > 2) & whole(mid))
    plain = ~uneven & ~emb
    checks: list[tuple[np.ndarray, str, tuple]] = [
        (
            plain & (np.fmod(L, np.maximum(p * v, 1)) != 0),
            "invalid: pp*vp=%d does not divide %d layers (first_stage_layers, "
            "last_stage_layers or embedding_loss_in_split make an uneven split)",
            (p * v, np.full(n, L)),
        ),
        (
            (uneven | emb) & (p < 2),
            "invalid: an uneven pipeline split needs pp>1",
            (),
        ),
        (
            uneven & emb,
            "invalid: embedding_loss_in_split and first/last_stage_layers exclude each other",
            (),
        ),
        (
            uneven
            & (p >= 2)
            & ((f0 < 0) | (l0 < 0) | (mid < 1) | (mid != np.floor(mid)))
            & ~((p == 2) & has_f & has_l & (f0 + l0 == L)),
            "invalid: the %d layers left after the first and last stages do not split "
            "evenly over the other pipeline ranks",
            (L - f0 - l0,),
        ),
        (
            emb & ~uneven & (p >= 2) & (np.fmod(L + 2.0, np.maximum(p * v, 1)) != 0),
            "invalid: pp*vp=%d does not divide %d layers plus the embedding and the loss",
            (p * v, np.full(n, L)),
        ),
        (
            uneven & (p >= 2) & chunked,
            "invalid: a pipeline rank's layers do not split into vp=%d model chunks",
            (v,),
        ),
        (
            uneven & (((lf < 1) & has_f) | ((ll < 1) & has_l)),
            "invalid: first_stage_layers and last_stage_layers must be at least 1",
            (),
        ),
    ]
    return (lf, mid, ll), checks


def bench_llm(n: int = 200_000, seed: int = 0) -> float:
    """Configurations priced per second on one core, over random (mostly valid) layouts."""
    rng = np.random.default_rng(seed)
    wl = PRESETS["llama3_70b"]
    configs = {
        "tp": rng.choice([1, 2, 4, 8], n),
        "pp": rng.choice([1, 2, 4, 8, 16], n),
        "cp": rng.choice([1, 2], n),
        "vp": rng.choice([1, 1, 2, 5], n),
        "micro_batch": rng.choice([1, 2, 4], n),
        "zero_stage": rng.choice([0, 1, 2, 3], n),
        "recompute": rng.choice(np.array(RECOMPUTE, dtype=object), n),
        "sequence_parallel": rng.random(n) < 0.7,
        "fp8_mlp_in": rng.random(n) < 0.5,
        "fp8_mlp_out": rng.random(n) < 0.5,
        "overlap_grad_reduce": rng.random(n) < 0.5,
        "overlap_param_gather": rng.random(n) < 0.5,
    }
    simulate_llm(wl, {k: x[:1000] for k, x in configs.items()})
    start = time.perf_counter()
    simulate_llm(wl, configs)
    return n / (time.perf_counter() - start)


__all__ = [
    "DEFAULTS",
    "FORMAT_KNOBS",
    "FP8_ERROR_WEIGHTS",
    "FP8_SITES",
    "activation_bytes_per_layer",
    "bench_llm",
    "bubble_fraction",
    "gemm_efficiency",
    "hbm_capacity",
    "layer_flops",
    "layers_in_flight",
    "lm_head_flops",
    "simulate_llm",
]

"""Error-bounded lossy compression of DLRM's pooled-embedding exchange: fixed or adaptive.

A cuSZ-class compressor shrinks the fp32 pooled embeddings (and their gradients) before the
all-to-all, at a ratio that grows with the relative error bound, for a compression and
decompression pass at a fraction of HBM bandwidth. With one *fixed* bound every table and
every step get the same bound.

The *adaptive* exchange follows Feng et al., "Accelerating Communication in Deep Learning
Recommendation Model Training with Dual-Level Adaptive Lossy Compression" (SC'24,
arXiv 2407.04272), which reports a 1.38x end-to-end training speed-up on DLRM / Criteo at a
minimal accuracy cost. Its two levels:

* table-wise: tables are ranked by how sensitive the model's accuracy is to error in their
  embeddings; a table that tolerates error gets a larger bound, a sensitive one a smaller;
* iteration-wise: the bound is looser early in training, when the model is far from its
  optimum and compression noise is small beside gradient noise, and tighter later.

How that is priced here (the spreads are this model's assumptions, not the paper's figures):

* A table's sensitivity falls with its size and traffic, ``log(rows * pooling)``: from
  :data:`TABLE_SENSITIVITY_SPAN` times the average for the workload's smallest, coldest
  table down to its inverse for the largest, hottest one. Training runs through
  :data:`PHASES`, each with a share of the steps and a sensitivity.
* ``lossy_error_bound`` stays the error budget: each (table, phase) gets a bound inversely
  proportional to its sensitivity, every one of them spending the same share of the budget,
  scaled so that the sensitivity-weighted error equals that of the fixed bound (bounds
  beyond :data:`ADAPTIVE_MAX_BOUND` are capped, which only lowers the error).
* Only tables whose embeddings cross the exchange (those not sharded data-parallel) are
  weighted, by their pooled width; the wire bytes per element average ``4 / ratio(bound)``
  over them and over the phases, on the fixed bound's ratio curve. Because that curve is
  concave in the bound, the same error buys a larger average ratio once the bound follows
  the sensitivity.
* The compressor runs at the fixed bound's throughput: it reads each table's bound in the
  same pass, the table-wise bounds are set once before training and the phase schedule
  changes them a few times per run, so choosing the bounds adds nothing per step.

Every function works on arrays: one call prices many configurations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cubic.workload import EmbeddingTable

#: Throughput of error-bounded lossy compression (cuSZ-class) as a fraction of HBM bandwidth,
#: and its ratio: 4 at a 1e-3 bound rising to 10 at 5e-2 (log-linear in the bound).
LOSSY_HBM_FRAC = 0.1
LOSSY_RATIO_AT_1E3 = 4.0
LOSSY_RATIO_SLOPE = math.log(10.0 / 4.0) / math.log(5e-2 / 1e-3)
#: Numerical-error score of a lossy exchange per unit of its (fixed) relative error bound.
ERR_LOSSY_PER_BOUND = 40.0

#: Table-wise level: sensitivities run from this (the workload's smallest, coldest table)
#: down to its inverse (the largest, hottest), log-linear in ``rows * pooling`` between.
TABLE_SENSITIVITY_SPAN = 4.0
#: Iteration-wise level: (share of the training steps, sensitivity) per phase, early to late.
PHASES = ((0.25, 0.25), (0.5, 1.0), (0.25, 2.0))
#: Largest bound the adaptive exchange gives any table in any phase: twice the loosest
#: fixed bound the shipped space offers, so the ratio curve is not stretched far beyond
#: where it was read.
ADAPTIVE_MAX_BOUND = 0.1


def lossy_ratio(error_bound) -> np.ndarray:
    """Compression ratio of the lossy all-to-all: ~4 at a 1e-3 bound, ~10 at 5e-2."""
    eb = np.clip(np.asarray(error_bound, dtype=float), 1e-6, 0.5)
    return np.maximum(1.0, LOSSY_RATIO_AT_1E3 * (eb / 1e-3) ** LOSSY_RATIO_SLOPE)


def table_sensitivity(tables: Sequence[EmbeddingTable]) -> np.ndarray:
    """Relative sensitivity of each table to error in its embeddings.

    Tables are placed by ``log(rows * pooling)`` between the workload's smallest, coldest
    table (sensitivity :data:`TABLE_SENSITIVITY_SPAN`) and its largest, hottest one
    (``1 / TABLE_SENSITIVITY_SPAN``); tables alike in size and traffic are alike.
    """
    size = np.log(np.array([max(t.rows, 1) * max(t.pooling, 1e-9) for t in tables], float))
    lo, hi = size.min(), size.max()
    z = (size - lo) / (hi - lo) if hi > lo else np.full(len(size), 0.5)
    return TABLE_SENSITIVITY_SPAN ** (1.0 - 2.0 * z)


def adaptive_plan(base_bound, weight, sensitivity) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-(table, phase) bounds, wire bytes per element and error factor of adaptive plans.

    ``base_bound`` (k,) is each plan's error budget as a fixed bound; ``weight`` (k, tables)
    each table's share of the exchange (pooled width, 0 for a table that does not cross
    it); ``sensitivity`` (tables,) from :func:`table_sensitivity`. Returns the bounds
    (k, tables, phases), the bytes per element averaged over the exchanged tables and the
    phases (k,), and the error as a share of the fixed bound's (k,; at most 1).
    """
    b = np.asarray(base_bound, dtype=float)
    k = len(b)
    share = np.array([p[0] for p in PHASES])
    sens = np.asarray(sensitivity, dtype=float)[:, None] * np.array([p[1] for p in PHASES])
    w = np.asarray(weight, dtype=float)[:, :, None] * share  # (k, tables, phases)

    def total(x: np.ndarray) -> np.ndarray:
        # One row per plan, summed in the same order whatever k is (batch == one by one).
        return np.ascontiguousarray(np.broadcast_to(x, w.shape)).reshape(k, -1).sum(axis=1)

    w_sum = total(w)
    ws_sum = total(w * sens)
    # Equal error per cell (bound x sensitivity), scaled so that the weighted error is the
    # fixed bound's: bound_ij = budget * mean_w(sensitivity) / sensitivity_ij.
    scale = ws_sum / w_sum
    bounds = np.minimum((b * scale)[:, None, None] / sens, ADAPTIVE_MAX_BOUND)
    q = total(w * (4.0 / lossy_ratio(bounds))) / w_sum
    err = total(w * sens * bounds) / (ws_sum * b)
    return bounds, q, err


def adaptive_exchange(
    tables: Sequence[EmbeddingTable], table_class: np.ndarray, base_bound, exchanged
) -> tuple[np.ndarray, np.ndarray]:
    """Wire bytes per element and error factor of the adaptive exchange, per configuration.

    ``table_class`` (tables,) is each table's class index; ``exchanged`` (n, classes) says
    which classes' embeddings cross the exchange in each configuration (a configuration
    where none does weighs every table, as the error score still counts its bound). Plans
    are priced once per distinct (classes exchanged, bound).
    """
    bound = np.asarray(base_bound, dtype=float)
    ex = np.asarray(exchanged, dtype=bool)
    ex = np.where(ex.any(axis=1, keepdims=True), ex, True)
    code = ex @ (1 << np.arange(ex.shape[1]))
    _, b_idx = np.unique(bound, return_inverse=True)
    key = b_idx.reshape(-1) * (1 << ex.shape[1]) + code
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    dims = np.array([float(t.dim) for t in tables])
    weight = ex[first][:, np.asarray(table_class)] * dims
    # Classes that hold no table of this workload cross nothing: weigh every table instead.
    weight = np.where(weight.sum(axis=1, keepdims=True) > 0, weight, dims)
    _, q, err = adaptive_plan(bound[first], weight, table_sensitivity(tables))
    inv = inv.reshape(-1)
    return q[inv], err[inv]

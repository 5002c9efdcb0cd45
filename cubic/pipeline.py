"""How a model's transformer layers split over pipeline ranks, by Megatron-Core's rules.

The simulator prices each rank and the proxy's memory arithmetic sizes the busiest one, so
both read the split from here: an even split (``pp * vp`` divides the layers), explicit
``first_stage_layers``/``last_stage_layers`` with the other ranks sharing the rest, or
``embedding_loss_in_split`` (Megatron-Core's account_for_embedding/loss_in_pipeline_split),
where the embedding and the loss each take the place of one layer, so that Llama 3.1 405B's
126 layers fill 16 stages of 8 with one fewer on the first and last.
"""

from __future__ import annotations

import numpy as np


def stage_layers(
    layers: float,
    pp: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    embedding_loss: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Transformer layers on the first, a middle and the last pipeline rank.

    ``first``/``last`` are NaN where not given. At ``pp == 1`` the one rank holds every
    layer (first) and the last rank none. Counts that no valid split gives (fractions,
    below one) come back as they are: the caller's checks refuse them.
    """
    pp = np.asarray(pp, dtype=float)
    first, last = np.asarray(first, dtype=float), np.asarray(last, dtype=float)
    emb = np.asarray(embedding_loss, dtype=bool)
    has_f, has_l = ~np.isnan(first), ~np.isnan(last)
    uneven = has_f | has_l
    f0, l0 = np.where(has_f, first, 0.0), np.where(has_l, last, 0.0)
    others = np.maximum(pp - has_f - has_l, 1.0)
    per_rank_e = (layers + 2.0) / pp
    mid = np.where(uneven, (layers - f0 - l0) / others, np.where(emb, per_rank_e, layers / pp))
    lf = np.where(has_f, first, np.where(emb & ~uneven, per_rank_e - 1.0, mid))
    ll = np.where(has_l, last, np.where(emb & ~uneven, per_rank_e - 1.0, mid))
    return np.where(pp == 1, float(layers), lf), mid, np.where(pp == 1, 0.0, ll)


def activation_layers(
    first: np.ndarray, mid: np.ndarray, last: np.ndarray, pp, vp, microbatches
) -> np.ndarray:
    """Layers' worth of activations the busiest rank keeps at its peak.

    Rank ``r`` keeps ``p - r`` micro-batches in 1F1B and ``2(p - r - 1) + (v - 1) p + 1``
    model chunks of ``layers / v`` in the interleaved warm-up (Narayanan et al. SC21), capped
    by ``m v`` chunks; the first, the second and the last rank bound every other."""
    p, v, m = (np.asarray(x, dtype=float) for x in (pp, vp, microbatches))

    def chunks(r: float | np.ndarray) -> np.ndarray:
        inter = np.minimum(m * v, 2.0 * (p - r - 1.0) + (v - 1.0) * p + 1.0)
        return np.where(v > 1, inter, np.minimum(m, p - r))

    out = chunks(0.0) * first / v
    out = np.maximum(out, np.where(p > 2, chunks(1.0) * mid / v, 0.0))
    return np.maximum(out, np.where(p > 1, chunks(p - 1.0) * last / v, 0.0))

"""Collectives priced with an alpha-beta model per link tier.

A group whose ranks all sit in one node talks over NVLink; any other group is bound by the
per-GPU NIC, as NCCL's rings are across nodes. Rank order follows Megatron-LM
(tensor innermost, then context, then data, then pipeline), so a group of ``size`` ranks
spaced ``stride`` apart stays inside a node when ``stride * size <= gpus_per_node``.
Every function takes NumPy arrays (or scalars) and broadcasts.

Bandwidths are scaled by the bus efficiency that NCCL's own tests report on these links
(about 80 % of NVLink, 90 % of InfiniBand line rate).
"""

from __future__ import annotations

import numpy as np

from cubic.hardware import GPU

NVLINK_EFF = 0.80
NIC_EFF = 0.90


def tier(gpu: GPU, gpus_per_node: int, size, stride) -> tuple[np.ndarray, np.ndarray]:
    """(bandwidth in bytes/s, latency in s) of a group of ``size`` ranks ``stride`` apart."""
    size = np.asarray(size)
    intra = np.asarray(stride) * size <= gpus_per_node
    bw = np.where(intra, gpu.nvlink_gbs * NVLINK_EFF, gpu.nic_gbs * NIC_EFF) * 1e9
    lat = np.where(intra, gpu.nvlink_latency_us, gpu.nic_latency_us) * 1e-6
    return bw, lat


def all_reduce(nbytes, n, bw, lat) -> np.ndarray:
    """Ring all-reduce of a buffer of ``nbytes`` over ``n`` ranks."""
    n = np.asarray(n, dtype=float)
    t = 2.0 * (n - 1.0) / n * nbytes / bw + 2.0 * (n - 1.0) * lat
    return np.where(n > 1, t, 0.0)


def reduce_scatter(nbytes, n, bw, lat) -> np.ndarray:
    """Ring reduce-scatter (or all-gather) of a full buffer of ``nbytes`` over ``n`` ranks."""
    n = np.asarray(n, dtype=float)
    t = (n - 1.0) / n * nbytes / bw + (n - 1.0) * lat
    return np.where(n > 1, t, 0.0)


all_gather = reduce_scatter


def all_to_all(nbytes, n, bw, lat) -> np.ndarray:
    """All-to-all where each rank holds ``nbytes`` and keeps 1/n of it."""
    n = np.asarray(n, dtype=float)
    t = (n - 1.0) / n * nbytes / bw + (n - 1.0) * lat
    return np.where(n > 1, t, 0.0)


def p2p(nbytes, bw, lat) -> np.ndarray:
    """One point-to-point send."""
    return np.asarray(nbytes) / bw + lat

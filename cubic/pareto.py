"""Pareto fronts: non-dominated sorting, hypervolume and the reference-point rule.

Every function here takes points as rows of an ``(n, m)`` array in which each column is to
be *maximised*; :func:`oriented` turns a study's objective values (some minimised) into
that form. Optuna computes hypervolumes only in private modules (``optuna._hypervolume``),
so cubic keeps its own, small and vectorised: the 2-D cases (what a study of throughput
against cost or memory needs) are exact sweeps in NumPy, and more objectives fall back to
an exact slicing recursion meant for the few dozen points a study measures.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REFERENCE_MARGIN = 0.1
"""How far beyond the nadir the reference point lies, as a share of each objective's range
over the front (the usual rule: the nadir plus a tenth of the range)."""


def oriented(
    values: np.ndarray | Sequence[Sequence[float]], directions: Sequence[str]
) -> np.ndarray:
    """``values`` (rows of objective values) with every minimised column negated."""
    v = np.asarray(values, dtype=float).reshape(-1, len(directions))
    sign = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
    return v * sign


def _points(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    p = np.asarray(points, dtype=float)
    if p.ndim != 2:
        raise ValueError(f"points must be a 2-D array (n, m), got shape {p.shape}")
    return p


def non_dominated(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """Whether each point is on the Pareto front (no other point is at least as good in every
    objective and better in one). Equal points do not dominate each other: both stay."""
    p = _points(points)
    n, m = p.shape
    if n == 0:
        return np.zeros(0, dtype=bool)
    if m == 1:
        return p[:, 0] == p[:, 0].max()
    if m == 2:
        return _non_dominated_2d(p)
    out = np.ones(n, dtype=bool)
    step = max(1, 4_000_000 // max(1, n * m))
    for lo in range(0, n, step):
        block = p[lo : lo + step]
        ge = (p[None, :, :] >= block[:, None, :]).all(axis=2)
        gt = (p[None, :, :] > block[:, None, :]).any(axis=2)
        out[lo : lo + step] = ~(ge & gt).any(axis=1)
    return out


def _non_dominated_2d(p: np.ndarray) -> np.ndarray:
    """The 2-D front by one sort: ``O(n log n)``, for the millions of a true front."""
    x, y = p[:, 0], p[:, 1]
    order = np.lexsort((-y, -x))  # x descending, then y descending
    xs, ys = x[order], y[order]
    new_x = np.r_[True, xs[1:] != xs[:-1]]  # the first (highest y) of each x group
    group = np.cumsum(new_x) - 1
    group_top = ys[new_x][group]  # the highest y of the point's own x group
    # The highest y among points of strictly greater x: the running max up to the group.
    run = np.maximum.accumulate(ys)
    before = np.r_[-np.inf, run[:-1]][new_x][group]
    dominated = (before >= ys) | (group_top > ys)
    out = np.empty(len(p), dtype=bool)
    out[order] = ~dominated
    return out


def fronts(points: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """Non-dominated sorting: each point's front number (0 for the Pareto front, 1 for the
    front of what remains, ...)."""
    p = _points(points)
    rank = np.full(len(p), -1)
    left = np.arange(len(p))
    level = 0
    while len(left):
        on = non_dominated(p[left])
        rank[left[on]] = level
        left = left[~on]
        level += 1
    return rank


def reference_point(
    points: np.ndarray | Sequence[Sequence[float]], margin: float = REFERENCE_MARGIN
) -> np.ndarray:
    """The reference point of a front: its nadir (the worst value of each objective over the
    front) moved ``margin`` of the front's range further, so that the front's extreme points
    count. An objective with no range (one point) moves by ``margin`` of its magnitude (or by
    ``margin`` if that is zero)."""
    p = _points(points)
    if len(p) == 0:
        raise ValueError("a reference point needs at least one point")
    front = p[non_dominated(p)]
    nadir, ideal = front.min(axis=0), front.max(axis=0)
    span = ideal - nadir
    span = np.where(span > 0, span, np.where(np.abs(nadir) > 0, np.abs(nadir), 1.0))
    return nadir - margin * span


def _beyond(p: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The points that strictly beat the reference in every objective."""
    return p[(p > ref).all(axis=1)] if len(p) else p


def hypervolume(
    points: np.ndarray | Sequence[Sequence[float]], reference: Sequence[float] | np.ndarray
) -> float:
    """The volume dominated by ``points`` and bounded by ``reference`` (all maximised)."""
    p = _points(points)
    ref = np.asarray(reference, dtype=float)
    if len(p) and p.shape[1] != len(ref):
        raise ValueError(f"points have {p.shape[1]} objectives, the reference {len(ref)}")
    p = _beyond(p, ref)
    if len(p) == 0:
        return 0.0
    p = p[non_dominated(p)]
    if p.shape[1] == 1:
        return float(p[:, 0].max() - ref[0])
    if p.shape[1] == 2:
        order = np.argsort(-p[:, 0], kind="stable")
        x, y = p[order, 0], p[order, 1]
        widths = x - np.r_[x[1:], ref[0]]
        return float(np.sum(widths * (y - ref[1])))
    return _slice_volume(p, ref)


def _slice_volume(p: np.ndarray, ref: np.ndarray) -> float:
    """Hypervolume by slicing along the last objective (exact, for small sets)."""
    if p.shape[1] == 2:
        return hypervolume(p, ref)
    order = np.argsort(-p[:, -1], kind="stable")
    p = p[order]
    levels = np.r_[p[:, -1], ref[-1]]
    total = 0.0
    for i in range(len(p)):
        depth = levels[i] - levels[i + 1]
        if depth > 0:
            total += depth * hypervolume(p[: i + 1, :-1], ref[:-1])
    return float(total)


def improvement_2d(
    candidates: np.ndarray, front: np.ndarray, reference: Sequence[float] | np.ndarray
) -> np.ndarray:
    """How much each candidate (rows of ``candidates``) would add to the 2-D hypervolume of
    ``front`` (vectorised over candidates: ``HV(front + [c]) - HV(front)``)."""
    c = np.asarray(candidates, dtype=float)
    ref = np.asarray(reference, dtype=float)
    f = _beyond(_points(front).reshape(-1, 2), ref)
    if len(f):
        f = f[non_dominated(f)]
    order = np.argsort(-f[:, 0], kind="stable") if len(f) else np.zeros(0, dtype=int)
    fx, fy = f[order, 0], f[order, 1]
    # The front's staircase: height ``h`` on x in [lo, hi): ref above the best x, then each
    # point's y down to the next point's x, the last one down to the reference.
    hi = np.r_[np.inf, fx]
    lo = np.r_[fx, ref[0]]
    h = np.r_[ref[1], fy]
    width = np.clip(np.minimum(c[:, :1], hi[None, :]) - lo[None, :], 0.0, None)
    height = np.clip(c[:, 1:2] - h[None, :], 0.0, None)
    return (width * height).sum(axis=1)


def hypervolume_ratio(
    found: np.ndarray | Sequence[Sequence[float]],
    true_front: np.ndarray | Sequence[Sequence[float]],
    reference: Sequence[float] | np.ndarray | None = None,
) -> float:
    """The hypervolume of ``found`` over that of ``true_front`` (1 when it is matched), with
    the true front's reference point unless one is given."""
    t = _points(true_front)
    ref = reference_point(t) if reference is None else np.asarray(reference, dtype=float)
    whole = hypervolume(t, ref)
    f = np.asarray(found, dtype=float).reshape(-1, t.shape[1])
    return hypervolume(f, ref) / whole if whole > 0 else 0.0

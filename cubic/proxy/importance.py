"""Knob importance from a fitted proxy model: which knobs its throughput predictions use.

The trees split on feature columns, not on knobs, and one knob moves several columns: a
string choice is one-hot, and derived columns (bytes per GPU, bytes moved, the roofline)
are products of several knobs and the workload. So the importance of a knob is assembled
in two steps, both cheap and neither fitted:

1. :func:`feature_gains`: each column's *total gain* (the loss reduction of every split on
   it), summed over the ensemble's throughput boosters. The feasibility classifier and the
   Gaussian process blended into the mean are left out: they have no gain.
2. :func:`knob_columns` finds, for the study's workload and space, the columns each knob
   moves, by changing that knob alone in a sample of configurations (no hand-kept map to
   go stale when a feature is added); :func:`knob_importance` then gives each column's gain
   to the knobs that move it, in equal parts, and normalises the knobs' totals to shares
   summing to 1. Gain on columns no knob of the space moves (the workload and cluster,
   knobs the space fixes) is reported apart, as ``other_share`` of the total gain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cubic.proxy.features import featurize

#: Configurations each knob is changed in when its columns are found.
BASE_ROWS = 32
#: Values tried per knob: the whole grid when it is this small, else this many draws.
MAX_VALUES = 12


@dataclass(frozen=True, slots=True)
class KnobShare:
    """One knob's share of the gain, and the columns it moves (most gain first)."""

    knob: str
    share: float
    gain: float
    features: tuple[str, ...]


def feature_gains(model: Any) -> np.ndarray:
    """Total gain per feature column of a fitted :class:`~cubic.proxy.model.ProxyModel`,
    summed over its throughput boosters (zero for a column no tree splits on)."""
    names = list(model.feature_names_)
    index = {n: i for i, n in enumerate(names)}
    gains = np.zeros(len(names))
    for booster in model.members_:
        for name, gain in booster.get_score(importance_type="total_gain").items():
            # Fitted on plain arrays, a booster names columns f0, f1...; by name otherwise.
            j = index.get(name)
            if j is None and name[:1] == "f" and name[1:].isdigit():
                j = int(name[1:])
            if j is not None and 0 <= j < len(names):
                gains[j] += float(gain)
    return gains


def _values(param: Any, rng: np.random.Generator) -> list[Any]:
    try:
        grid = param.to_python(param.grid()) if param.is_finite else None
    except (NotImplementedError, ValueError):
        grid = None
    if grid is not None and len(grid) <= MAX_VALUES:
        return list(grid)
    return list(param.to_python(param.draw(rng, MAX_VALUES)))


def knob_columns(
    workload: Any, space: Any, configs: Sequence[Mapping[str, Any]], seed: int = 0
) -> dict[str, np.ndarray]:
    """For each knob (parameter) of ``space``: the indices of the feature columns that
    change when that knob alone takes another of its values in one of ``configs`` (at most
    :data:`BASE_ROWS` of them are used, evenly spread)."""
    rng = np.random.default_rng(seed)
    rows = list(configs)
    if len(rows) > BASE_ROWS:
        rows = [rows[int(i)] for i in np.linspace(0, len(rows) - 1, BASE_ROWS)]
    if not rows:
        return {p.name: np.zeros(0, dtype=np.int64) for p in space.parameters}
    base = featurize(workload, rows)
    out = {}
    for param in space.parameters:
        values = _values(param, rng)
        changed = [dict(row, **{param.name: v}) for v in values for row in rows]
        X = featurize(workload, changed)
        ref = np.tile(base, (len(values), 1))
        moved = ~np.isclose(X, ref, rtol=1e-9, atol=1e-12)
        out[param.name] = np.flatnonzero(moved.any(axis=0))
    return out


def knob_importance(
    gains: np.ndarray, names: Sequence[str], columns: Mapping[str, np.ndarray]
) -> tuple[list[KnobShare], float]:
    """The knobs' shares of the gain (summing to 1, largest first; empty when the trees
    split on no column a knob moves) and the share of the total gain on other columns."""
    movers: list[list[str]] = [[] for _ in names]
    for knob, cols in columns.items():
        for j in cols:
            movers[int(j)].append(knob)
    per_knob = dict.fromkeys(columns, 0.0)
    per_column: dict[str, dict[int, float]] = {k: {} for k in columns}
    other = 0.0
    for j, g in enumerate(gains):
        if g <= 0:
            continue
        if not movers[j]:
            other += float(g)
            continue
        part = float(g) / len(movers[j])
        for knob in movers[j]:
            per_knob[knob] += part
            per_column[knob][j] = part
    total_knobs = sum(per_knob.values())
    total = total_knobs + other
    if total_knobs <= 0:
        return [], (1.0 if total > 0 else 0.0)
    shares = [
        KnobShare(
            knob=k,
            share=g / total_knobs,
            gain=g,
            features=tuple(
                names[j] for j, _ in sorted(per_column[k].items(), key=lambda kv: -kv[1])
            ),
        )
        for k, g in per_knob.items()
    ]
    shares.sort(key=lambda s: (-s.share, s.knob))
    return shares, other / total


def study_configs(space: Any, context: Mapping[str, Any], trials: Sequence[Any]) -> list[Any]:
    """Configurations to change the knobs in: the study's own (they satisfy its conditions
    where the trees learned), else a sample of its space."""
    configs = [t.params for t in trials if t.params]
    if configs:
        return configs
    try:
        return space.from_arrays(space.sample_arrays(np.random.default_rng(0), BASE_ROWS, context))
    except ValueError:  # SpaceError: a space too constrained to sample
        return []

"""Feasibility-first candidates: the valid configs of a study that arithmetic says may run.

On the largest models nine configs in ten of a full space run out of memory, and a search
that draws candidates blindly spends its trials finding that out. So candidates are drawn
from the configs that (a) obey the space's rules, (b) use only what the GPU has (no FP8
GEMM on a GPU without FP8, no block-scaled format it lacks) and (c) fit in memory by the
arithmetic estimate, with some slack so that a per-study correction
(:class:`cubic.proxy.memory.MemoryModel`) can move the line either way. However rare they
are: a finite space is enumerated outright (its vectorised enumeration and features make
10^6 configs a second or two), and any other is sampled in growing batches. The result
depends only on the workload, the space and the limit, so it is built once per study and
shared (bounded cache).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from cubic.proxy.features import featurize, hardware_ok, knows_knobs, numerics
from cubic.proxy.memory import estimate_ratio
from cubic.space import Space, SpaceError
from cubic.strategies.base import config_key
from cubic.workload import Workload

ENUMERATE_LIMIT = 5_000_000
"""Enumerate a finite space whose grid product is at most this; sample any other."""
MAX_DRAWS = 2_000_000
"""Valid configs a sampled space examines at most to find plausible ones."""
CHUNK = 100_000
_CACHE: OrderedDict[str, Survey] = OrderedDict()
_CACHE_SIZE = 4


class Configs(Sequence[dict[str, Any]]):
    """Configs held as a struct of arrays, made into dicts only when read.

    Tens of thousands of candidate dicts cost a process far more memory than their arrays
    (a dict of 30 knobs per config), and a round reads only the few it proposes."""

    def __init__(self, space: Space, arrays: dict[str, np.ndarray]) -> None:
        self.space = space
        self.arrays = arrays
        self._n = len(next(iter(arrays.values()))) if arrays else 0

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return self.rows(np.arange(self._n)[i])
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self.rows(np.array([i % self._n]))[0]

    def rows(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """The configs at ``rows``, as dicts."""
        return self.space.from_arrays({k: v[rows] for k, v in self.arrays.items()})

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, self._n, CHUNK):
            yield from self.rows(np.arange(start, min(self._n, start + CHUNK)))


def config_keys(space: Space, arrays: dict[str, np.ndarray]) -> list[str]:
    """:func:`config_key` of each config (struct of arrays), built a chunk at a time so
    that the dicts never all exist at once."""
    n = len(next(iter(arrays.values()))) if arrays else 0
    out: list[str] = []
    for start in range(0, n, 10_000):
        chunk = {k: v[start : start + 10_000] for k, v in arrays.items()}
        out += [config_key(c) for c in space.from_arrays(chunk)]
    return out


@dataclass(frozen=True)
class Candidates:
    """Configs with their struct-of-arrays, features, reduced-precision sites and the
    uncorrected memory estimate (share of HBM); ``valid`` counts the valid configs they were
    chosen from and ``exhaustive`` says whether those were the whole space."""

    configs: Configs
    keys: list[str]
    arrays: dict[str, np.ndarray]
    X: np.ndarray
    N: np.ndarray
    estimate: np.ndarray
    valid: int
    exhaustive: bool

    def __len__(self) -> int:
        return len(self.configs)

    def take(self, rows: np.ndarray) -> Candidates:
        rows = np.asarray(rows, dtype=int)
        arrays = {k: v[rows] for k, v in self.arrays.items()}
        return Candidates(
            Configs(self.configs.space, arrays),
            [self.keys[i] for i in rows],
            arrays,
            self.X[rows],
            self.N[rows],
            self.estimate[rows],
            self.valid,
            self.exhaustive,
        )


def grid_product(space: Space, context: dict[str, Any] | None = None) -> float:
    """An upper bound on a finite space's size (inf for a continuous one); with a
    ``context``, a parameter the workload rules out (:meth:`Space.fixed`) counts once."""
    fixed = space.fixed(context) if context is not None else {}
    total = 1.0
    for p in space.parameters:
        if p.name in fixed:
            continue
        if not p.is_finite:
            return math.inf
        total *= len(p.grid())
    return total


def _key(workload: Workload, space: Space, limit: float, slack: float, want: int) -> str:
    doc = json.dumps(
        [workload.to_dict(), space.to_dict(), limit, slack, want], sort_keys=True, default=str
    )
    return hashlib.sha1(doc.encode()).hexdigest()


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}


@dataclass(frozen=True)
class Survey:
    """What the arithmetic says of a study's whole space: how many valid configs it has
    (``valid``; all of them when ``exhaustive``, else those examined), how many run on the
    hardware, how many of those fit by the memory estimate, the smallest estimate and its
    config, and per knob the smallest estimate each of its values allows."""

    candidates: Candidates
    valid: int
    exhaustive: bool
    on_hardware: int
    fit: int
    limit: float
    min_estimate: float
    min_config: dict[str, Any] | None
    knob_minima: dict[str, dict[Any, float]]

    @property
    def fit_share(self) -> float:
        return self.fit / self.valid if self.valid else 0.0

    def helpful_knob(self) -> tuple[str, Any, float, Any, float] | None:
        """(knob, best value, its smallest estimate, worst value, its smallest estimate) of
        the knob whose choice moves memory most."""
        best: tuple[float, tuple[str, Any, float, Any, float]] | None = None
        for name, minima in self.knob_minima.items():
            if len(minima) < 2:
                continue
            lo = min(minima, key=lambda v: minima[v])
            hi = max(minima, key=lambda v: minima[v])
            gain = minima[hi] / max(minima[lo], 1e-12)
            if best is None or gain > best[0]:
                best = (gain, (name, lo, minima[lo], hi, minima[hi]))
        return None if best is None else best[1]


def survey(
    workload: Workload,
    space: Space,
    *,
    limit: float = 1.0,
    slack: float = 0.15,
    want: int = 40_000,
    seed: int = 0,
) -> Survey:
    """Scan the space once (enumerated when finite and not huge, else sampled): up to
    ``want`` valid configs that run on the hardware and whose estimated peak is at most
    ``limit * (1 + slack)`` of HBM, chosen uniformly among all such configs (when none
    passes, those with the smallest estimates), and the counts a study's feasibility check
    reports. Cached per study."""
    key = _key(workload, space, limit, slack, want)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    ctx = workload.context()
    rng = np.random.default_rng(seed)
    bound = limit * (1.0 + slack)
    kept: list[dict[str, np.ndarray]] = []
    kept_est: list[np.ndarray] = []
    smallest: tuple[dict[str, np.ndarray], np.ndarray] | None = None
    n_kept = examined = on_hw = n_fit = 0
    minima: dict[str, dict[Any, float]] = {
        p.name: {} for p in space.parameters if p.is_finite and len(p.grid()) <= 64
    }
    exhaustive = grid_product(space, ctx) <= ENUMERATE_LIMIT
    known = knows_knobs(workload.kind, space.names)

    def consider(arrays: dict[str, np.ndarray]) -> None:
        nonlocal n_kept, examined, smallest, on_hw, n_fit
        n = len(next(iter(arrays.values()))) if arrays else 0
        if n == 0:
            return
        examined += n
        X = featurize(workload, arrays)
        hw = hardware_ok(workload, X, arrays)
        est = estimate_ratio(workload.kind, X) if known else np.zeros(n)
        est = np.where(hw, est, np.inf)
        on_hw += int(hw.sum())
        n_fit += int((est <= limit).sum())
        for name, table in minima.items():
            values, inverse = np.unique(arrays[name], return_inverse=True)
            low = np.full(len(values), np.inf)
            np.minimum.at(low, inverse.ravel(), est)
            for v, m in zip(space[name].to_python(values), low.tolist(), strict=True):
                table[v] = min(table.get(v, np.inf), m)
        ok = est <= bound
        if ok.any():
            rows = np.flatnonzero(ok)
            kept.append({k: v[rows] for k, v in arrays.items()})
            kept_est.append(est[rows])
            n_kept += len(rows)
        elif not kept:  # remember the closest misses
            order = np.argsort(est)[:256]
            cand = ({k: v[order] for k, v in arrays.items()}, est[order])
            if smallest is None:
                smallest = cand
            else:
                both = _concat([smallest[0], cand[0]])
                e = np.concatenate([smallest[1], cand[1]])
                o = np.argsort(e)[:256]
                smallest = ({k: v[o] for k, v in both.items()}, e[o])

    if exhaustive:
        everything = space.enumerate_arrays(ctx)
        total = len(next(iter(everything.values()))) if everything else 0
        for start in range(0, total, CHUNK):
            consider({k: v[start : start + CHUNK] for k, v in everything.items()})
    else:
        batch = 20_000
        while n_kept < want and examined < MAX_DRAWS:
            consider(space.sample_arrays(rng, batch, ctx))
            batch = min(CHUNK, batch * 2)
    if kept:
        arrays, est = _concat(kept), np.concatenate(kept_est)
    elif smallest is not None:
        arrays, est = smallest
    else:
        arrays, est = {}, np.zeros(0)
    n = len(est)
    low = int(np.argmin(est)) if n else -1
    min_config = (
        space.from_arrays({k: v[low : low + 1] for k, v in arrays.items()})[0] if n else None
    )
    min_estimate = float(est[low]) if n else float("inf")
    if n > want:  # a uniform subset, deterministic for the study
        rows = np.sort(rng.choice(n, want, replace=False))
        arrays, est = {k: v[rows] for k, v in arrays.items()}, est[rows]
    keys = config_keys(space, arrays) if len(est) else []
    if not exhaustive and keys:  # sampled with replacement: keep each config once
        first = sorted({k: i for i, k in reversed(list(enumerate(keys)))}.values())
        arrays = {k: v[first] for k, v in arrays.items()}
        keys, est = [keys[i] for i in first], est[first]
    configs = Configs(space, arrays if keys else {})
    if keys:
        X = featurize(workload, arrays)
        N = numerics(workload, arrays)
    else:
        X = np.zeros((0, 0))
        N = np.zeros((0, 0))
    out = Survey(
        candidates=Candidates(configs, keys, arrays, X, N, est, examined, exhaustive),
        valid=examined,
        exhaustive=exhaustive,
        on_hardware=on_hw,
        fit=n_fit,
        limit=limit,
        min_estimate=min_estimate,
        min_config=min_config,
        knob_minima={k: v for k, v in minima.items() if v},
    )
    _CACHE[key] = out
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out


QUICK_DRAWS = 4_096
"""Valid configs :func:`check_fit` samples before it pays for a whole survey."""


def check_fit(workload: Workload, space: Space, *, limit: float, seed: int = 0) -> str | None:
    """Why no config of the space fits by the memory estimate, or None when some do.

    Study creation asks this on the request path, so it answers from a few thousand sampled
    configs whenever one of them fits (milliseconds); only a space where none of those fits
    pays for the whole :func:`survey`, which then names the smallest estimate and the knob
    that helps most."""
    if knows_knobs(workload.kind, space.names):
        try:
            arrays = space.sample_arrays(
                np.random.default_rng(seed), QUICK_DRAWS, workload.context()
            )
        except SpaceError:  # valid configs are rare: the survey enumerates or samples more
            arrays = {}
        if arrays and len(next(iter(arrays.values()))):
            X = featurize(workload, arrays)
            est = np.where(
                hardware_ok(workload, X, arrays), estimate_ratio(workload.kind, X), np.inf
            )
            if bool((est <= limit).any()):
                return None
    return unfit_reason(survey(workload, space, limit=limit), workload)


def unfit_reason(survey: Survey, workload: Workload) -> str | None:
    """Why no config of the space fits by the memory estimate (None when some do), with the
    smallest estimate and the knob whose choice moves memory most."""
    if survey.valid == 0:
        return "the space has no valid configuration for this workload (check its constraints)"
    if survey.fit > 0:
        return None
    gpu = workload.gpu
    allowed = survey.limit * gpu.hbm_gb
    if not survey.on_hardware:
        return f"no valid configuration of the space runs on {gpu.name}"
    cfg = survey.min_config or {}
    shown = ", ".join(f"{k}={v}" for k, v in cfg.items() if k in survey.knob_minima)
    msg = (
        f"no configuration of the space fits in memory by the estimate: the smallest needs "
        f"{survey.min_estimate * gpu.hbm_gb:.1f} GiB per GPU ({shown}) against "
        f"{allowed:.1f} GiB allowed on {gpu.name}"
    )
    knob = survey.helpful_knob()
    if knob is not None:
        name, lo, m_lo, hi, m_hi = knob
        msg += (
            f"; {name} moves memory most ({name}={lo}: {m_lo * gpu.hbm_gb:.1f} GiB at best, "
            f"{name}={hi}: {m_hi * gpu.hbm_gb:.1f} GiB)"
        )
    return (
        msg + "; widen the space, add GPUs or choose a GPU with more memory, or set "
        "allow_unfit: true to create the study anyway"
    )

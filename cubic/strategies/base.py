"""The strategy interface: what proposes the next configurations of a study.

Lifecycle: the tuner builds a strategy from the study's spec (``Strategy(study, seed=...,
**options)``) whenever it needs proposals and calls ``suggest(history, n)`` with every trial
of the study so far (finished, running and waiting). A strategy keeps no state between calls
that it cannot rebuild from the history, so any API process can serve any study, and a
restarted service proposes exactly as before. Strategies touch neither SQL nor HTTP.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cubic.objectives import job_gpus, objective_values, violations
from cubic.store.objects import Trial, TrialState
from cubic.study import ResolvedStudy


@dataclass(frozen=True, slots=True)
class Proposal:
    """One proposed configuration, with what the strategy predicts for it (if it predicts)."""

    params: dict[str, Any]
    predicted: dict[str, Any] | None = field(default=None)


def _step(param: Any, value: Any, rng: np.random.Generator) -> Any:
    """A value next to ``value`` in the parameter's ordered domain (a fresh draw if infinite)."""
    if param.is_finite:
        grid = param.to_python(param.grid())
        if value in grid:
            i = grid.index(value) + int(rng.choice([-1, 1]))
            return grid[min(max(i, 0), len(grid) - 1)]
    return param.to_python(param.draw(rng, 1))[0]


def config_key(params: dict[str, Any]) -> str:
    """A canonical string of a configuration, to recognise one proposed before."""
    return json.dumps(params, sort_keys=True, default=str)


def _once(
    cache: dict[tuple[int, int], tuple[Any, Any]],
    trial: Trial,
    basis: Any,
    make: Callable[[Any], Any],
) -> Any:
    """``make(basis)`` for a stored trial, computed once per (study, id) and made again only
    if ``basis`` (what it is computed from) is not what it was: a stored trial never changes,
    so a round's cost does not grow with the history by recomputing it."""
    key = (trial.study_id, trial.id)
    hit = cache.get(key)
    if hit is None or (hit[0] is not basis and hit[0] != basis):
        hit = (basis, make(basis))
        cache[key] = hit
    return hit[1]


class Strategy(ABC):
    """Proposes configurations of a study's search space from its history."""

    name: ClassVar[str]
    #: Whether a proposal ignores the results (random, Sobol, grid): a service may then
    #: propose ahead of demand at no cost. A strategy that learns from results is asked only
    #: when a slot is free, so that each proposal sees every result in by then.
    blind: ClassVar[bool] = False

    def __init__(self, study: ResolvedStudy, *, seed: int | None = None, **options: Any) -> None:
        self.study = study
        self.seed = seed
        self.options = options
        self.context = study.context
        self._grids = self._make_grids()
        self._keys: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._scores: dict[tuple[int, int], tuple[Any, Any]] = {}

    @abstractmethod
    def suggest(self, history: Sequence[Trial], n: int) -> list[Proposal]:
        """Propose up to ``n`` new valid configurations not already in ``history``."""

    # helpers shared by the strategies -------------------------------------------------
    def rng(self, history: Sequence[Trial]) -> np.random.Generator:
        """A generator seeded by the study seed and the history length: reproducible rounds."""
        return np.random.default_rng([self.seed or 0, len(history)])

    def seen(self, history: Sequence[Trial]) -> set[str]:
        """The :func:`config_key` of every trial in ``history``.

        A stored trial's params never change, so each key is computed once per trial (by
        study and id, checked against the params): a round's cost does not grow with the
        study's length by a JSON encoding of every trial."""
        return {_once(self._keys, t, t.params, config_key) for t in history}

    def fill_random(
        self, history: Sequence[Trial], proposals: list[Proposal], n: int, seen: set[str]
    ) -> list[Proposal]:
        """Top up ``proposals`` to ``n`` with random valid configurations never seen before."""
        if len(proposals) >= n:
            return proposals
        rng = self.rng(history)
        near_infeasible = self._near_infeasible(history)
        tries = 0
        while len(proposals) < n and tries < 20:
            tries += 1
            for cfg in self.study.space.sample(rng, max(4 * n, 32), self.context):
                k = config_key(cfg)
                if k not in seen and (tries > 10 or not near_infeasible(cfg)):
                    seen.add(k)
                    proposals.append(Proposal(cfg))
                    if len(proposals) == n:
                        break
        return proposals

    # positions in knob-rank space ---------------------------------------------------------
    def _make_grids(self) -> list[tuple[str, Any]]:
        grids = []
        for p in self.study.space.parameters:
            if p.is_finite:
                grids.append((p.name, p.to_python(p.grid())))
            else:
                grids.append((p.name, (float(p.low), float(p.high))))
        return grids

    def positions(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Configs (struct of arrays) as points in [0, 1]^d: each knob's rank in its domain."""
        cols = []
        for name, grid in self._grids:
            col = np.asarray(arrays[name])
            if isinstance(grid, list):
                index = {v: i for i, v in enumerate(grid)}
                pos = np.array(
                    [index.get(v, (len(grid) - 1) / 2) for v in col.tolist()], dtype=float
                )
                cols.append(pos / max(1, len(grid) - 1))
            else:
                lo, hi = grid
                cols.append((col.astype(float) - lo) / (hi - lo) if hi > lo else np.zeros(len(col)))
        return np.stack(cols, axis=1) if cols else np.zeros((0, 0))

    def _near_infeasible(self, history: Sequence[Trial]) -> Any:
        """A test: is a config's nearest finished neighbour infeasible? (1-NN on knob ranks).

        Random top-ups use it to skip regions already known to run out of memory.
        """
        done = [t for t in history if t.state in TrialState.LEARNED]
        bad = np.asarray([t.state == TrialState.INFEASIBLE for t in done])
        if not bad.any():
            return lambda cfg: False
        space = self.study.space
        pts = self.positions(space.to_arrays([t.params for t in done]))

        def test(cfg: dict[str, Any]) -> bool:
            d = np.abs(pts - self.positions(space.to_arrays([cfg]))).sum(axis=1)
            return bool(bad[int(np.argmin(d))])

        return test

    def fill_neighbours(
        self,
        history: Sequence[Trial],
        proposals: list[Proposal],
        n: int,
        seen: set[str],
        top: int = 8,
    ) -> list[Proposal]:
        """Top up ``proposals`` with unseen valid configs a step or two away from the best."""
        if len(proposals) >= n:
            return proposals
        spec = self.study.spec
        ranked = []
        for t in history:
            vals, viol = self.scored(t)
            if vals is not None and viol == 0:
                sign = 1.0 if spec.objectives[0].direction == "maximize" else -1.0
                ranked.append((sign * vals[0], t))
        ranked.sort(key=lambda p: p[0], reverse=True)
        if not ranked:
            return proposals
        rng = self.rng(history)
        space = self.study.space
        fixed = space.fixed(self.context)
        params = [p for p in space.parameters if p.name not in fixed]
        for attempt in range(60 * n):
            if len(proposals) >= n:
                break
            base = dict(ranked[int(rng.integers(0, min(top, len(ranked))))][1].params)
            moves = 1 + int(rng.integers(0, 2 + attempt // (20 * n)))
            for p in rng.choice(len(params), size=min(moves, len(params)), replace=True):
                param = params[int(p)]
                base[param.name] = _step(param, base.get(param.name), rng)
            cfg = space.complete({k: base[k] for k in space.names}, self.context)
            key = config_key(cfg)
            if key not in seen and not space.validate(cfg, self.context):
                seen.add(key)
                proposals.append(Proposal(cfg))
        return proposals

    def scored(self, trial: Trial) -> tuple[list[float] | None, float]:
        """(objective values or None, constraint violation) of a finished trial.

        Infeasible trials and complete trials that break a constraint get a positive
        violation, so constraint-aware samplers learn to avoid their region. A pruned trial's
        values are what it measured before it was stopped: low, and data all the same.
        A finished trial never changes, so its score is computed once (by study and id,
        checked against its metrics): a round does not re-score the whole history.
        """
        if not trial.is_finished:
            return self._score(trial)
        return _once(self._scores, trial, trial.metrics, lambda _: self._score(trial))

    def _score(self, trial: Trial) -> tuple[list[float] | None, float]:
        spec = self.study.spec
        if trial.state == TrialState.INFEASIBLE:
            return None, 1.0
        if trial.state not in TrialState.MEASURED or not trial.metrics:
            return None, 0.0
        vals = objective_values(spec, trial.metrics, job_gpus(self.study.workload, trial.params))
        bad = violations(spec, self.study.workload, trial.metrics, trial.params)
        return vals, float(len(bad))

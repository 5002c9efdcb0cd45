"""Grid search over the valid points of a finite space, in a seeded shuffled order.

Optuna's GridSampler walks the full Cartesian product, and in a constrained space (``tp*pp*cp``
must divide the GPU count, the batch must split evenly...) most of that product is invalid.
Walking the enumerated valid points instead spends every trial on a config that can run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cubic.errors import InvalidInput
from cubic.space import Space, SpaceError
from cubic.store.objects import Trial
from cubic.strategies.base import Proposal, Strategy, config_key

MAX_GRID_POINTS = 1_000_000
"""The most configurations grid search enumerates: beyond, it is refused (use a sampler)."""


def grid_points(space: Space, context: dict[str, Any]) -> dict[str, np.ndarray]:
    """The valid points of a finite space, refused with a clear error past the limit."""
    try:
        return space.enumerate_arrays(context, max_rows=MAX_GRID_POINTS)
    except SpaceError as exc:
        raise InvalidInput(
            f"strategy 'grid': {exc}; grid search enumerates at most "
            f"{MAX_GRID_POINTS:,}: use random, tpe or cubic",
            field="strategy.name",
        ) from exc


class GridStrategy(Strategy):
    name = "grid"
    blind = True

    def suggest(self, history: Sequence[Trial], n: int) -> list[Proposal]:
        space = self.study.space
        if not space.is_finite:
            raise InvalidInput(
                "strategy 'grid' needs a finite space (a float without a step "
                "has infinitely many values)",
                field="strategy.name",
            )
        points = space.from_arrays(grid_points(space, self.context))
        order = np.random.default_rng(self.seed or 0).permutation(len(points))
        seen = self.seen(history)
        out: list[Proposal] = []
        for i in order:
            cfg = points[int(i)]
            if config_key(cfg) not in seen:
                out.append(Proposal(cfg))
                if len(out) == n:
                    break
        return out

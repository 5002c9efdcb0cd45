"""Strategies: one module per strategy behind :class:`Strategy`, found by name here."""

from __future__ import annotations

from typing import Any

from cubic.errors import InvalidInput
from cubic.strategies.base import Proposal, Strategy, config_key
from cubic.strategies.cubic import CubicStrategy
from cubic.strategies.grid import GridStrategy
from cubic.strategies.samplers import GPStrategy, QMCStrategy, RandomStrategy, TPEStrategy
from cubic.study import ResolvedStudy

REGISTRY: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (RandomStrategy, TPEStrategy, GPStrategy, QMCStrategy, GridStrategy, CubicStrategy)
}


def strategy_class(name: str) -> type[Strategy]:
    """The registered strategy called ``name``."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise InvalidInput(
            f"strategy '{name}' is not available; known: {', '.join(sorted(REGISTRY))}",
            field="strategy.name",
        )
    return cls


def make_strategy(study: ResolvedStudy) -> Strategy:
    """The strategy a study's spec asks for, built with its seed and options."""
    s = study.spec.strategy
    cls = strategy_class(s.name)
    opts: dict[str, Any] = dict(s.options)
    return cls(study, seed=s.seed, **opts)


__all__ = ["REGISTRY", "Proposal", "Strategy", "config_key", "make_strategy", "strategy_class"]

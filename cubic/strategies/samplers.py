"""Strategies backed by Optuna's samplers: random, TPE, GP and QMC.

Each round rebuilds an in-memory Optuna study from the history (so the strategy holds no
state of its own) and asks the sampler for ``n`` configurations. Running and waiting trials
enter as RUNNING so that TPE's constant liar spreads a batch out instead of proposing the
same point to every worker.

Optuna's samplers ignore FAIL trials, which would let the search walk back into an
out-of-memory region forever. So an infeasible trial, or a complete one that breaks a
constraint, enters as COMPLETE with the worst value seen so far *and* a positive
constraint value: TPE and GP read a trial's constraints and put such trials in
the bad group; the penalty value makes even constraint-blind samplers rank them last.
A proposal that is not a valid config of the space (say ``tp*pp*cp`` does not divide the
GPU count) is told the same way inside the round and asked again.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from cubic.store.objects import Trial, TrialState
from cubic.strategies.base import Proposal, Strategy, config_key

optuna.logging.set_verbosity(optuna.logging.WARNING)


class OptunaStrategy(Strategy):
    """Base for strategies that delegate to an Optuna sampler."""

    max_tries_per_proposal = 40

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def _directions(self) -> list[str]:
        return [str(o.direction) for o in self.study.spec.objectives]

    def _penalty(self, values: list[list[float]]) -> list[float]:
        """The worst value seen per objective (0 before anything completed)."""
        out = []
        for i, d in enumerate(self._directions()):
            col = [v[i] for v in values]
            if not col:
                out.append(0.0)
            else:
                out.append(min(col) if d == "maximize" else max(col))
        return out

    def _distributions(self) -> dict[str, BaseDistribution]:
        return self.study.space.optuna_distributions()

    def _frozen(
        self, history: Sequence[Trial], dists: dict[str, BaseDistribution]
    ) -> list[FrozenTrial]:
        space = self.study.space
        scored = [(t, *self.scored(t)) for t in history]
        penalty = self._penalty([v for _, v, _ in scored if v is not None])
        frozen = []
        for t, vals, viol in scored:
            # An inactive conditional knob holds its default, which may lie outside its
            # choices (cache_load_factor 1.0 when nothing is cached): leave it out, as
            # Optuna's define-by-run trials would.
            params = {k: v for k, v in t.params.items() if k in dists and space[k].contains(v)}
            pd = {k: dists[k] for k in params}
            try:
                if t.state in (TrialState.WAITING, TrialState.RUNNING):
                    frozen.append(
                        optuna.trial.create_trial(
                            state=OptunaState.RUNNING, params=params, distributions=pd
                        )
                    )
                elif vals is not None or viol > 0:
                    frozen.append(
                        optuna.trial.create_trial(
                            values=vals if vals is not None else penalty,
                            params=params,
                            distributions=pd,
                            constraints={"feasible": viol},
                        )
                    )
            except ValueError:
                continue  # a config from outside the space (an import): nothing to learn here
        return frozen

    def suggest(self, history: Sequence[Trial], n: int) -> list[Proposal]:
        dists = self._distributions()
        seed = (self.seed or 0) * 1_000_003 + len(history)
        ostudy = optuna.create_study(directions=self._directions(), sampler=self.sampler(seed))
        ostudy.add_trials(self._frozen(history, dists))
        done_values = [t.values for t in ostudy.trials if t.state == OptunaState.COMPLETE]
        penalty = self._penalty([list(v) for v in done_values if v])
        seen = self.seen(history)
        ctx = self.context
        space = self.study.space
        proposals: list[Proposal] = []
        for _ in range(n):
            for _ in range(self.max_tries_per_proposal):
                ot = ostudy.ask(dists)
                cfg = space.complete(dict(ot.params), ctx)
                key = config_key(cfg)
                problems = space.validate(cfg, ctx)
                if not problems and key not in seen:
                    seen.add(key)
                    proposals.append(Proposal(cfg))
                    break  # stays RUNNING in the round's study: the liar spreads the batch
                if problems:  # the sampler learns that this region is invalid
                    ot.set_constraint("feasible", 1.0)
                    ostudy.tell(ot, penalty)
                else:  # a repeat of a known config: nothing new to learn, draw again
                    ostudy.tell(ot, state=OptunaState.FAIL)
        # A converged sampler keeps drawing configs it has seen: explore next to the best.
        proposals = self.fill_neighbours(history, proposals, n, seen)
        return self.fill_random(history, proposals, n, seen)


class RandomStrategy(OptunaStrategy):
    name = "random"

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)


class TPEStrategy(OptunaStrategy):
    """Multivariate TPE with the constant liar.

    The good group is the best quarter of the trials (``gamma_fraction``, at most 25 trials)
    rather than Optuna's default tenth: with budgets of tens of trials run in parallel
    batches, a tenth is two or three trials, too few to shape the good density, and the
    sampler then keeps drawing from its prior, out-of-memory region included.
    """

    name = "tpe"

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        opts: dict[str, Any] = {"multivariate": True, "n_startup_trials": 10}
        opts.update(self.options)
        frac = float(opts.pop("gamma_fraction", 0.25))
        if "gamma" in inspect.signature(optuna.samplers.TPESampler).parameters:
            opts["gamma"] = lambda n: min(math.ceil(frac * n), 25)
        with warnings.catch_warnings():
            # Optuna 4.9 deprecated ``gamma`` (removal planned for 6.0); until then it is
            # the one lever on how greedy TPE is, and without it the default applies.
            warnings.simplefilter("ignore", FutureWarning)
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True, **opts)


class GPStrategy(OptunaStrategy):
    """Optuna's Gaussian-process sampler; needs PyTorch (``pip install 'cubic[gp]'``)."""

    name = "gp"

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            from cubic.errors import InvalidInput

            raise InvalidInput(
                "strategy 'gp' needs PyTorch: pip install 'cubic[gp]'", field="strategy.name"
            ) from exc
        return optuna.samplers.GPSampler(
            seed=seed,
            **self.options,
        )


class QMCStrategy(OptunaStrategy):
    """Scrambled Sobol points: space-filling, blind to results."""

    name = "qmc"

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.QMCSampler(
            seed=seed,
            scramble=True,
            warn_asynchronous_seeding=False,
            **self.options,
        )

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
GPU count) is repaired to the nearest valid config never tried (in knob-rank space, among a
cached pool of valid configs) instead of asking the sampler again: each ask costs a model
fit (a full GP fit for ``gp``), and on a space where most draws break a rule, asking until
one passes costs tens of asks per proposal. A draw that repeats a tried config is drawn
again a few times (a converged sampler), then repaired the same way. The repaired config
stays in the round's study as a running trial, so TPE's constant liar spreads the batch.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers._tpe import sampler as _tpe
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from cubic.space import SpaceError
from cubic.store.objects import Trial, TrialState
from cubic.strategies.base import Proposal, Strategy, config_key
from cubic.study import ResolvedStudy

optuna.logging.set_verbosity(optuna.logging.WARNING)


class _Shared(FrozenTrial):
    """A trial made once and added to each round's in-memory study: the storage copies what
    it is given (``copy.deepcopy``, most of a round's time with thousands of trials), and
    the values, params and distributions of a finished trial, or of a pending one standing
    in for the constant liar, are never written to there, so its copy may share them. Only
    the copy's number and id are set.

    What TPE derives from such a trial at every ask (its constraint values, its params in
    the sampler's internal representation) is kept in :attr:`memo`, which the copies share:
    recomputing them for every trial at every ask was most of an ask's time."""

    memo: dict[str, Any]

    def __deepcopy__(self, memo: dict[int, Any]) -> _Shared:
        return copy.copy(self)

    def _validate(self) -> None:
        """Checked once, by ``create_trial``, and never changed: not again per round."""

    @property
    def constraints(self) -> dict[str, float]:
        out = self.memo.get("constraints")
        if out is None:
            out = self.memo["constraints"] = FrozenTrial.constraints.fget(self)  # type: ignore[attr-defined]
        return out


def _shared(trial: FrozenTrial) -> _Shared:
    trial.__class__ = _Shared
    trial.memo = {}  # type: ignore[attr-defined]
    return trial  # type: ignore[return-value]


class _RoundTPE(optuna.samplers.TPESampler):
    """Multivariate TPE told each round's search space instead of inferring it per ask.

    The inferred space is the intersection of the finished trials' distributions; Optuna
    recomputes it from the last running trial on at every ask, comparing distributions
    choice by choice, which with a batch's running trials spread through the history was a
    third of a round's time. Within a round of :class:`OptunaStrategy` it cannot change (an
    ask adds only running or failed trials) and every trial of a study has the same
    distribution per knob, so it is the knobs common to every finished trial, computed
    once per round from their names: the same space, in the same (sorted) order.

    A sampler serves one round's study (see :meth:`_sample`): its finished trials are read
    once, at the round's first ask."""

    round_space: dict[str, BaseDistribution] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._split: tuple[int, list[FrozenTrial], list[FrozenTrial]] | None = None
        self._estimators: dict[bool, tuple[Any, Any]] = {}

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self.round_space is None:
            return super().infer_relative_search_space(study, trial)
        return self.round_space

    def _sample(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """Optuna's constant-liar ask, with what stays the same across a round's asks made
        once: the finished trials and their split into good and bad (an ask of a round adds
        a running or a failed trial, never a finished one), and the Parzen estimators of
        trial sets already seen (the good one for every ask; both for a re-ask after a
        repeated draw, which sees the trials of the ask before it). Each was rebuilt at
        every ask."""
        if not self._constant_liar:
            return super()._sample(study, trial, search_space)
        if self._split is None or self._split[0] != id(study):
            if self._gamma is None:  # as Optuna's: its default by the number of objectives
                single = len(study.directions) <= 1
                self._gamma = _tpe.default_gamma if single else _tpe.default_gamma_multiobjective
            states = (OptunaState.COMPLETE, OptunaState.PRUNED)
            finished = study._get_trials(deepcopy=False, states=states, use_cache=False)
            below, above = _tpe._split_trials(study, finished, self._gamma(len(finished)))
            self._split = (id(study), below, above)
        below, above = self._split[1], self._split[2]
        running = [
            t
            for t in study._get_trials(
                deepcopy=False, states=(OptunaState.RUNNING,), use_cache=False
            )
            if t.number != trial.number
        ]
        space = tuple(search_space)
        mpe_below = self._estimator(study, search_space, lambda: below, (space,), True)
        mpe_above = self._estimator(
            study,
            search_space,
            # the constant liar's: each running trial is a bad one
            lambda: sorted(above + running, key=lambda t: t.number) if running else above,
            (space, *(t.number for t in running)),
            False,
        )
        samples = mpe_below.sample(self._rng.rng, self._n_ei_candidates)
        acquisition = self._compute_acquisition_func(samples, mpe_below, mpe_above)
        out = optuna.samplers.TPESampler._compare(samples, acquisition)
        for name, dist in search_space.items():
            out[name] = dist.to_external_repr(out[name])
        return out

    def _estimator(
        self,
        study: optuna.Study,
        search_space: dict[str, BaseDistribution],
        trials: Callable[[], list[FrozenTrial]],
        key: tuple[Any, ...],
        handle_below: bool,
    ) -> Any:
        """The Parzen estimator of ``trials()`` (the round's finished ones, split, with the
        running ones that ``key`` names), kept while the next ask has the same ones."""
        kept = self._estimators.get(handle_below)
        if kept is None or kept[0] != key:
            mpe = self._build_parzen_estimator(study, search_space, trials(), handle_below)
            kept = self._estimators[handle_below] = (key, mpe)
        return kept[1]

    def _get_internal_repr(
        self, trials: list[FrozenTrial], search_space: dict[str, BaseDistribution], study: Any
    ) -> dict[str, np.ndarray]:
        """Optuna's, with each shared trial's row made once per search space (see
        :class:`_Shared`) instead of at every ask."""
        names = tuple(search_space)
        rows: list[tuple[float, ...]] = []
        for trial in trials:
            memo = getattr(trial, "memo", None)
            if memo is not None and memo.get("repr_of") == names:
                row = memo["repr"]
            else:
                params = self._get_params(trial, study)
                row = None
                if search_space.keys() <= params.keys():
                    row = tuple(d.to_internal_repr(params[k]) for k, d in search_space.items())
                if memo is not None:
                    memo["repr_of"], memo["repr"] = names, row
            if row is not None:
                rows.append(row)
        table = np.asarray(rows, dtype=float).reshape(len(rows), len(names))
        return {k: table[:, i] for i, k in enumerate(names)}


def _common_space(
    frozen: Sequence[FrozenTrial], dists: dict[str, BaseDistribution]
) -> dict[str, BaseDistribution]:
    """The knobs every finished trial has, by name, without single-valued ones."""
    common: set[str] | None = None
    for ft in frozen:
        if ft.state.is_finished():
            names = ft.distributions.keys()
            common = set(names) if common is None else common.intersection(names)
    return {k: dists[k] for k in sorted(common or ()) if not dists[k].single()}


class OptunaStrategy(Strategy):
    """Base for strategies that delegate to an Optuna sampler."""

    def __init__(self, study: ResolvedStudy, *, seed: int | None = None, **options: Any) -> None:
        super().__init__(study, seed=seed, **options)
        self._pool: tuple[list[dict[str, Any]], dict[str, int], np.ndarray] | None = None
        self._pool32 = np.zeros((0, 0), dtype=np.float32)  # its positions, single precision
        # A finished trial's FrozenTrial, by (study, id), with what it was made from (its
        # values, or the penalty it stood in with): made once, not once per round.
        self._made: dict[tuple[int, int], tuple[tuple[Any, ...], FrozenTrial]] = {}
        # A waiting or running trial's FrozenTrial, by (study, id), while it stays pending.
        self._pending: dict[tuple[int, int], FrozenTrial] = {}

    reads_history = True
    """Whether the sampler learns from the trials (``RandomSampler`` does not: its rounds
    skip building the history's study, so their cost does not grow with it)."""

    repair_pool = 20_000
    max_asks: int | None = None
    """Asks of the sampler per round (None: one per proposal); the rest of a batch are the
    valid configs nearest to its draws."""
    repeat_asks = 4
    """Draws per proposal while the sampler repeats tried configs (then: the nearest)."""

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
        """Every knob the sampler may move: a knob the workload rules out (an FP8 site on an
        A100, a block-scaled format on an H100) holds its default and is not asked for."""
        fixed = self.study.space.fixed(self.context)
        return {k: d for k, d in self.study.space.optuna_distributions().items() if k not in fixed}

    def _frozen(
        self, history: Sequence[Trial], dists: dict[str, BaseDistribution]
    ) -> list[FrozenTrial]:
        space = self.study.space
        scored = [(t, *self.scored(t)) for t in history]
        penalty = self._penalty([v for _, v, _ in scored if v is not None])
        frozen = []
        pending_now: dict[tuple[int, int], FrozenTrial] = {}
        for t, vals, viol in scored:
            pending = t.state in (TrialState.WAITING, TrialState.RUNNING)
            if not pending and vals is None and viol <= 0:
                continue
            key = (t.study_id, t.id)
            if pending and (ft := self._pending.get(key)) is not None:
                pending_now[key] = ft  # nothing of a pending trial changes until it ends
                frozen.append(ft)
                continue
            # A measured trial does not depend on the penalty; an infeasible one stands in with it.
            made = (tuple(vals), None, viol) if vals is not None else (None, tuple(penalty), viol)
            cached = None if pending else self._made.get(key)
            if cached is not None and cached[0] == made:
                frozen.append(cached[1])
                continue
            # An inactive conditional knob holds its default, which may lie outside its
            # choices (cache_load_factor 1.0 when nothing is cached): leave it out, as
            # Optuna's define-by-run trials would.
            params = {k: v for k, v in t.params.items() if k in dists and space[k].contains(v)}
            pd = {k: dists[k] for k in params}
            try:
                if pending:
                    ft = _shared(
                        optuna.trial.create_trial(
                            state=OptunaState.RUNNING, params=params, distributions=pd
                        )
                    )
                    pending_now[key] = ft
                else:
                    ft = _shared(
                        optuna.trial.create_trial(
                            values=vals if vals is not None else penalty,
                            params=params,
                            distributions=pd,
                            constraints={"feasible": viol},
                        )
                    )
                    self._made[key] = (made, ft)
            except ValueError:
                continue  # a config from outside the space (an import): nothing to learn here
            frozen.append(ft)
        self._pending = pending_now  # those that ended are made again as finished
        return frozen

    def suggest(self, history: Sequence[Trial], n: int) -> list[Proposal]:
        dists = self._distributions()
        seed = ((self.seed or 0) * 1_000_003 + len(history)) % 2**32  # numpy takes 32 bits
        sampler = self.sampler(seed)
        ostudy = optuna.create_study(directions=self._directions(), sampler=sampler)
        if self.reads_history:
            frozen = self._frozen(history, dists)
            ostudy.add_trials(frozen)
            if isinstance(sampler, _RoundTPE):
                sampler.round_space = _common_space(frozen, dists)
        seen = self.seen(history)
        ctx = self.context
        space = self.study.space
        proposals: list[Proposal] = []
        drawn: list[dict[str, Any]] = []
        for i in range(n):
            if self.max_asks is not None and i >= self.max_asks and drawn:
                # The rest of the batch: the valid configs nearest to the sampler's draws.
                cfg = self._nearest_valid(drawn[i % len(drawn)], seen)
                if cfg is None:
                    break
                seen.add(config_key(cfg))
                proposals.append(Proposal(cfg))
                continue
            for attempt in range(self.repeat_asks):
                ot = ostudy.ask(dists)
                params = dict(ot.params)
                cfg: dict[str, Any] | None = None
                try:
                    cfg = space.complete(params, ctx)
                except SpaceError:
                    cfg = None
                if cfg is None or config_key(cfg) not in seen or attempt == self.repeat_asks - 1:
                    break
                # A repeat of a tried config (a converged sampler): cheap to draw again.
                ostudy.tell(ot, state=OptunaState.FAIL)
            drawn.append(params)
            if cfg is None or space.validate(cfg, ctx) or config_key(cfg) in seen:
                cfg = self._nearest_valid(params, seen)
                ostudy.tell(ot, state=OptunaState.FAIL)  # the draw itself: nothing to learn
                if cfg is None:
                    break
                active = {k: v for k, v in cfg.items() if k in dists and space[k].contains(v)}
                with contextlib.suppress(ValueError):  # the repaired config runs instead
                    ostudy.add_trial(
                        optuna.trial.create_trial(
                            state=OptunaState.RUNNING,
                            params=active,
                            distributions={k: dists[k] for k in active},
                        )
                    )
            seen.add(config_key(cfg))
            proposals.append(Proposal(cfg))  # stays RUNNING in the round's study
        # A converged sampler keeps drawing configs it has seen: explore next to the best.
        proposals = self.fill_neighbours(history, proposals, n, seen)
        return self.fill_random(history, proposals, n, seen)

    def _valid_pool(self) -> tuple[list[dict[str, Any]], dict[str, int], np.ndarray]:
        """Valid configs to repair proposals with (sampled once), the index of each one's
        key, and their positions."""
        if self._pool is None:
            rng = np.random.default_rng(self.seed or 0)
            arrays = self.study.space.sample_arrays(rng, self.repair_pool, self.context)
            configs = self.study.space.from_arrays(arrays)
            keys = [config_key(c) for c in configs]
            first = sorted({k: i for i, k in reversed(list(enumerate(keys)))}.values())
            arrays = {k: v[first] for k, v in arrays.items()}
            self._pool = (
                [configs[i] for i in first],
                {keys[i]: j for j, i in enumerate(first)},
                self.positions(arrays),
            )
            self._pool32 = self._pool[2].astype(np.float32)
        return self._pool

    def _nearest_valid(self, params: dict[str, Any], seen: set[str]) -> dict[str, Any] | None:
        """The valid config never tried that is nearest (L1 in knob ranks) to a draw."""
        configs, index, pos = self._valid_pool()
        if not configs:
            return None
        space = self.study.space
        point = {}
        for p in space.parameters:
            v = params.get(p.name, p.default)
            if v is None or not p.contains(v):
                v = p.to_python(p.grid())[0] if p.is_finite else p.low
            point[p.name] = p.array([v])
        at = self.positions(point)
        # Distances in single precision first (half the memory to stream), then in double
        # for the few within its rounding error of the nearest: the same pick, ties too.
        dist = np.abs(self._pool32 - at.astype(np.float32)).sum(axis=1)
        # The tried configs among the pool: a look-up per tried config, not per pool entry.
        dist[[i for k in seen if (i := index.get(k)) is not None]] = np.inf
        near = dist.min()
        if not np.isfinite(near):
            return None
        close = np.flatnonzero(dist <= near + 4.0 * pos.shape[1] ** 2 * 2.0**-24)
        j = int(close[np.argmin(np.abs(pos[close] - at).sum(axis=1))])
        return configs[j]


class RandomStrategy(OptunaStrategy):
    name = "random"
    blind = True
    reads_history = False

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
            if opts.get("multivariate") and not opts.get("group"):
                return _RoundTPE(seed=seed, constant_liar=True, **opts)
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True, **opts)


class GPStrategy(OptunaStrategy):
    """Optuna's Gaussian-process sampler; needs PyTorch (``pip install 'cubic[gp]'``).

    Each ask fits the GP and optimises its acquisition over every knob (seconds at a few
    dozen trials), and the sampler has no batch mode (it ignores running trials, so eight
    asks give one point eight times): a round asks twice, with a smaller acquisition search
    than Optuna's default, and fills the batch with the valid configs nearest to those two.
    """

    name = "gp"
    max_asks = 2
    repeat_asks = 1
    preliminary_samples = 512
    local_searches = 4

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            from cubic.errors import InvalidInput

            raise InvalidInput(
                "strategy 'gp' needs PyTorch: pip install 'cubic[gp]'", field="strategy.name"
            ) from exc
        # Conditional knobs (vp when pp > 1, ...) are sampled apart by design: no warning.
        opts = {"warn_independent_sampling": False, **self.options}
        sampler = optuna.samplers.GPSampler(seed=seed, **opts)
        # Optuna exposes no option for the acquisition search's size; its two attributes
        # are set where this version has them (else Optuna's defaults apply).
        for attr, value in (
            ("_n_preliminary_samples", self.preliminary_samples),
            ("_n_local_search", self.local_searches),
        ):
            if isinstance(getattr(sampler, attr, None), int):
                setattr(sampler, attr, value)
        return sampler


class QMCStrategy(OptunaStrategy):
    """Scrambled Sobol points: space-filling, blind to results."""

    name = "qmc"
    blind = True

    def sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.QMCSampler(
            seed=seed,
            scramble=True,
            warn_asynchronous_seeding=False,
            **self.options,
        )

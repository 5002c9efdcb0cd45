"""The ``cubic`` strategy: proxy-model-guided batch search, as in CubicML.

Candidates come first from what can run: the study's valid configs that use only what the
GPU has and fit in memory by the arithmetic estimate, corrected by what its own jobs
reported (:mod:`cubic.strategies.candidates`, :mod:`cubic.proxy.memory`), minus the region
of any config the framework rejected. A config the corrected estimate rules out is never
proposed. Then two explicit phases:

1. **Warm-up** (space-filling): the first ``warmup`` proposals, and until half of them have
   finished, are spread over those candidates (greedy max-min distance in knob-rank space,
   from a modest random pool). Skipped when ``prior`` trials of other studies of the same
   workload kind give a proxy that already ranks well (cross-validated Kendall tau >=
   ``transfer_tau``).
2. **Model-guided** rounds: fit the proxy (:class:`cubic.proxy.model.ProxyModel`) on every
   finished trial (this study's and the prior), build a pool of up to ``pool_size``
   runnable candidates (plus mutations of the best trials so far, every one-knob-step
   neighbour of the best measured configs, plus TPE's proposals while the history is
   small, filtered the same way), score each by the constrained
   expected improvement over the best measured value (the proxy's expected gain in log
   throughput, times the classifier's probability of running and the memory model's
   probability of fitting), taking turns with an upper and a lower confidence bound times
   the same probabilities (``acquisition="portfolio"``; ``"ei"`` or ``"ucb"`` alone), and
   choose a diverse batch: after each pick, candidates close to it (in knob-rank space) are
   penalised, so parallel workers do not all measure the same neighbourhood, and a config
   whose memory is in doubt waits while a running job close to it in memory will settle
   that doubt (in a first batch ranked only by other studies' trials, every other pick
   leaves the chance to fit out: ``borrowed_turns``). No prediction is trusted closer
   than ``ei_floor`` (3 %, the scale of the proxy's error on configs it has not seen), so
   the improvement a config may bring is never rounded to nothing, except as far as the
   GP's learned metric puts the config next to a measured one (``familiar_floor``: the
   floor times sqrt(1 - c^2) for the kernel's largest correlation c with a measured
   trial), so that flipping switches that have not mattered is not worth trial after
   trial; and each knob value no trial of the study has measured yet (a tp it has not run)
   adds ``novelty_sd`` to the spread: the models copy such a value's effect from the
   nearest measured one, and would otherwise keep the search on the layouts it measured
   first.

Both phases respect a study's numerical-error bound: an additive model of the error score
over the reduced-precision sites a config switches on (FP8 GEMMs, all-to-all precision) is
fitted to the scores jobs report, with a prior that shares the bound among the sites one
config can switch on. In the warm-up a site no trial has measured yet is tried alone and by
one trial at a time; a model-guided round weighs a config by its probability of respecting
the bound (an untested site's cost drawn from the prior), as it weighs memory risks, so a
site whose first trial is a slow layout still in flight does not hold back the configs that
need it.

A config already in the history is never proposed again. Every proposal carries what the
proxy predicted, so predictions can be compared with measurements. In the service,
:meth:`CubicStrategy.prefit` fits ahead of demand what the next round needs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cubic.objectives import (
    MEMORY_METRIC,
    THROUGHPUT_POWER,
    job_gpus,
    metric_value,
    objective_values,
    violations,
)
from cubic.space import SpaceError
from cubic.store.objects import Trial, TrialState
from cubic.strategies.base import Proposal, Strategy, config_key
from cubic.strategies.candidates import Candidates, survey
from cubic.study import ResolvedStudy
from cubic.workload import Workload

if TYPE_CHECKING:  # XGBoost loads only when a model is fitted: the API starts faster
    from cubic.proxy.memory import MemoryModel
    from cubic.proxy.model import ProxyModel

Prior = Sequence[tuple[Workload, Trial]]

_TRANSFER_CACHE: dict[str, float] = {}
#: How a round scores candidates: expected improvement over the best measured value, or an
#: upper confidence bound (see :meth:`CubicStrategy._guided`).
ACQUISITIONS = ("portfolio", "ei", "ucb")
#: What the portfolio takes turns between: expected improvement, the upper and the lower
#: confidence bound.
TURNS = ("ei", "ucb", "lcb")
#: What the proxy of a batch ranked only by other studies' trials learns (see
#: ``borrowed_objective``): their throughputs, the same with each workload's mean taken
#: out, or pairwise orders within each workload.
BORROWED_OBJECTIVES = ("regression", "centered", "rank")
#: A two-objective study's picks for the front's fast end, named by the single-objective
#: acquisition that chose them (see ``front_anchor``).
ANCHORS = {"ei": "anchor-ei", "ucb": "anchor-ucb"}


class CubicStrategy(Strategy):
    """Proxy-guided search with a space-filling warm-up."""

    name = "cubic"
    accepts_prior = True

    def __init__(
        self,
        study: ResolvedStudy,
        *,
        seed: int | None = None,
        prior: Prior | None = None,
        proxy: ProxyModel | None = None,
        warmup: int | None = None,
        pool_size: int = 10_000,
        kappa: float = 1.0,
        feasibility_power: float = 2.0,
        radius: float = 0.5,
        transfer_tau: float = 0.25,
        n_members: int = 5,
        n_estimators: int = 150,
        refit_every: int = 2,
        min_feasible: float = 0.5,
        warmup_pool: int | None = None,
        error_prior: float = 1.0,
        offset: str = "auto",
        borrowed_radius: float = 3.0,
        borrowed_kappa: float = 0.0,
        borrowed_turns: Sequence[str] = ("ucb", "bold"),
        borrowed_objective: str = "centered",
        memory_slack: float = 0.15,
        memory_power: float = 1.0,
        acquisition: str = "portfolio",
        turns: Sequence[str] = ("ei", "ucb", "ei", "lcb"),
        ei_floor: float = 0.03,
        familiar_floor: bool = True,
        gp_linear: bool | None = None,
        scout_below: float = 0.95,
        novelty_sd: float = 0.03,
        ehvi_samples: int = 32,
        ehvi_top: int = 512,
        front_anchor: int = 4,
        error_prior_sd: float = 0.1,
        error_pseudo: float = 4.0,
        untested_in_flight: int = 2,
        climb_top: int = 32,
        climb_steps: int = 3,
        **options: Any,
    ) -> None:
        super().__init__(study, seed=seed, **options)
        self.prior: list[tuple[Workload, Trial]] = []
        self.set_prior(prior or [])
        self.proxy = proxy
        self.allow_fit = True
        self.warmup = warmup if warmup is not None else max(8, study.spec.budget.max_parallel)
        self.pool_size = pool_size
        self.kappa = kappa
        self.feasibility_power = feasibility_power
        self.radius = radius
        self.transfer_tau = transfer_tau
        self.n_members = n_members
        self.n_estimators = n_estimators
        self.refit_every = refit_every
        self.min_feasible = min_feasible
        self.warmup_pool = warmup_pool
        if climb_top < 1 or climb_steps < 0:
            raise ValueError(
                f"climb_top must be at least 1 and climb_steps at least 0, "
                f"got {climb_top} and {climb_steps}"
            )
        self.climb_top, self.climb_steps = climb_top, climb_steps
        self.error_prior = error_prior
        self.offset = offset
        self.borrowed_radius = borrowed_radius
        self.borrowed_kappa = borrowed_kappa
        if not borrowed_turns or set(borrowed_turns) - {"ucb", "bold"}:
            raise ValueError(
                f"borrowed_turns must be among ('ucb', 'bold'), got {list(borrowed_turns)!r}"
            )
        self.borrowed_turns = list(borrowed_turns)
        if borrowed_objective not in BORROWED_OBJECTIVES:
            raise ValueError(
                f"borrowed_objective must be one of {BORROWED_OBJECTIVES}, "
                f"got {borrowed_objective!r}"
            )
        self.borrowed_objective = borrowed_objective
        self.memory_slack = memory_slack
        self.memory_power = memory_power
        if acquisition not in ACQUISITIONS:
            raise ValueError(f"acquisition must be one of {ACQUISITIONS}, got {acquisition!r}")
        self.acquisition = acquisition
        if not turns or set(turns) - set(TURNS):
            raise ValueError(f"turns must be acquisitions among {TURNS}, got {list(turns)!r}")
        self.turns = list(turns)
        self.ei_floor = ei_floor
        self.familiar_floor = familiar_floor
        # The GP's linear part (see ProxyModel): on for one objective; with two, on the
        # bench's two-objective study it lowered the hypervolume at 32 trials.
        self.gp_linear = len(study.spec.objectives) == 1 if gp_linear is None else gp_linear
        self.scout_below = scout_below
        self.novelty_sd = novelty_sd
        self.ehvi_samples = ehvi_samples
        self.ehvi_top = ehvi_top
        self.front_anchor = front_anchor
        self.error_prior_sd = error_prior_sd
        self.error_pseudo = error_pseudo
        if untested_in_flight < 1:
            raise ValueError(f"untested_in_flight must be at least 1, got {untested_in_flight}")
        self.untested_in_flight = untested_in_flight
        self._sites: int | None = None
        self._model: tuple[int, ProxyModel] | None = None
        self._base: tuple[Candidates, np.ndarray] | None = None
        self._tau: tuple[int, float] | None = None
        self._memory: tuple[int, MemoryModel, np.ndarray] | None = None
        self._memory_objective_cache: tuple[int, MemoryModel] | None = None
        # Within one suggest() the history does not change: its memory model is looked up
        # once, not once per pick (each lookup counts the finished trials of the history).
        self._round_memory: MemoryModel | None = None
        self._round_best: list[dict[str, Any]] | None = None  # see _measured_best
        self._in_round = False
        self._regions: tuple[tuple[Any, ...], list[dict[str, Any]]] | None = None
        self._prior_best: tuple[tuple[int, int], list[dict[str, Any]]] | None = None
        self._seen_values: tuple[set[int], list[set[float]]] | None = None

    def set_prior(self, prior: Prior) -> None:
        """Finished trials of other studies; only those of this workload kind are kept."""
        kind = self.study.workload.kind
        self.prior = [(wl, t) for wl, t in prior if wl.kind == kind]

    # feasibility first -------------------------------------------------------------------
    @property
    def _limit(self) -> float:
        return 1.0 - self.study.spec.constraints.memory_headroom

    def _candidates(self) -> tuple[Candidates, np.ndarray]:
        """The study's plausible configs (:mod:`cubic.strategies.candidates`) and their
        positions in knob-rank space; built once."""
        if self._base is None:
            base = survey(
                self.study.workload,
                self.study.space,
                limit=self._limit,
                slack=self.memory_slack,
                want=4 * self.pool_size,
            ).candidates
            pos = self.positions(base.arrays) if len(base) else np.zeros((0, len(self._grids)))
            self._base = (base, pos)
        return self._base

    def _memory_model(self, history: Sequence[Trial]) -> MemoryModel:
        """The memory estimate corrected by this study's reports (refitted as trials finish).

        It is the arithmetic an engineer does before launching a job, checked against what
        the jobs measured: a config it says does not fit is never proposed."""
        if self._in_round and self._round_memory is not None:
            return self._round_memory
        done = [t for t in history if t.is_finished]
        if self._memory is None or self._memory[0] != len(done):
            model = self._fit_memory(done, overhead=False)
            base = self._candidates()[0]
            ok = self._check(model, base.X) & ~self._in_invalid_region(history, base.arrays)
            self._memory = (len(done), model, ok)
        if self._in_round:
            self._round_memory = self._memory[1]
        return self._memory[1]

    def _memory_objective(self, history: Sequence[Trial]) -> MemoryModel:
        """The memory model that predicts peak memory as an objective (cached per finished
        trial count): the estimate corrected by this study's reports, as
        :meth:`_memory_model`, with the fixed overhead every job holds fitted as well
        (:class:`cubic.proxy.memory.MemoryModel`, ``overhead=True``). What fits is still
        :meth:`_memory_model`'s call; this one ranks the lean end of a front, where a few GB
        the arithmetic leaves out are a fifth of the peak."""
        done = [t for t in history if t.is_finished]
        if self._memory_objective_cache is None or self._memory_objective_cache[0] != len(done):
            self._memory_objective_cache = (len(done), self._fit_memory(done, overhead=True))
        return self._memory_objective_cache[1]

    def _fit_memory(self, done: Sequence[Trial], *, overhead: bool) -> MemoryModel:
        """The memory estimate fitted to the finished trials that say something of memory
        (a reported peak, or an out-of-memory end)."""
        from cubic.proxy.features import featurize
        from cubic.proxy.memory import MemoryModel, is_oom, reported_peak_bytes

        useful = [t for t in done if reported_peak_bytes(t.metrics) is not None or is_oom(t)]
        X = (
            featurize(self.study.workload, [t.params for t in useful])
            if useful
            else np.zeros((0, 0))
        )
        base = self._candidates()[0]
        ref = base.X if len(base) >= 16 else None
        model = MemoryModel(self.study.workload, limit=self._limit, overhead=overhead)
        return model.fit(X, useful, ref)

    def _invalid_regions(self, history: Sequence[Trial]) -> list[dict[str, Any]]:
        """What each invalid trial (infeasible, not out of memory: an option the framework
        or the hardware rejects) had that no trial that ran had: its knob values never seen
        in a complete trial. Every config holding all of them is in the same region."""
        from cubic.proxy.memory import is_oom

        bad = [t for t in history if t.state == TrialState.INFEASIBLE and not is_oom(t)]
        if not bad:
            return []
        complete = [t for t in history if t.state in TrialState.MEASURED]  # they all ran
        # Called several times a round: recomputed only when the history has changed.
        key = (len(history), len(complete), tuple(t.id for t in bad))
        if self._regions is not None and self._regions[0] == key:
            return self._regions[1]
        names = self.study.space.names
        ran: dict[str, set[str]] = {k: set() for k in names}
        for t in complete:
            for k in names:
                ran[k].add(repr(t.params.get(k)))
        regions: list[dict[str, Any]] = []
        for t in bad:
            region = {
                k: t.params[k] for k in names if k in t.params and repr(t.params[k]) not in ran[k]
            }
            if region and region not in regions:
                regions.append(region)
        self._regions = (key, regions)
        return regions

    def _in_invalid_region(
        self, history: Sequence[Trial], arrays: dict[str, np.ndarray]
    ) -> np.ndarray:
        """Whether each config (struct of arrays) lies in a region an invalid trial ruled out:
        one such outcome teaches the whole region, not one config at a time."""
        n = len(next(iter(arrays.values()))) if arrays else 0
        out = np.zeros(n, dtype=bool)
        for region in self._invalid_regions(history):
            inside = np.ones(n, dtype=bool)
            for k, v in region.items():
                col = np.asarray(arrays[k], dtype=object)
                inside &= np.array([repr(x) == repr(v) for x in col.tolist()], dtype=bool)
            out |= inside
        return out

    def _check(self, model: MemoryModel, X: np.ndarray) -> np.ndarray:
        from cubic.proxy.features import hardware_ok, knows_knobs

        if len(X) == 0:
            return np.zeros(0, dtype=bool)
        ok = hardware_ok(self.study.workload, X)
        if knows_knobs(self.study.workload.kind, self.study.space.names):
            ok &= model.fits(X)
        return ok

    def _base_runnable(self, history: Sequence[Trial]) -> np.ndarray:
        """:meth:`_runnable` of every plausible config (cached with the memory model)."""
        self._memory_model(history)
        assert self._memory is not None
        return self._memory[2]

    def _runnable(self, history: Sequence[Trial], X: np.ndarray) -> np.ndarray:
        """Whether each config (feature rows) runs on the GPU and fits by the corrected
        estimate."""
        return self._check(self._memory_model(history), X)

    def _within_bounds(
        self,
        history: Sequence[Trial],
        N: np.ndarray,
        fitted: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Whether each candidate surely respects the study's numerical-error bound: the
        warm-up's rule, before the proxy can weigh a risk (model-guided rounds weigh it by
        :meth:`_bound_odds`).

        ``N`` holds the candidates' reduced-precision sites (:func:`cubic.proxy.features.
        numerics`). Jobs report the score they measured; it adds up over the sites a config
        switches on, so a non-negative least-squares fit on those columns learns each site's
        cost from a handful of trials (this study's and, since the score depends on the knobs
        alone, other studies' of the same kind). A site whose cost the measurements leave open
        is assumed to cost ``error_prior`` times the bound at its most aggressive setting, and
        a config switches on at most one site no trial has measured yet: each is tried alone
        (so that a trial that breaks the bound blames one site) until it is measured.
        ``fitted`` is :meth:`_error_model`'s answer for ``N``, where the caller has it.
        """
        if self.study.spec.constraints.max_error_score is None or N.shape[1] == 0:
            return np.ones(len(N), dtype=bool)
        predicted, seen, _ = fitted if fitted is not None else self._error_model(history, N)
        return self._respects_bound(predicted) & self._new_site_alone(history, N, seen)

    def _new_site_alone(
        self, history: Sequence[Trial], N: np.ndarray, seen: np.ndarray
    ) -> np.ndarray:
        """Whether each config respects the rule for sites no measured trial has switched on:
        such a site is tried alone (no other reduced-precision site beside it, so that its
        score is its own) and by one trial at a time (not while another one runs)."""
        active = N > 0
        new = active & ~seen
        in_flight = self._untested_sites(history, seen)
        alone = ~new.any(axis=1) | (active.sum(axis=1) <= 1)
        return alone & ~(active & in_flight).any(axis=1)

    def _respects_bound(self, predicted: np.ndarray) -> np.ndarray:
        bound = self.study.spec.constraints.max_error_score
        if bound is None:
            return np.ones(len(predicted), dtype=bool)
        return predicted <= bound * (1.0 + 1e-4) + 1e-9

    def _max_sites(self) -> int:
        """The most reduced-precision sites one config of the space switches on at once."""
        if self._sites is None:
            from cubic.proxy.features import numerics

            rng = np.random.default_rng(0)
            pool = self.study.space.sample_arrays(rng, 2048, self.context)
            self._sites = max(1, int((numerics(self.study.workload, pool) > 0).sum(axis=1).max()))
        return self._sites

    def _untested_sites(self, history: Sequence[Trial], seen: np.ndarray) -> np.ndarray:
        """Sites no measured trial has switched on yet (``seen`` is False) but a running one
        has: in the warm-up a second trial of such a site waits for the first one's score."""
        return self._untested_in_flight(history, seen) > 0

    def _untested_in_flight(self, history: Sequence[Trial], seen: np.ndarray) -> np.ndarray:
        """How many running trials switch on each site no measured trial has switched on."""
        from cubic.proxy.features import numerics

        if self.study.spec.constraints.max_error_score is None or len(seen) == 0:
            return np.zeros(len(seen), dtype=int)
        running = [t.params for t in history if not t.is_finished]
        if not running:
            return np.zeros(len(seen), dtype=int)
        return ((numerics(self.study.workload, running) > 0) & ~seen).sum(axis=0)

    def _bound_odds(self, history: Sequence[Trial], N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(probability that each row respects the study's error bound, the sites no measured
        trial has switched on per row): what a model-guided pick weighs a candidate by.

        The measured sites' costs are the error model's; a site no trial has measured yet
        costs an exponential draw with the prior's mean (``error_prior`` times the bound
        over the sites a config can switch on), so a candidate that needs it to cost less
        than the prior says is a risk priced like a memory risk, not ruled out. A config
        holds at most one such site (a score over the bound then blames it), and a batch
        takes it once (:class:`_Picker`). While the site's first trial runs, one more may
        take it (``untested_in_flight``: two at a time): a slow layout's job could otherwise
        hold it back for most of a study, and a site far over the bound costs one trial
        more, not one a round.
        """
        if self.study.spec.constraints.max_error_score is None or N.shape[1] == 0:
            return np.ones(len(N)), np.zeros_like(N, dtype=bool)
        predicted, seen, unseen = self._error_model(history, N)
        fresh = (N > 0) & ~seen
        bound = float(self.study.spec.constraints.max_error_score)
        slack = bound * (1.0 + 1e-4) + 1e-9 - (predicted - unseen)
        n_new = fresh.sum(axis=1)
        scale = np.where(unseen > 0, unseen, 1.0)
        risky = 1.0 - np.exp(-np.clip(slack, 0.0, None) / scale)
        p = np.where(n_new == 0, (slack >= 0).astype(float), np.where(n_new == 1, risky, 0.0))
        full = self._untested_in_flight(history, seen) >= self.untested_in_flight
        p = np.where((fresh & full).any(axis=1), 0.0, p)
        return p, fresh

    def _risk_weight(
        self, p: np.ndarray, p_bound: np.ndarray, p_fit: np.ndarray | None = None
    ) -> np.ndarray:
        """What a model-guided score is multiplied by: the chances to run
        (``feasibility_power``), to respect the error bound (:meth:`_bound_odds`) and, unless
        left out (a ``bold`` turn), to fit in memory (``memory_power``)."""
        w = np.clip(p, 1e-6, 1.0) ** self.feasibility_power
        if p_fit is not None:
            w = w * np.clip(p_fit, 1e-6, 1.0) ** self.memory_power
        return w * np.clip(p_bound, 1e-6, 1.0)

    def _error_model(
        self, history: Sequence[Trial], N: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(predicted error score of each row of ``N``, see :meth:`_within_bounds`; which
        sites measured trials have switched on; the part of each prediction that is the
        prior's, for the sites no measured trial has switched on)."""
        from scipy.optimize import nnls

        from cubic.proxy.features import numerics

        bound = float(self.study.spec.constraints.max_error_score or 0.0)

        def measured(t: Trial) -> bool:
            return (
                t.state in TrialState.MEASURED
                and bool(t.metrics)
                and isinstance(t.metrics.get("error_score"), int | float)
                and not isinstance(t.metrics.get("error_score"), bool)
            )

        done = [(self.study.workload, t) for t in history if measured(t)]
        done += [(wl, t) for wl, t in self.prior if measured(t)]
        by_wl: dict[int, list[tuple[Workload, Trial]]] = {}
        for wl, t in done:
            by_wl.setdefault(id(wl), []).append((wl, t))
        width = N.shape[1]
        Nt = (
            np.concatenate([numerics(g[0][0], [t.params for _, t in g]) for g in by_wl.values()])
            if by_wl
            else np.zeros((0, width))
        )
        yt = np.array([float(t.metrics["error_score"]) for g in by_wl.values() for _, t in g])
        seen = (Nt > 0).any(axis=0)
        scale = np.maximum(np.abs(N).max(axis=0, initial=0.0), np.abs(Nt).max(axis=0, initial=0.0))
        scale = np.where(scale > 0, scale, 1.0)
        # Each site's cost at its most aggressive setting, as a share of the bound: the prior,
        # pulled to the measurements with a tiny weight, so it holds only where they leave a
        # site's cost undetermined (never switched on, or only ever with other sites).
        prior = np.full(width, self.error_prior * bound / self._max_sites())
        coef = prior.copy()
        intercept = 0.0
        if len(yt):
            # The score of a config at full precision, from those measured (else none).
            plain = ~(Nt > 0).any(axis=1)
            intercept = float(np.clip(np.mean(yt[plain]), 0.0, None)) if plain.any() else 0.0
            w = 1e-3
            A = np.concatenate([Nt / scale, w * np.eye(width)])
            b = np.concatenate([yt - intercept, w * prior])
            coef = nnls(A, b)[0]
        unseen = (N / scale) @ np.where(seen, 0.0, prior)
        return intercept + (N / scale) @ coef, seen, unseen

    # the two phases ---------------------------------------------------------------------
    def suggest(self, history: Sequence[Trial], n: int) -> list[Proposal]:
        self._in_round, self._round_memory, self._round_best = True, None, None
        try:
            return self._suggest(history, n)
        finally:
            self._in_round, self._round_memory, self._round_best = False, None, None

    def _suggest(self, history: Sequence[Trial], n: int) -> list[Proposal]:
        own_done = [t for t in history if t.state in TrialState.LEARNED]
        rng = self.rng(history)
        seen = self.seen(history)
        # The warm-up is ``warmup`` proposals, and the model waits for half of them to have
        # finished: with parallel workers, waiting for all of them would spend a second
        # batch on space filling.
        proposed = sum(1 for t in history if t.attempt == 1 and t.source != "imported")
        warm = (
            proposed < self.warmup or len(own_done) < max(2, self.warmup // 2)
        ) and not self._transfer_ready()
        n_values = sum(1 for t in own_done if self._value(t)[0] is not None)
        if warm or (n_values < 2 and not self.prior):
            return self._space_filling(history, n, seen, rng)
        return self._guided(history, n, seen, rng)

    def _space_filling(
        self, history: Sequence[Trial], n: int, seen: set[str], rng: np.random.Generator
    ) -> list[Proposal]:
        base, base_pos = self._candidates()
        # A modest pool: max-min spacing over a huge one picks extreme corners, which are
        # the configs most likely to run out of memory or break a bound.
        size = self.warmup_pool or max(64, 8 * n)
        fresh = np.array([k not in seen for k in base.keys], dtype=bool)
        ok = fresh & self._base_runnable(history)
        fitted = self._error_model(history, base.N)
        safe = ok & self._within_bounds(history, base.N, fitted)
        seen_sites = fitted[1]
        # Fewer safe configs than asked: those that fit; none left that fits: the closest
        # misses (the space has nothing runnable left to try).
        mask = safe if safe.sum() >= n else ok if ok.any() else fresh
        rows = np.flatnonzero(mask)
        out: list[Proposal] = []
        # A modest pool first; if its rows run out (a site no trial has measured yet is
        # tried by one trial at a time), a wider one.
        for width in (size, 32 * size):
            pick = rows if len(rows) <= width else np.sort(rng.choice(rows, width, replace=False))
            out = self._spread(history, base.take(pick), base_pos[pick], n, rng, seen_sites)
            if len(out) >= n or len(pick) == len(rows):
                break
        return out

    def _spread(
        self,
        history: Sequence[Trial],
        pool: Candidates,
        pos: np.ndarray,
        n: int,
        rng: np.random.Generator,
        seen_sites: np.ndarray,
    ) -> list[Proposal]:
        """Greedy max-min picks in knob-rank space, away from every trial so far."""
        if not len(pool):
            return []
        taken = [t.params for t in history]
        anchor = (
            self.positions(self.study.space.to_arrays(taken))
            if taken
            else np.zeros((0, pos.shape[1]))
        )
        dist = (
            np.full(len(pool), np.inf)
            if len(anchor) == 0
            else np.abs(pos[:, None, :] - anchor[None, :, :]).sum(-1).min(axis=1)
        )
        sites = pool.N > 0
        untested = self._untested_sites(history, seen_sites)
        out: list[Proposal] = []
        for _ in range(min(n, len(pool))):
            blocked = (sites & untested).any(axis=1)
            live = np.where(blocked & (dist >= 0), -0.5, dist)
            j = int(np.argmax(live + rng.random(len(dist)) * 1e-6))
            if live[j] < 0:
                break
            out.append(Proposal(pool.configs[j], {"phase": "warm-up"}))
            untested |= sites[j] & ~seen_sites
            dist = np.minimum(dist, np.abs(pos - pos[j]).sum(axis=1))
            dist[j] = -1.0
        return out

    def _value(self, t: Trial) -> tuple[float | None, bool]:
        """(positive value to learn, feasible) of a finished trial of this study.

        With two or more objectives the proxy learns the throughput (from the first
        objective that follows it: throughput, cost, MFU or step time), from which it
        predicts each of those; peak memory comes from the memory model."""
        spec = self.study.spec
        if t.state == TrialState.INFEASIBLE:
            return None, False
        if t.state not in TrialState.MEASURED or not t.metrics:  # pruned: a partial measure
            return None, True
        if len(spec.objectives) > 1:
            return self._throughput_value(t)
        vals = objective_values(spec, t.metrics)
        if vals is None or vals[0] <= 0:
            return None, True
        if violations(spec, self.study.workload, t.metrics, t.params):
            return None, False
        v = vals[0]
        return (v if spec.objectives[0].direction == "maximize" else 1.0 / v), True

    def _throughput_value(self, t: Trial) -> tuple[float | None, bool]:
        """:meth:`_value` of a complete trial of a multi-objective study."""
        spec, wl = self.study.spec, self.study.workload
        vals = objective_values(spec, t.metrics or {}, job_gpus(wl, t.params))
        i = self._learned_objective()
        if vals is None or vals[i] <= 0:
            return None, True
        if violations(spec, wl, t.metrics or {}, t.params):
            return None, False
        return float(vals[i] ** THROUGHPUT_POWER[spec.objectives[i].metric]), True

    def _learned_objective(self) -> int:
        """The objective the proxy learns in a multi-objective study (one that follows the
        throughput; a spec with two distinct metrics always has one)."""
        return next(
            i for i, o in enumerate(self.study.spec.objectives) if o.metric in THROUGHPUT_POWER
        )

    def _training_set(
        self, history: Sequence[Trial]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Features, values (NaN where infeasible), feasibility and groups of all trials."""
        blocks: list[tuple[Workload, list[dict[str, Any]], list[float], list[bool], int]] = []
        rows = [(t.params, *self._value(t)) for t in history if t.state in TrialState.LEARNED]
        rows = [(p, v, f) for p, v, f in rows if v is not None or not f]
        if rows:
            blocks.append(
                (
                    self.study.workload,
                    [r[0] for r in rows],
                    [np.nan if r[1] is None else r[1] for r in rows],
                    [r[2] for r in rows],
                    0,
                )
            )
        by_wl: dict[int, list[tuple[Workload, Trial]]] = {}
        for wl, t in self.prior:
            by_wl.setdefault(id(wl), []).append((wl, t))
        for g, (_, pairs) in enumerate(by_wl.items(), start=1):
            wl = pairs[0][0]
            ps, vs, fs = [], [], []
            for _, t in pairs:
                if t.state == TrialState.INFEASIBLE:
                    ps.append(t.params)
                    vs.append(np.nan)
                    fs.append(False)
                elif t.state in TrialState.MEASURED and t.metrics:
                    v = t.metrics.get("throughput")
                    if isinstance(v, int | float) and v > 0:
                        ps.append(t.params)
                        vs.append(float(v))
                        fs.append(True)
            if ps:
                blocks.append((wl, ps, vs, fs, g))
        from cubic.proxy.features import featurize

        X = [featurize(wl, ps) for wl, ps, _, _, _ in blocks]
        y = [np.asarray(vs, dtype=float) for _, _, vs, _, _ in blocks]
        f = [np.asarray(fs, dtype=bool) for _, _, _, fs, _ in blocks]
        g = [np.full(len(ps), gid) for _, ps, _, _, gid in blocks]
        return np.concatenate(X), np.concatenate(y), np.concatenate(f), np.concatenate(g)

    def _fit(self, history: Sequence[Trial]) -> ProxyModel | None:
        """The proxy for this round: refitted once ``refit_every`` new trials have finished."""
        n_done = sum(1 for t in history if t.state in TrialState.LEARNED)
        if self._model is not None and n_done - self._model[0] < self.refit_every:
            return self._model[1]
        model = self._fit_now(history)
        if model is not None:
            self._model = (n_done, model)
        return model

    def _fit_now(self, history: Sequence[Trial]) -> ProxyModel | None:
        from cubic.proxy.model import ProxyModel

        X, y, feas, groups = self._training_set(history)
        ok = feas & np.isfinite(y)
        if int(np.sum(ok)) < 2:
            return None
        # Before this study has measured anything, what the model must get right is the
        # order of configs within a workload, not their speed: trees fitted to other
        # workloads' raw throughputs spend their splits on each workload's level
        # (``borrowed_objective``: "centered" takes each one's mean out, "rank" learns
        # only which of two configs of one job is faster).
        borrowed = not np.any(ok & (groups == 0))
        model = ProxyModel(
            kind=self.study.workload.kind,
            objective="rank" if borrowed and self.borrowed_objective == "rank" else "regression",
            center_groups=borrowed and self.borrowed_objective == "centered",
            offset=self.offset,
            n_members=self.n_members,
            n_estimators=self.n_estimators,
            gp_linear=self.gp_linear,
            seed=self.seed or 0,
        )
        return model.fit(X, y, feas, groups, gp_group=0)  # group 0: this study's trials

    def _transfer_ready(self) -> bool:
        """Whether the prior alone gives a proxy that ranks configs well (cached).

        Without fitting of its own (the service fits in the background), a stored proxy
        trained with the prior stands in for the check."""
        if len(self.prior) < 32:
            return False
        if not self.allow_fit:
            return self.proxy is not None
        # A prior that keeps growing (other studies running in the service) is scored again
        # only once it has grown by half, not at every new trial.
        if self._tau is None or len(self.prior) >= 1.5 * self._tau[0]:
            key = hashlib.sha1(
                "|".join(f"{wl.name}:{t.id}" for wl, t in self.prior).encode()
            ).hexdigest()
            if key not in _TRANSFER_CACHE:
                _TRANSFER_CACHE[key] = self._prior_tau()
            self._tau = (len(self.prior), _TRANSFER_CACHE[key])
        return self._tau[1] >= self.transfer_tau

    def prefit(self, history: Sequence[Trial]) -> bool:
        """Fit what the next round will need (the transfer check, the proxy, the memory
        correction, the candidates) ahead of demand; returns whether a proxy was fitted.

        The service calls it from a background thread after trials finish, so that a lease
        finds the study's model fitted: the same model the benchmark fits in-process, and
        a round proposes as it would without a service."""
        self._candidates()
        self._memory_model(history)
        own_done = [t for t in history if t.state in TrialState.LEARNED]
        if len(own_done) < self.warmup and not self._transfer_ready():
            return False
        before = self._model
        self._fit(history)
        return self._model is not before

    def _prior_tau(self) -> float:
        """Kendall tau of a proxy fitted on some prior workloads, scored on another one
        (leave one workload out), or over folds of the only prior workload."""
        from scipy.stats import kendalltau

        from cubic.proxy.model import ProxyModel

        X, y, feas, groups = self._training_set([])
        ids = np.unique(groups)
        if len(ids) < 2:  # one prior workload: three folds within it instead
            groups = np.random.default_rng(0).integers(0, 3, len(groups))
            ids = np.unique(groups)
        taus = []
        for gid in ids:
            test = (groups == gid) & feas & np.isfinite(y)
            train = groups != gid
            if test.sum() < 8 or np.sum(feas[train] & np.isfinite(y[train])) < 8:
                continue
            m = ProxyModel(
                kind=self.study.workload.kind, n_members=1, n_estimators=100, seed=0
            ).fit(X[train], y[train], feas[train], groups[train])
            tau = kendalltau(m.predict_log(X[test])[0], np.log(y[test])).statistic
            taus.append(0.0 if np.isnan(tau) else float(tau))
        return float(np.mean(taus)) if taus else 0.0

    # candidates and the acquisition ---------------------------------------------------------
    def _elites(self, history: Sequence[Trial]) -> list[dict[str, Any]]:
        """The best configs to mutate: this study's eight best trials, or, while it has
        measured fewer than ``warmup``, the best of every prior workload as well (the
        fastest configs of a similar job are the likeliest to be fast here)."""
        out = self._measured_best(history, 8)
        if len(self.study.spec.objectives) > 1:  # and every trial on the measured front
            front = self._measured_front(history)[0]
            out += [t.params for t in front if t.params not in out]
        if len(self._measured_best(history, self.warmup)) < self.warmup:
            out += self._prior_elites()
        return out

    def _prior_elites(self, per_workload: int = 4) -> list[dict[str, Any]]:
        """Each prior workload's fastest measured configs, made valid in this space (cached)."""
        key = (len(self.prior), per_workload)
        if self._prior_best is not None and self._prior_best[0] == key:
            return self._prior_best[1]
        by_wl: dict[int, list[tuple[float, Trial]]] = {}
        for wl, t in self.prior:
            v = (t.metrics or {}).get("throughput") if t.state == TrialState.COMPLETE else None
            if isinstance(v, int | float) and v > 0:
                by_wl.setdefault(id(wl), []).append((float(v), t))
        space, names = self.study.space, set(self.study.space.names)
        out: list[dict[str, Any]] = []
        for pairs in by_wl.values():
            pairs.sort(key=lambda p: p[0], reverse=True)
            for _, t in pairs[:per_workload]:
                try:
                    cfg = space.complete(
                        {k: v for k, v in t.params.items() if k in names}, self.context
                    )
                except SpaceError:
                    continue  # a knob value this space does not offer
                if not space.validate(cfg, self.context):
                    out.append(cfg)
        self._prior_best = (key, out)
        return out

    def _finite_knobs(self) -> list[tuple[Any, list[Any]]]:
        """(parameter, grid) of each knob a step can move: finite, with two or more values,
        not fixed by the context."""
        space = self.study.space
        fixed = space.fixed(self.context)
        return [
            (p, grid)
            for p, (_, grid) in zip(space.parameters, self._grids, strict=True)
            if isinstance(grid, list) and len(grid) > 1 and p.name not in fixed
        ]

    def _stepped(
        self,
        raw: dict[str, np.ndarray],
        finite: list[tuple[Any, list[Any]]],
        rng: np.random.Generator | None = None,
    ) -> dict[str, np.ndarray]:
        """The valid rows of stepped raw columns, completed (derived values computed). A
        knob that a step made active takes a random value of its grid (with ``rng``) or its
        first."""
        space = self.study.space
        for p, grid in finite:  # a knob switched on by a step may hold an inactive default
            bad = np.flatnonzero(~np.isin(raw[p.name], np.asarray(grid, dtype=object)))
            if len(bad):
                pick = rng.integers(0, len(grid), len(bad)) if rng else np.zeros(len(bad), int)
                raw[p.name][bad] = [grid[i] for i in pick]
        cols = {p.name: p.array(raw[p.name].tolist()) for p in space.parameters}
        arrays, keep = space.resolve_arrays(cols, self.context)
        return {k: v[keep] for k, v in arrays.items()}

    def _mutants(
        self, elites: Sequence[dict[str, Any]], m: int, rng: np.random.Generator
    ) -> dict[str, np.ndarray]:
        """``m`` valid configs one or two knob steps from ``elites`` (vectorised)."""
        space = self.study.space
        finite = self._finite_knobs()
        if not elites or not finite:
            return {}
        base = space.to_arrays(list(elites))
        rows = rng.integers(0, len(elites), m)
        # Object columns: a fixed-width string array would truncate a longer choice.
        raw = {k: np.asarray(v)[rows].astype(object) for k, v in base.items() if k in space.names}
        for step in range(2):
            pick = rng.integers(0, len(finite), m)
            moving = np.ones(m, dtype=bool) if step == 0 else rng.random(m) < 0.5
            for j, (p, grid) in enumerate(finite):
                rows_j = np.flatnonzero(moving & (pick == j))
                if not len(rows_j):
                    continue
                index = {v: i for i, v in enumerate(grid)}
                cur = np.array([index.get(v, 0) for v in raw[p.name][rows_j].tolist()])
                new = np.clip(cur + rng.choice([-1, 1], len(rows_j)), 0, len(grid) - 1)
                raw[p.name][rows_j] = [grid[i] for i in new]
        return self._stepped(raw, finite, rng)

    def _measured_best(self, history: Sequence[Trial], k: int = 64) -> list[dict[str, Any]]:
        """The ``k`` best measured configs of this study; ranked once a round."""
        if self._in_round and self._round_best is not None:
            return self._round_best[:k]
        ranked = sorted(
            ((v, t) for t in history for v in [self._value(t)[0]] if v is not None),
            key=lambda p: p[0],
            reverse=True,
        )
        best = [t.params for _, t in ranked]
        if self._in_round:
            self._round_best = best
        return best[:k]

    def _neighbours(self, configs: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        """Every valid config one knob step from one of ``configs`` (vectorised)."""
        space = self.study.space
        finite = self._finite_knobs()
        if not configs or not finite:
            return {}
        base = space.to_arrays(list(configs))
        # One row per (config, knob, direction).
        rows = np.repeat(np.arange(len(configs)), 2 * len(finite))
        knob = np.tile(np.repeat(np.arange(len(finite)), 2), len(configs))
        step = np.tile([-1, 1], len(configs) * len(finite))
        raw = {k: np.asarray(v)[rows].astype(object) for k, v in base.items() if k in space.names}
        inside = np.ones(len(rows), dtype=bool)
        for j, (p, grid) in enumerate(finite):
            r = np.flatnonzero(knob == j)
            index = {v: i for i, v in enumerate(grid)}
            new = np.array([index.get(v, -2) for v in raw[p.name][r].tolist()]) + step[r]
            good = (new >= 0) & (new < len(grid))  # an inactive knob's default is not moved
            inside[r[~good]] = False
            raw[p.name][r[good]] = [grid[i] for i in new[good]]
        return self._stepped({k: v[inside] for k, v in raw.items()}, finite)

    def _pool(
        self, history: Sequence[Trial], seen: set[str], rng: np.random.Generator
    ) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray]:
        """Runnable candidates never tried (plausible configs, mutations of the best, TPE's
        proposals) with their features, positions and reduced-precision sites."""
        base, base_pos = self._candidates()
        fresh = np.array([k not in seen for k in base.keys], dtype=bool)
        rows = np.flatnonzero(fresh & self._base_runnable(history))
        # Before this study has measured anything the ranking is borrowed, and a round
        # costs no fit of its own: score every candidate, so that the few configs the
        # prior ranks first are not missed by a subsample.
        if len(rows) > self.pool_size and self._measured(history):
            rows = np.sort(rng.choice(rows, self.pool_size, replace=False))
        taken = set(seen) | {base.keys[i] for i in rows}
        space = self.study.space
        elites = self._elites(history)
        mutants = self._mutants(elites, max(200, self.pool_size // 5), rng)
        near = self._neighbours(self._measured_best(history))
        extra = [
            *elites,
            *(space.from_arrays(mutants) if mutants else []),
            *(space.from_arrays(near) if near else []),
        ]
        if len(history) < 300:
            from cubic.strategies.samplers import TPEStrategy

            extra += [p.params for p in TPEStrategy(self.study, seed=self.seed).suggest(history, 4)]
        pool = base.configs.rows(rows)
        kept, Xe, pos_e, N_e = self._admit(history, extra, taken)
        return (
            pool + kept,
            np.concatenate([base.X[rows], Xe]),
            np.concatenate([base_pos[rows], pos_e]),
            np.concatenate([base.N[rows], N_e]),
        )

    def _measured(self, history: Sequence[Trial]) -> bool:
        """Whether this study has measured a value of its own (else a round is borrowed)."""
        return any(self._value(t)[0] is not None for t in history)

    def _admit(
        self, history: Sequence[Trial], configs: Sequence[dict[str, Any]], taken: set[str]
    ) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray]:
        """Of ``configs``, those not in ``taken`` (which they join, kept or not) that run by
        the corrected estimate and lie in no region an invalid trial ruled out, with their
        features, positions and reduced-precision sites: what the arithmetic or an invalid
        trial rules out is never tried."""
        from cubic.proxy.features import feature_names, featurize, numerics, numerics_names

        new = []
        for c in configs:
            k = config_key(c)
            if k not in taken:
                taken.add(k)
                new.append(c)
        arrays: dict[str, np.ndarray] = {}
        X, keep = np.zeros((0, 0)), np.zeros(0, dtype=int)
        if new:
            arrays = self.study.space.to_arrays(new)
            X = featurize(self.study.workload, arrays)
            runs = self._runnable(history, X) & ~self._in_invalid_region(history, arrays)
            keep = np.flatnonzero(runs)
        if not len(keep):
            kind = self.study.workload.kind
            return (
                [],
                np.zeros((0, len(feature_names(kind)))),
                np.zeros((0, len(self._grids))),
                np.zeros((0, len(numerics_names(kind)))),
            )
        arrays = {k: v[keep] for k, v in arrays.items()}
        return (
            [new[i] for i in keep],
            X[keep],
            self.positions(arrays),
            numerics(self.study.workload, arrays),
        )

    def _climb(
        self,
        history: Sequence[Trial],
        seen: set[str],
        model: ProxyModel,
        pool: list[dict[str, Any]],
        X: np.ndarray,
        pos: np.ndarray,
        N: np.ndarray,
        mu: np.ndarray,
        sd: np.ndarray,
    ) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A borrowed round's pool grown by local search on the prediction: the runnable
        one-knob-step neighbours of the ``climb_top`` best-predicted candidates join it, for
        up to ``climb_steps`` steps while they raise the best prediction (the random plus
        local search by which SMAC optimises its acquisition). The plausible configs are a
        uniform sample of a space of up to a million; before a study has measured anything
        no measured best anchors the neighbours that model-guided rounds add, and the few
        configs the borrowed proxy ranks first are rarely in the sample."""
        taken = set(seen) | {config_key(c) for c in pool}
        expanded = np.zeros(len(pool), dtype=bool)
        for _ in range(self.climb_steps):
            rows = np.flatnonzero(~expanded)
            top = rows[np.argsort(-mu[rows], kind="stable")[: self.climb_top]]
            expanded[top] = True
            near = self._neighbours([pool[i] for i in top])
            if not near:
                break
            kept, Xn, pos_n, N_n = self._admit(history, self.study.space.from_arrays(near), taken)
            if not kept:
                break
            mn, sn = model.predict_log(Xn)
            best = float(mu.max())
            pool = pool + kept
            expanded = np.concatenate([expanded, np.zeros(len(kept), dtype=bool)])
            X, pos, N = (
                np.concatenate([X, Xn]),
                np.concatenate([pos, pos_n]),
                np.concatenate([N, N_n]),
            )
            mu, sd = np.concatenate([mu, mn]), np.concatenate([sd, sn])
            if mn.max() <= best:
                break
        return pool, X, pos, N, mu, sd

    def _novelty(self, measured: Sequence[Trial], pos: np.ndarray) -> np.ndarray:
        """How many knobs of each candidate (rows of ``pos``) hold a value that none of the
        ``measured`` trials of this study has had. The trees and the GP learn nothing about a
        value never measured (a tp the study has not run): they copy the nearest measured one,
        with the confidence they have there, so that value's effect is an uncertainty of its
        own. The values seen are kept per trial id (a finished trial never changes), so a
        round reads only the trials measured since the last one."""
        if self._seen_values is None:
            self._seen_values = (set(), [set() for _ in self._grids])
        ids, values = self._seen_values
        new = [t for t in measured if t.id not in ids]
        if new:
            seen = self.positions(self.study.space.to_arrays([t.params for t in new]))
            for j, col in enumerate(values):
                col.update(np.round(seen[:, j], 9).tolist())
            ids.update(t.id for t in new)
        out = np.zeros(len(pos))
        if not measured or not len(pos):
            return out
        for j, (_, grid) in enumerate(self._grids):
            if isinstance(grid, list) and len(grid) > 1:
                out += ~np.isin(np.round(pos[:, j], 9), list(values[j]))
        return out

    def _p_fit(self, history: Sequence[Trial], X: np.ndarray) -> np.ndarray:
        """Each candidate's probability of fitting in memory; 1 where the memory model does
        not know this workload's knobs (it cannot tell)."""
        from cubic.proxy.features import knows_knobs

        if not knows_knobs(self.study.workload.kind, self.study.space.names):
            return np.ones(len(X))
        return self._memory_model(history).p_fit(X)

    def _deferred(
        self, history: Sequence[Trial], X: np.ndarray, p_fit: np.ndarray, Q: np.ndarray
    ) -> np.ndarray:
        """Which candidates wait: those whose memory is in doubt while a job in flight (rows
        ``Q``) will settle that doubt. A memory risk is scouted by one trial at a time, so
        that one config over the limit costs one trial, not a batch of its neighbours."""
        out = np.zeros(len(X), dtype=bool)
        risky = p_fit < self.scout_below
        if not risky.any() or len(Q) == 0:
            return out
        model = self._memory_model(history)
        Qrisky = model.p_fit(Q) < self.scout_below
        if Qrisky.any():
            out[risky] = model.correlation(X[risky], Q[Qrisky]).max(axis=1) > 0.5
        return out

    def _guided(
        self, history: Sequence[Trial], n: int, seen: set[str], rng: np.random.Generator
    ) -> list[Proposal]:
        model = self.proxy or (self._fit(history) if self.allow_fit else None)
        if model is None:
            return self._space_filling(history, n, seen, rng)
        if len(self.study.spec.objectives) > 1:
            return self._guided_front(model, history, n, seen, rng)
        pool, X, pos, N = self._pool(history, seen, rng)
        if not pool:  # every runnable config has been tried
            return self._space_filling(history, n, seen, rng)
        mu, sd = model.predict_log(X)
        if not self._measured(history):
            pool, X, pos, N, mu, sd = self._climb(history, seen, model, pool, X, pos, N, mu, sd)
        picker = self._throughput_picker(model, history, X, pos, N, mu, sd, model.feasible(X))
        done = sum(1 for t in history if (t.predicted or {}).get("phase") == "model")
        out: list[Proposal] = []
        direction = self.study.spec.objectives[0].direction
        for i in range(min(n, len(pool))):
            j, name, score = picker.pick(done + i)
            pred = float(np.exp(mu[j]))
            out.append(
                Proposal(
                    pool[j],
                    {
                        "phase": "model",
                        "value": pred if direction == "maximize" else 1.0 / pred,
                        "log_std": float(picker.sd[j]),
                        "p_feasible": float(picker.p[j]),
                        "p_fit": float(picker.p_fit[j]),
                        "p_bound": float(picker.p_bound[j]),
                        "acquisition": name,
                        "score": score,
                    },
                )
            )
            picker.taken(j)
        return out

    def _throughput_picker(
        self,
        model: ProxyModel,
        history: Sequence[Trial],
        X: np.ndarray,
        pos: np.ndarray,
        N: np.ndarray,
        mu: np.ndarray,
        sd: np.ndarray,
        p: np.ndarray,
        p_fit: np.ndarray | None = None,
        lower: bool = True,
    ) -> _Picker:
        """The single-objective acquisition over a pool (features ``X``, knob-rank
        positions ``pos``, reduced-precision sites ``N``, the proxy's log-throughput ``mu``
        and ``sd``, probability of running ``p``): constrained expected improvement taking
        turns with the upper bound and, with ``lower``, the lower bound, as the module
        docstring says, with a diverse batch."""
        from cubic.proxy.features import featurize

        if p_fit is None:
            p_fit = self._p_fit(history, X)
        # Before this study has measured anything, the trees' spread says how the prior
        # workloads disagree, not where this one's optimum may be: rank by the prediction,
        # and let the wider radius below hedge the batch.
        valued = [(t, v) for t in history for v in [self._value(t)[0]] if v is not None]
        values = [v for _, v in valued]
        measured = bool(values)
        if measured and self.novelty_sd > 0:
            novel = self._novelty([t for t, _ in valued], pos)
            sd = np.sqrt(sd**2 + novel * self.novelty_sd**2)
        ucb = mu + (self.kappa if measured else self.borrowed_kappa) * sd
        gains = {"ucb": np.exp(ucb - ucb.max())}
        if measured and self.acquisition in ("ei", "portfolio"):
            # The floor is for what the models cannot know: a config close to a measured
            # one in the GP's learned metric (a switch that has not mattered flipped) keeps
            # the GP's own spread.
            fam = model.familiarity(X) if self.familiar_floor else np.zeros(len(X))
            floor = np.maximum(sd, self.ei_floor * np.sqrt(np.clip(1.0 - fam**2, 0.0, 1.0)))
            ei = _expected_improvement(mu, floor, float(np.log(max(values))))
            gains["ei"] = ei + 1e-12 * gains["ucb"]
        # The portfolio takes turns (``turns``, counted over the study's model-guided
        # proposals): by default half by expected improvement, a quarter each by the upper
        # and the lower bound. EI and UCB both favour the configs the models are least
        # sure of, and the best-predicted of many uncertain configs is overpredicted (the
        # winner's curse): the lower bound's turns go to the config the models are surest
        # is fast, often one knob step from the best measured.
        lcb = mu - sd
        gains["lcb"] = np.exp(lcb - lcb.max())
        turns = (
            [t for t in self.turns if lower or t != "lcb"] or ["ei"]
            if self.acquisition == "portfolio" and "ei" in gains
            else ["ei" if "ei" in gains and self.acquisition == "ei" else "ucb"]
        )
        if not measured and self.acquisition == "portfolio":
            # Before this study's first memory report every config near the limit has an
            # even chance to fit, and the fastest layouts of the largest models are near
            # it: every other pick of a borrowed batch ranks by the prediction alone, and a
            # picked memory risk holds back the risks like it (one scout each).
            gains["bold"] = gains["ucb"]
            turns = list(self.borrowed_turns)
        p_bound, fresh = self._bound_odds(history, N)  # fresh: untested sites, per row
        weight = self._risk_weight(p, p_bound, p_fit)
        likely = (p >= self.min_feasible) & (p_bound > 0)
        running = [t.params for t in history if not t.is_finished]
        Xr = (
            featurize(self.study.workload, self.study.space.to_arrays(running)) if running else None
        )
        waiting = (
            self._deferred(history, X, p_fit, Xr)
            if Xr is not None
            else np.zeros(len(X), dtype=bool)
        )
        scores: dict[str, np.ndarray] = {}
        for name in turns:
            score = gains[name] * (weight if name != "bold" else self._risk_weight(p, p_bound))
            if np.any(likely):  # spend trials only where the config likely runs
                score = np.where(likely, score, score * 1e-6)
            scores[name] = np.where(waiting, score * 1e-3, score)
        # Before this study has measured anything, the ranking is borrowed from other
        # workloads: spread the batch wider so that one wrong belief costs fewer trials.
        radius = self.radius * (1.0 if measured else self.borrowed_radius)
        return _Picker(self, history, X, pos, sd, p, p_fit, scores, turns, fresh, radius, p_bound)

    # several objectives: the Pareto front -------------------------------------------------
    def _directions(self) -> list[str]:
        return [str(o.direction) for o in self.study.spec.objectives]

    def _measured_front(self, history: Sequence[Trial]) -> tuple[list[Trial], np.ndarray]:
        """The complete trials within the constraints on this study's measured front, and
        every such trial's objective values (rows; every column maximised)."""
        from cubic.pareto import non_dominated, oriented

        spec, wl = self.study.spec, self.study.workload
        rows: list[tuple[Trial, list[float]]] = []
        for t in history:
            if t.state != TrialState.COMPLETE or not t.metrics:
                continue
            vals = objective_values(spec, t.metrics, job_gpus(wl, t.params))
            if vals is not None and not violations(spec, wl, t.metrics, t.params):
                rows.append((t, vals))
        if not rows:
            return [], np.zeros((0, len(spec.objectives)))
        pts = oriented([v for _, v in rows], self._directions())
        on = non_dominated(pts)
        return [t for (t, _), keep in zip(rows, on, strict=True) if keep], pts

    def _objective_offsets(self, history: Sequence[Trial]) -> np.ndarray:
        """Per objective that follows the throughput, log(value) - power * log(throughput)
        over the measured trials (the median; a constant of the cluster: GPU count for
        cost, peak FLOP/s for MFU); 0 for the others."""
        spec, wl = self.study.spec, self.study.workload
        out = np.zeros(len(spec.objectives))
        for i, o in enumerate(spec.objectives):
            if o.metric not in THROUGHPUT_POWER:
                continue
            diffs = []
            for t in history:
                thr, _ = self._value(t)
                v = metric_value(t.metrics or {}, o.metric, job_gpus(wl, t.params))
                if thr is not None and v is not None and v > 0:
                    diffs.append(np.log(v) - THROUGHPUT_POWER[o.metric] * np.log(thr))
            out[i] = float(np.median(diffs)) if diffs else 0.0
        return out

    def _predicted_objectives(
        self, history: Sequence[Trial], mu: np.ndarray, sd: np.ndarray, X: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean, sd) of each candidate's log objective values (columns: the objectives),
        and which columns share the throughput's uncertainty: every objective that follows
        the throughput from the proxy's prediction of it, peak memory from the memory model
        (:meth:`_memory_objective`)."""
        objectives = self.study.spec.objectives
        offsets = self._objective_offsets(history)
        m = np.zeros((len(X), len(objectives)))
        s = np.zeros_like(m)
        shared = np.zeros(len(objectives), dtype=bool)
        for i, o in enumerate(objectives):
            if o.metric == MEMORY_METRIC:
                log_ratio, s[:, i] = self._memory_objective(history).log_ratio(X)
                m[:, i] = log_ratio + np.log(self.study.workload.gpu.hbm_bytes / 1e9)
            else:
                m[:, i] = THROUGHPUT_POWER[o.metric] * mu + offsets[i]
                s[:, i] = sd
                shared[i] = True
        return m, s, shared

    def _worst_acceptable(self) -> np.ndarray:
        """Per objective, the worst value a config within the study's constraints can have
        (NaN where none is known): for peak memory, the share of HBM a config may use.

        The front's extremes count only if the reference point lies beyond them. The rule
        of :func:`cubic.pareto.reference_point` sets it from the fronts measured and
        predicted so far, so while the proxy overrates the configs in the middle of the
        range, the fastest configs (those that spend the most memory) lie beyond it and are
        never worth a trial. A bound the constraints set is where a front can end, whatever
        the models believe, and the reference lies at least that far out."""
        out = np.full(len(self.study.spec.objectives), np.nan)
        for i, o in enumerate(self.study.spec.objectives):
            if o.metric == MEMORY_METRIC and o.direction == "minimize":
                out[i] = self._limit * self.study.workload.gpu.hbm_bytes / 1e9
        return out

    def _prediction_error(self, history: Sequence[Trial]) -> float:
        """How far off the proxy's throughput predictions have been on this study (log
        scale): the root mean square of log(measured / predicted) over the model-guided
        trials measured so far, pooled with ``error_pseudo`` prior trials at
        ``error_prior_sd``.

        A proxy fitted on a dozen trials agrees with itself (the boosted members and the GP
        see the same rows) far more than with the jobs: on configs unlike the measured ones
        it can be 30 % off with a spread of 3 %. Chosen for their high predictions, such
        picks are the ones it overrates most; what its past picks measured says how far to
        trust the results of those still running."""
        spec, wl = self.study.spec, self.study.workload
        i = self._learned_objective()
        sq = 0.0
        count = 0
        for t in history:
            pred = t.predicted or {}
            if t.state != TrialState.COMPLETE or pred.get("phase") != "model":
                continue
            values = pred.get("values")
            vals = objective_values(spec, t.metrics or {}, job_gpus(wl, t.params))
            if not values or vals is None or vals[i] <= 0 or values[i] <= 0:
                continue
            r = np.log(vals[i] / values[i]) / THROUGHPUT_POWER[spec.objectives[i].metric]
            sq += float(r) ** 2
            count += 1
        prior = self.error_pseudo * self.error_prior_sd**2
        return float(np.sqrt((prior + sq) / (self.error_pseudo + count)))

    def _guided_front(
        self,
        model: ProxyModel,
        history: Sequence[Trial],
        n: int,
        seen: set[str],
        rng: np.random.Generator,
    ) -> list[Proposal]:
        """A model-guided round of a study of two or more objectives: greedy batch expected
        hypervolume improvement over the measured front, with the pending results fantasised.

        Each candidate's objective values are drawn ``ehvi_samples`` times from the models'
        predictions (the throughput's spread, novelty included, shared by every objective
        that follows it; peak memory from :meth:`_memory_objective`), and its expected
        improvement of the front's hypervolume is the mean over the draws, times the
        probabilities of running and of fitting as in the single-objective rounds. The
        reference point is the rule of :func:`cubic.pareto.reference_point` applied to the
        measured front together with the front the models predict over the candidates, and
        at least as far out as the constraints allow (:meth:`_worst_acceptable`), so that
        both ends of the front (the fastest config, the leanest) are worth reaching.

        Running trials and each pick of the batch join the front as fantasies: in each draw
        their values are drawn from their predictions, with the spread the proxy's picks
        have measured on this study (:meth:`_prediction_error`), independently of the
        candidate's (as q-EHVI integrates over pending points). A believed result at its
        mean would let the picks the proxy overrates most (the likeliest ones to be picked)
        shut the batch out of the whole region they seem to dominate, and push the next picks
        to still more overrated configs; a fantasy dominates only in the draws where it
        does. (The candidates keep the proxy's own spread: widened as much, every upside
        would outweigh the measured front and the batch would chase the middle of the
        range.)"""
        from cubic.pareto import non_dominated, oriented, reference_point

        directions = self._directions()
        if len(directions) != 2:
            return self._guided_scalarised(model, history, n, seen, rng)
        pool, X, pos, N = self._pool(history, seen, rng)
        if not pool:
            return self._space_filling(history, n, seen, rng)
        mu, sd = model.predict_log(X)
        p = model.feasible(X)
        p_fit = self._p_fit(history, X)
        from cubic.proxy.features import featurize

        _, measured_pts = self._measured_front(history)
        valued = [t for t in history if self._value(t)[0] is not None]
        sd_raw = sd
        if valued and self.novelty_sd > 0:
            novel = self._novelty(valued, pos)
            sd = np.sqrt(sd**2 + novel * self.novelty_sd**2)
        m, s, shared = self._predicted_objectives(history, mu, sd, X)
        # A fantasy's spread is what the proxy's picks have measured, not its own belief.
        extra = self._prediction_error(history)
        s_pending = np.where(shared[None, :], np.sqrt(s**2 + extra**2), s)
        sign = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
        mean_pts = oriented(np.exp(m), directions)
        p_bound, fresh = self._bound_odds(history, N)
        likely = (p >= self.min_feasible) & (p_bound > 0) & (p_fit >= 0.5)
        basis = mean_pts[likely] if likely.any() else mean_pts
        ref = reference_point(np.concatenate([measured_pts, basis[non_dominated(basis)]]))
        ref = np.fmin(ref, sign * self._worst_acceptable())
        # Draws: common random numbers across candidates (the same z for every row), one
        # shared draw for the throughput's objectives and one for memory's.
        k = max(1, int(self.ehvi_samples))
        z_thr = rng.standard_normal(k)
        z_mem = rng.standard_normal(k)
        z = np.where(shared[None, :], z_thr[:, None], z_mem[:, None])  # (k, objectives)
        weight = self._risk_weight(p, p_bound, p_fit)
        running = [t.params for t in history if not t.is_finished]
        Xr = (
            featurize(self.study.workload, self.study.space.to_arrays(running)) if running else None
        )
        waiting = (
            self._deferred(history, X, p_fit, Xr)
            if Xr is not None
            else np.zeros(len(X), dtype=bool)
        )
        front = measured_pts[non_dominated(measured_pts)] if len(measured_pts) else measured_pts

        def fantasies(m_rows: np.ndarray, s_rows: np.ndarray) -> np.ndarray:
            """(k, rows, 2) draws of pending results, independent of the candidates'."""
            zt = rng.standard_normal((k, len(m_rows), 1))
            zm = rng.standard_normal((k, len(m_rows), 1))
            zp = np.where(shared[None, None, :], zt, zm)
            return sign * np.exp(m_rows[None, :, :] + s_rows[None, :, :] * zp)

        pending = np.zeros((k, 0, 2))
        if running:
            assert Xr is not None
            mr, sr = model.predict_log(Xr)
            mr_obj, sr_obj, _ = self._predicted_objectives(
                history, mr, np.sqrt(sr**2 + extra**2), Xr
            )
            pending = fantasies(mr_obj, sr_obj)
        # The first pick's score against the measured front alone bounds every later one
        # (a fantasy only ever covers more), so the batch is chosen among the best ``top``.
        base = self._ehvi(m, s, z, sign, front, pending, ref, np.arange(len(pool)))
        first = (base + 1e-12) * weight
        if np.any(likely):
            first = np.where(likely, first, first * 1e-6)
        first = np.where(waiting, first * 1e-3, first)
        top = np.argsort(-first, kind="stable")[: max(self.ehvi_top, n)]
        out: list[Proposal] = []
        alive = np.zeros(len(pool), dtype=bool)
        alive[top] = True
        ehvi = np.full(len(pool), -1.0)
        ehvi[top] = base[top]
        # Every ``front_anchor``-th model-guided proposal of the study goes to the front's
        # fast end by the single-objective acquisition of the throughput.
        history_picks = [(t.predicted or {}) for t in history]
        done = sum(1 for pr in history_picks if pr.get("phase") == "model")
        anchors = sum(1 for pr in history_picks if pr.get("acquisition") in ANCHORS.values())
        # Built only when a pick of this round is an anchor, then told the batch so far.
        picker: _Picker | None = None
        batch: list[int] = []
        for i in range(min(n, len(pool))):
            if self.front_anchor > 0 and (done + i) % self.front_anchor == 0:
                if picker is None:
                    # The anchors take the two optimistic turns: they are there to push
                    # the front's fast end outward.
                    picker = self._throughput_picker(
                        model, history, X, pos, N, mu, sd_raw, p, p_fit, lower=False
                    )
                    for taken in batch:
                        picker.taken(taken)
                j, name, best = picker.pick(anchors)
                anchors += 1
                if best < 0:  # every candidate is taken
                    j = -1
                else:
                    out.append(
                        _front_proposal(pool[j], m[j], sd[j], p[j], p_fit[j], ANCHORS[name], best)
                    )
            else:
                j = -1
            if j < 0:
                score = (ehvi + 1e-12) * weight
                if np.any(likely & alive):
                    score = np.where(likely, score, score * 1e-6)
                score = np.where(waiting, score * 1e-3, score)
                score = np.where(alive, score, -1.0)
                j = int(np.argmax(score))
                if score[j] < 0:
                    break
                out.append(_front_proposal(pool[j], m[j], sd[j], p[j], p_fit[j], "ehvi", score[j]))
            batch.append(j)
            if picker is not None:
                picker.taken(j)
            alive[j] = False
            ehvi[j] = -1.0
            pending = np.concatenate(
                [pending, fantasies(m[j : j + 1], s_pending[j : j + 1])], axis=1
            )
            rows = np.flatnonzero(alive)
            ehvi[rows] = self._ehvi(m, s, z, sign, front, pending, ref, rows)
            waiting = waiting | self._deferred(history, X, p_fit, X[j : j + 1])
            if fresh[j].any():  # that untested site is now in flight: one trial at a time
                weight = np.where((fresh & fresh[j]).any(axis=1), weight * 1e-6, weight)
        return out

    @staticmethod
    def _ehvi(
        m: np.ndarray,
        s: np.ndarray,
        z: np.ndarray,
        sign: np.ndarray,
        front: np.ndarray,
        pending: np.ndarray,
        ref: np.ndarray,
        rows: np.ndarray,
    ) -> np.ndarray:
        """The mean hypervolume improvement of candidates ``rows`` (log means ``m``, spreads
        ``s``, draws ``z`` of shape (k, objectives)) over ``front`` together with the k
        fantasies of the ``pending`` results (k, pending, objectives)."""
        from cubic.pareto import improvement_2d

        if not len(rows):
            return np.zeros(0)
        total = np.zeros(len(rows))
        for d in range(len(z)):
            draw = sign * np.exp(m[rows] + s[rows] * z[d][None, :])
            total += improvement_2d(draw, np.concatenate([front, pending[d]]), ref)
        return total / len(z)

    def _guided_scalarised(
        self,
        model: ProxyModel,
        history: Sequence[Trial],
        n: int,
        seen: set[str],
        rng: np.random.Generator,
    ) -> list[Proposal]:
        """A model-guided round of three or more objectives (ParEGO): each pick maximises a
        random augmented Chebyshev scalarisation of the candidates' optimistic predictions
        (mean plus ``kappa`` spreads, each objective scaled to the candidates' range), times
        the probabilities of running and of fitting; picks close to an earlier one in
        knob-rank space are penalised as in single-objective rounds."""
        pool, X, pos, N = self._pool(history, seen, rng)
        if not pool:
            return self._space_filling(history, n, seen, rng)
        mu, sd = model.predict_log(X)
        p = model.feasible(X)
        p_fit = self._p_fit(history, X)
        m, s, _ = self._predicted_objectives(history, mu, sd, X)
        sign = np.array([1.0 if d == "maximize" else -1.0 for d in self._directions()])
        opt = sign * m + self.kappa * s  # optimistic, every column maximised (log scale)
        lo, hi = opt.min(axis=0), opt.max(axis=0)
        norm = (opt - lo) / np.where(hi > lo, hi - lo, 1.0)
        p_bound, _ = self._bound_odds(history, N)
        weight = self._risk_weight(p, p_bound, p_fit)
        likely = (p >= self.min_feasible) & (p_bound > 0)
        penalty = np.ones(len(pool))
        out: list[Proposal] = []
        for _ in range(min(n, len(pool))):
            w = rng.dirichlet(np.ones(len(sign)))
            cheb = (w * norm).min(axis=1) + 0.05 * (w * norm).sum(axis=1)
            score = (cheb + 1e-9) * weight * penalty
            if np.any(likely):
                score = np.where(likely, score, score * 1e-6)
            j = int(np.argmax(score))
            if score[j] <= 0:
                break
            out.append(_front_proposal(pool[j], m[j], sd[j], p[j], p_fit[j], "parego", score[j]))
            dist = np.abs(pos - pos[j]).sum(axis=1)
            penalty = penalty * (1.0 - np.exp(-((dist / self.radius) ** 2)))
            penalty[j] = 0.0
        return out


class _Picker:
    """A batch chosen one pick at a time from scores over a pool: after each pick the
    candidates close to it (in knob-rank space) are penalised, those whose memory is in
    doubt wait while it runs, and an untested reduced-precision site it carries is kept
    to one trial at a time."""

    def __init__(
        self,
        strategy: CubicStrategy,
        history: Sequence[Trial],
        X: np.ndarray,
        pos: np.ndarray,
        sd: np.ndarray,
        p: np.ndarray,
        p_fit: np.ndarray,
        scores: dict[str, np.ndarray],
        turns: list[str],
        fresh: np.ndarray,
        radius: float,
        p_bound: np.ndarray,
    ) -> None:
        self.strategy, self.history = strategy, history
        self.X, self.pos, self.sd, self.p, self.p_fit = X, pos, sd, p, p_fit
        self.scores, self.turns, self.fresh, self.radius = scores, turns, fresh, radius
        self.p_bound = p_bound  # each row's chance to respect the error bound

    def pick(self, turn: int) -> tuple[int, str, float]:
        """(row, acquisition, score) of the best candidate by the acquisition whose turn
        ``turn`` (the study's count of model-guided proposals) is."""
        name = self.turns[turn % len(self.turns)]
        j = int(np.argmax(self.scores[name]))
        return j, name, float(self.scores[name][j])

    def taken(self, j: int) -> None:
        """Row ``j`` joins the batch (picked here or by another rule)."""
        dist = np.abs(self.pos - self.pos[j]).sum(axis=1)
        waiting = self.strategy._deferred(self.history, self.X, self.p_fit, self.X[j : j + 1])
        fresh = self.fresh
        for key, score in self.scores.items():
            score = score * (1.0 - np.exp(-((dist / self.radius) ** 2)))
            score = np.where(waiting, score * 1e-3, score)
            if fresh[j].any():  # that untested site is now in flight: one trial at a time
                score = np.where((fresh & fresh[j]).any(axis=1), score * 1e-6, score)
            score[j] = -1.0
            self.scores[key] = score


def _expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """Expected gain in log throughput over ``best`` (Jones et al., 1998), per candidate.

    Multiplied by the probabilities of running and of fitting it is the constrained
    expected improvement of Gardner et al. (2014): a config near the memory limit that may
    beat the best is worth its risk, a safe one that cannot beat it is not; an upper bound
    times those probabilities prefers the safe one whenever its mean is close."""
    from scipy.special import ndtr

    s = np.maximum(sd, 1e-6)
    z = (mu - best) / s
    return s * (np.exp(-0.5 * z**2) / np.sqrt(2 * np.pi) + z * ndtr(z))


def _front_proposal(
    config: dict[str, Any],
    log_values: np.ndarray,
    log_std: float,
    p_feasible: float,
    p_fit: float,
    acquisition: str,
    score: float,
) -> Proposal:
    """A model-guided proposal of a study with several objectives, with the predictions that
    chose it (every objective's, in the objectives' order)."""
    vals = np.exp(log_values).tolist()
    return Proposal(
        config,
        {
            "phase": "model",
            "value": vals[0],
            "values": vals,
            "log_std": float(log_std),
            "p_feasible": float(p_feasible),
            "p_fit": float(p_fit),
            "acquisition": acquisition,
            "score": float(score),
        },
    )

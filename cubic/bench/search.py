"""Search efficiency: how many trials each strategy needs to find a near-optimal config.

Every (study, strategy, seed) run replays the production loop of ``workers`` parallel workers
on the simulated cluster, without a database so that hundreds of runs take minutes:

* the strategy is asked for ``workers`` proposals at the start and for one more each time a
  trial finishes, with the running trials in the history, as the tuner asks when a worker
  leases (the asynchronous loop, not rounds of ``workers``). Jobs take simulated time:
  ``STARTUP_S`` to launch plus their measured steps; an out-of-memory or invalid config dies
  at launch and a lost node after ``2 * STARTUP_S``. Ties finish in trial-number order, so a
  run is a pure function of its seed;
* jobs run through :func:`cubic.sim.job.run_job` with the default noise (jitter, stragglers,
  rare node failures), seeded by the run seed and the trial number. A failed trial is retried
  (same params, ``attempt + 1``, up to the study's ``max_retries``) and does not count
  against the budget; infeasible trials do;
* a trial's value is its *measured* objective metric, and the incumbent after ``n`` trials
  is the best measured config among complete trials that respect the study's constraints.
  Scores use the incumbent's *true* (noise-free) value divided by the space's true optimum,
  found by scoring every valid config with the vectorised simulator, so noise cannot inflate
  a score. Noise can make the incumbent switch to a config that is truly slower, so this
  curve may dip a little: that is what noise costs a user. ``best_tried`` (the best true
  value among the configs tried so far) is monotone and bounds it from above.

Multi-objective studies (two or more objectives, such as the throughput against peak memory
study in ``search_spaces/bench_mo/``) are scored by hypervolume instead: the true front comes
from the same exhaustive simulation, its nadir plus a tenth of its range is the reference
point (:func:`cubic.pareto.reference_point`), and the score after ``n`` trials is the
hypervolume of the true values of the configs on the *measured* front over the true front's
(1.0: the whole front found). Their landscape carries ``objectives``, ``directions``,
``front`` (the true front's values) and ``reference``; ``optimum`` is the true front's
hypervolume (with every objective maximised: minimised ones negated).

Counting: the ``n``-th trial is the ``n``-th proposal whose last attempt has finished, in
finish order. The infeasible share counts trials that could not run and complete trials
that broke a constraint (memory headroom, error bound), as the tuner treats both.

Transfer: ``history`` maps a study name to ``(workload, trial)`` pairs from *other* studies
(see :func:`history_from_other_studies`: by default each other study's own ``cubic``
search, as a service holds it once those studies have run). A strategy receives them as
``prior=[...]`` when its class names a ``prior`` keyword in ``__init__`` or sets
``accepts_prior = True``; every other strategy runs without them (the Optuna-backed ones
would hand unknown options to their sampler).

JSON written by :meth:`BenchResult.to_dict` (``version`` 1)::

    settings: {studies, strategies, seeds, workers, budget, checkpoints, targets, transfer,
               noise}
    studies:  {name: {file, kind, workload, cluster, metric, direction, size,
                      infeasible_share, optimum, optimum_config, baseline_ratio,
                      objectives, directions, front, reference}}
    runs:     [{study, strategy, seed, curve, best_tried, trials_to, n_trials, n_attempts,
                n_failed, n_infeasible, infeasible_share, best_config, best_measured,
                best_ratio, proxy_tau, prior_trials, wall_s, makespan_s}]
    summary:  [{study, strategy, runs, best_at: {"8": {median, q25, q75}, ...},
                trials_to: {"0.95": {median, reached}, "0.99": {...}},
                infeasible_share, proxy_tau: {median, min}, wall_s}]

``proxy_tau`` is the proxy model's cross-validated Kendall tau (5 folds, the mean over
folds, as the service stores it) on the run's own finished trials: how well the model ranks
the configurations the search chose to measure, which are harder to tell apart than random
ones because they crowd around the fast region.
    skipped:  [strategy names not available]
"""

from __future__ import annotations

import heapq
import inspect
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from cubic.errors import InvalidInput
from cubic.objectives import (
    MEMORY_METRIC,
    better,
    cost_per_million,
    job_gpus,
    objective_values,
    violations,
)
from cubic.outcome import Outcome
from cubic.pareto import hypervolume, non_dominated, oriented, reference_point
from cubic.sim import SimResult, simulate
from cubic.sim.job import (
    STARTUP_S,
    NoiseModel,
    SimulatedJob,
    job_duration,
    run_job,
    simulate_job,
)
from cubic.store.objects import Trial, TrialState
from cubic.strategies import REGISTRY, Strategy
from cubic.study import PruningSpec, ResolvedStudy, StrategySpec, load_spec
from cubic.workload import Workload

BENCH_DIR = Path(__file__).resolve().parents[2] / "search_spaces" / "bench"
DEFAULT_STRATEGIES = ("cubic", "tpe", "random")
DEFAULT_SEEDS = (0, 1, 2, 3, 4)
CHECKPOINTS = (8, 16, 32, 64)
TARGETS = (0.95, 0.99)

_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
Prior = list[tuple[Workload, Trial]]
ProgressFn = Callable[["RunResult", int, int], None]


# ----------------------------------------------------------------------------- landscape


@dataclass(frozen=True)
class StudyInfo:
    """A benchmark study's landscape: its size, how much of it fails, and its true optimum."""

    name: str
    file: str | None
    kind: str
    workload: str
    cluster: str
    metric: str
    direction: str
    size: int
    infeasible_share: float
    optimum: float
    optimum_config: dict[str, Any]
    baseline_ratio: float | None
    objectives: list[str] = field(default_factory=list)
    directions: list[str] = field(default_factory=list)
    front: list[list[float]] = field(default_factory=list)
    reference: list[float] | None = None

    @property
    def multi(self) -> bool:
        """Whether the study has two or more objectives: its score is then a hypervolume."""
        return len(self.objectives) > 1


def _true_values(
    study: ResolvedStudy,
    res: SimResult,
    params: Mapping[str, Any] | None = None,
    objective: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(noise-free value of the ``objective``-th objective, respects every constraint) per
    simulated config.

    The vectorised twin of :func:`cubic.objectives.violations` on what a noise-free job
    would report.
    """
    spec, wl = study.spec, study.workload
    c = spec.constraints
    ok = np.asarray(res.feasible, dtype=bool).copy()
    if c.memory_headroom > 0:
        ok &= res.peak_memory <= wl.gpu.hbm_bytes * (1.0 - c.memory_headroom)
    if c.max_error_score is not None:
        ok &= res.error_score <= c.max_error_score
    if c.max_gpus is not None:
        gpus = np.asarray((params or {}).get("num_gpus", wl.cluster.num_gpus))
        ok &= np.broadcast_to(gpus <= c.max_gpus, ok.shape)
    metric = spec.objectives[objective].metric
    thr = np.where(ok, res.throughput, np.nan)
    if metric in ("throughput", "tokens_per_s", "samples_per_s"):
        value = thr
    elif metric == "mfu":
        value = np.where(ok, res.mfu, np.nan)
    elif metric == "step_time_s":
        value = np.where(ok, res.step_time, np.nan)
    elif metric == MEMORY_METRIC:
        value = np.where(ok, res.peak_memory / 1e9, np.nan)
    else:  # cost: GPU-hours per million tokens or samples, as run_job reports it
        gpus = np.asarray((params or {}).get("num_gpus", wl.cluster.num_gpus))
        with np.errstate(divide="ignore"):
            value = cost_per_million(thr, gpus)
    return np.asarray(value, dtype=float), ok


def _true_points(
    study: ResolvedStudy, res: SimResult, params: Mapping[str, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(noise-free objective values, one column per objective and every column maximised,
    respects every constraint) per simulated config."""
    cols = [
        _true_values(study, res, params, objective=i)[0] for i in range(len(study.spec.objectives))
    ]
    _, ok = _true_values(study, res, params)
    return oriented(np.stack(cols, axis=1), _directions(study)), ok


def _directions(study: ResolvedStudy) -> list[str]:
    return [str(o.direction) for o in study.spec.objectives]


def _ratio(study: ResolvedStudy, values: np.ndarray, optimum: float) -> np.ndarray:
    """Value / optimum (optimum / value for a minimised metric); 0 where infeasible."""
    v = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = v / optimum if _maximize(study) else optimum / v
    return np.nan_to_num(r, nan=0.0, posinf=0.0, neginf=0.0)


def _maximize(study: ResolvedStudy) -> bool:
    return study.spec.objectives[0].direction == "maximize"


def _landscape_key(study: ResolvedStudy) -> str:
    s = study.spec
    return json.dumps(
        {
            "workload": study.workload.to_dict(),
            "space": study.space.to_dict(),
            "objectives": [o.model_dump() for o in s.objectives],
            "constraints": s.constraints.model_dump(),
        },
        sort_keys=True,
        default=str,
    )


_LANDSCAPES: dict[str, StudyInfo] = {}


def landscape(study: ResolvedStudy, file: str | Path | None = None) -> StudyInfo:
    """Score every valid config of the study's finite space once (cached: it is deterministic)."""
    key = _landscape_key(study)
    if key in _LANDSCAPES:
        return replace(
            _LANDSCAPES[key], name=study.spec.name, file=None if file is None else str(file)
        )
    ctx = study.context
    try:
        arrays = study.space.enumerate_arrays(ctx)
    except ValueError as exc:
        raise InvalidInput(
            f"{study.spec.name}: the benchmark needs a finite space: {exc}", field="space"
        ) from exc
    size = len(next(iter(arrays.values()))) if arrays else 0
    if size == 0:
        raise InvalidInput(
            f"{study.spec.name}: the space has no valid configuration", field="space"
        )
    res = simulate(study.workload, arrays)
    values, ok = _true_values(study, res, arrays)
    if not ok.any():
        raise InvalidInput(
            f"{study.spec.name}: no configuration of the space is feasible", field="space"
        )
    pick = np.where(ok, values, -np.inf if _maximize(study) else np.inf)
    best = int(np.argmax(pick) if _maximize(study) else np.argmin(pick))
    optimum = float(values[best])
    config = study.space.from_arrays({k: v[best : best + 1] for k, v in arrays.items()})[0]
    baseline_ratio = None
    if study.spec.baseline is not None:
        params = {k: v for k, v in study.spec.baseline.items() if k in study.space.names}
        base = study.space.complete(params, ctx)
        bv, _ = _true_values(study, simulate(study.workload, [base]))
        baseline_ratio = float(_ratio(study, bv, optimum)[0])
    wl = study.workload
    multi: dict[str, Any] = {}
    if len(study.spec.objectives) > 1:
        # The true front, from every valid config; its hypervolume is what a search's found
        # front is scored against (the "optimum" of a multi-objective study).
        pts, _ = _true_points(study, res, arrays)
        rows = np.flatnonzero(ok)
        on = rows[non_dominated(pts[rows])]
        front = np.unique(pts[on], axis=0)
        ref = reference_point(front)
        best = int(on[np.argmax(pts[on, 0])])
        optimum = hypervolume(front, ref)
        config = study.space.from_arrays({k: v[best : best + 1] for k, v in arrays.items()})[0]
        sign = np.array([1.0 if d == "maximize" else -1.0 for d in _directions(study)])
        multi = {
            "objectives": [o.metric for o in study.spec.objectives],
            "directions": _directions(study),
            "front": (front * sign).tolist(),
            "reference": (ref * sign).tolist(),
        }
    info = StudyInfo(
        name=study.spec.name,
        file=None if file is None else str(file),
        kind=wl.kind,
        workload=wl.name,
        cluster=f"{wl.cluster.num_gpus}x {wl.cluster.gpu}",
        metric=study.spec.objectives[0].metric,
        direction=str(study.spec.objectives[0].direction),
        size=size,
        infeasible_share=float(1.0 - ok.mean()),
        optimum=optimum,
        optimum_config=config,
        baseline_ratio=None if multi else baseline_ratio,
        **multi,
    )
    _LANDSCAPES[key] = info
    return info


def load_study(path: str | Path) -> ResolvedStudy:
    """A study file with its workload and space loaded."""
    spec, base = load_spec(path)
    return spec.resolve(base)


# ----------------------------------------------------------------------------- one run


def _at(seconds: float) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


def _trial(
    number: int,
    params: dict[str, Any],
    *,
    study_id: int = 1,
    state: TrialState = TrialState.RUNNING,
    source: str = "strategy",
    metrics: dict[str, Any] | None = None,
    predicted: dict[str, Any] | None = None,
    worker_id: str | None = None,
    attempt: int = 1,
    retry_of: int | None = None,
    error: str | None = None,
    log_tail: str | None = None,
    start: float = 0.0,
    end: float | None = None,
) -> Trial:
    return Trial(
        id=number + 1,
        study_id=study_id,
        number=number,
        params=dict(params),
        state=state,
        source=source,
        metrics=metrics,
        predicted=predicted,
        worker_id=worker_id,
        lease_token=None,
        lease_deadline=None,
        attempt=attempt,
        retry_of=retry_of,
        error=error,
        log_tail=log_tail,
        created_at=_at(start),
        started_at=_at(start),
        finished_at=None if end is None else _at(end),
    )


def _finished(t: Trial, outcome: Outcome, study: ResolvedStudy, now: float) -> Trial:
    """The trial as the tuner would store it once ``outcome`` is reported."""
    error = outcome.error
    if outcome.state == "complete":
        bad = violations(study.spec, study.workload, outcome.metrics, t.params)
        if bad:
            error = "constraint violated: " + "; ".join(bad)
    return _trial(
        t.number,
        t.params,
        study_id=t.study_id,
        state=TrialState(outcome.state),
        source=t.source,
        metrics=dict(outcome.metrics) or None,
        predicted=t.predicted,
        worker_id=t.worker_id,
        attempt=t.attempt,
        retry_of=t.retry_of,
        error=error,
        log_tail=outcome.log_tail,
        start=(t.started_at - _EPOCH).total_seconds(),
        end=now,
    )


def job_seed(seed: int, number: int) -> int:
    """The noise seed of trial ``number`` in a run with ``seed``."""
    return seed * 1_000_003 + number


def simulate_search(
    study: ResolvedStudy,
    strategy: Strategy,
    *,
    seed: int,
    workers: int = 8,
    budget: int = 64,
    noise: NoiseModel | None = None,
    rule: PruningSpec | None = None,
) -> list[Trial]:
    """Replay the asynchronous worker loop; returns every trial (retries included) by number.

    With a pruning ``rule`` (enabled) every job runs step by step: after each step the rule
    judges it (:func:`cubic.pruning.judge`) against the complete trials finished by then, and
    a trial it stops frees its worker at once and costs only the steps it ran."""
    if workers < 1 or budget < 1:
        raise InvalidInput("workers and budget must be at least 1", field="workers")
    if rule is not None and not rule.enabled:
        rule = None
    noise = NoiseModel() if noise is None else noise
    wl, spec = study.workload, study.spec
    max_attempts = spec.max_attempts
    trials: list[Trial] = []
    jobs: dict[int, SimulatedJob] = {}
    values: list[float] = []  # objective values of the complete trials within the constraints
    # (time, number, step, slot): step 0 is the job's end, k > 0 a check after its k-th step
    # (ties: by trial number; a check before the end at the same time).
    events: list[tuple[float, int, int, int]] = []
    free = list(range(workers))
    proposed = 0

    running: dict[int, tuple[float, int]] = {}  # number: (start time, worker slot)

    def check_after(number: int, k: int) -> None:
        sim = jobs[number]
        if rule is None or sim.times is None or k > len(sim.times):
            return
        when = running[number][0] + STARTUP_S + float(sim.times[:k].sum())
        heapq.heappush(events, (when, number, k, running[number][1]))

    def start(
        params: dict[str, Any],
        now: float,
        *,
        predicted: dict[str, Any] | None = None,
        source: str = "strategy",
        attempt: int = 1,
        retry_of: int | None = None,
    ) -> None:
        slot = heapq.heappop(free)
        number = len(trials)
        sim = simulate_job(wl, params, seed=job_seed(seed, number), noise=noise)
        jobs[number] = sim
        trials.append(
            _trial(
                number,
                params,
                source=source,
                predicted=predicted,
                worker_id=f"bench-{slot}",
                attempt=attempt,
                retry_of=retry_of,
                start=now,
            )
        )
        running[number] = (now, slot)
        heapq.heappush(events, (now + job_duration(sim.outcome, wl), number, 0, slot))
        if rule is not None and sim.times is not None:
            check_after(number, max(rule.warmup_steps + 1, sim.warmup + max(2, rule.min_steps)))

    def propose(now: float) -> None:
        nonlocal proposed
        n = min(len(free), budget - proposed)
        if n <= 0:
            return
        for p in strategy.suggest(list(trials), n)[:n]:
            start(p.params, now, predicted=p.predicted)
            proposed += 1

    def finish(number: int, outcome: Outcome, now: float) -> None:
        heapq.heappush(free, running.pop(number)[1])
        done = trials[number] = _finished(trials[number], outcome, study, now)
        if done.state == TrialState.COMPLETE and done.metrics and not done.error:
            vals = objective_values(spec, done.metrics)
            if vals is not None:
                values.append(vals[0])
        if done.state == TrialState.FAILED and done.attempt < max_attempts:
            start(
                done.params,
                now,
                predicted=done.predicted,
                source="retry",
                attempt=done.attempt + 1,
                retry_of=done.id,
            )
        else:
            propose(now)

    propose(0.0)
    while events:
        now, number, k, _slot = heapq.heappop(events)
        if number not in running:
            continue  # the end of a job that was pruned, or a check after it was
        if k == 0:
            finish(number, jobs[number].outcome, now)
            continue
        assert rule is not None
        sim = jobs[number]
        from cubic.pruning import judge

        verdict = judge(rule, sim.progress(k), values)
        if verdict is None or not verdict.prune:
            check_after(number, k + 1)
            continue
        metrics = {**sim.partial_metrics(k), **verdict.metrics()}
        for o in spec.objectives:  # what the worker reports: the throughput measured so far
            metrics[o.metric] = metrics.get("throughput", verdict.throughput)
        finish(number, Outcome("pruned", metrics, error=verdict.reason), now)
    return trials


@dataclass(frozen=True)
class RunResult:
    """One (study, strategy, seed) run; ``curve[n-1]`` is the score after ``n`` trials."""

    study: str
    strategy: str
    seed: int
    curve: list[float]
    best_tried: list[float]
    trials_to: dict[str, int | None]
    n_trials: int
    n_attempts: int
    n_failed: int
    n_infeasible: int
    infeasible_share: float
    best_config: dict[str, Any] | None
    best_measured: float | None
    best_ratio: float
    proxy_tau: float | None
    prior_trials: int
    wall_s: float
    makespan_s: float


def score_run(
    study: ResolvedStudy,
    info: StudyInfo,
    trials: Sequence[Trial],
    *,
    strategy: str,
    seed: int,
    wall_s: float = 0.0,
    prior_trials: int = 0,
    with_tau: bool = True,
) -> RunResult:
    """Curves and counts of one run, scored by true values against the study's optimum
    (the true front's hypervolume for a multi-objective study: :func:`_front_curves`)."""
    retried = {t.retry_of for t in trials if t.retry_of is not None}
    final = sorted(
        (t for t in trials if t.id not in retried and t.is_finished),
        key=lambda t: (t.finished_at, t.number),
    )
    if info.multi:
        return _score_front(
            study,
            info,
            trials,
            final,
            strategy=strategy,
            seed=seed,
            wall_s=wall_s,
            prior_trials=prior_trials,
            with_tau=with_tau,
        )
    if trials:
        values, _ = _true_values(study, simulate(study.workload, [t.params for t in trials]))
        ratio = _ratio(study, values, info.optimum)
    else:
        ratio = np.zeros(0)
    spec = study.spec
    curve: list[float] = []
    tried: list[float] = []
    best: tuple[float, Trial] | None = None
    n_infeasible = 0
    for t in final:
        measured = None
        if t.state == TrialState.COMPLETE and t.metrics and not t.error:
            vals = objective_values(spec, t.metrics)
            measured = vals[0] if vals else None
        elif t.state in (TrialState.INFEASIBLE, TrialState.COMPLETE):
            n_infeasible += 1
        if measured is not None and (best is None or better(spec, measured, best[0])):
            best = (measured, t)
        curve.append(float(ratio[best[1].number]) if best else 0.0)
        tried.append(
            max(
                tried[-1] if tried else 0.0, float(ratio[t.number]) if measured is not None else 0.0
            )
        )
    return _run_result(
        study,
        trials,
        final,
        curve,
        tried,
        n_infeasible,
        (dict(best[1].params), best[0]) if best else None,
        strategy=strategy,
        seed=seed,
        wall_s=wall_s,
        prior_trials=prior_trials,
        with_tau=with_tau,
    )


def _run_result(
    study: ResolvedStudy,
    trials: Sequence[Trial],
    final: Sequence[Trial],
    curve: list[float],
    tried: list[float],
    n_infeasible: int,
    best: tuple[dict[str, Any], float] | None,
    *,
    strategy: str,
    seed: int,
    wall_s: float,
    prior_trials: int,
    with_tau: bool,
) -> RunResult:
    """A run's result from its curves and counts (the same for one objective or several)."""
    trials_to = {
        f"{x:g}": next((i + 1 for i, v in enumerate(curve) if v >= x), None) for x in TARGETS
    }
    ends = [(t.finished_at - _EPOCH).total_seconds() for t in final]
    return RunResult(
        study=study.spec.name,
        strategy=strategy,
        seed=seed,
        curve=curve,
        best_tried=tried,
        trials_to=trials_to,
        n_trials=len(final),
        n_attempts=len(trials),
        n_failed=sum(t.state == TrialState.FAILED for t in trials),
        n_infeasible=n_infeasible,
        infeasible_share=n_infeasible / len(final) if final else 0.0,
        best_config=best[0] if best else None,
        best_measured=best[1] if best else None,
        best_ratio=curve[-1] if curve else 0.0,
        proxy_tau=proxy_tau(study, trials) if with_tau else None,
        prior_trials=prior_trials,
        wall_s=wall_s,
        makespan_s=max(ends, default=0.0),
    )


def _score_front(
    study: ResolvedStudy,
    info: StudyInfo,
    trials: Sequence[Trial],
    final: Sequence[Trial],
    **kw: Any,
) -> RunResult:
    """:func:`score_run` of a multi-objective study. After ``n`` trials the found front is
    the set of complete trials within the constraints that no other one beats on every
    *measured* objective, as a user reads it off ``cubic best --pareto``; its score is the
    hypervolume of those configs' *true* values over the true front's, both from the true
    front's reference point (:func:`cubic.pareto.reference_point`). ``best_tried`` scores
    every config tried that runs within the constraints, whatever was measured."""
    spec = study.spec
    directions = _directions(study)
    ref = oriented([info.reference], directions)[0]
    if trials:
        params = [t.params for t in trials]
        true, ok = _true_points(study, simulate(study.workload, params))
    else:
        true, ok = np.zeros((0, len(directions))), np.zeros(0, dtype=bool)
    curve: list[float] = []
    tried: list[float] = []
    measured: list[tuple[list[float], Trial]] = []
    runs: list[int] = []
    n_infeasible = 0
    on: list[int] = []
    for t in final:
        vals = None
        if t.state == TrialState.COMPLETE and t.metrics and not t.error:
            vals = objective_values(spec, t.metrics, job_gpus(study.workload, t.params))
        elif t.state in (TrialState.INFEASIBLE, TrialState.COMPLETE):
            n_infeasible += 1
        if vals is not None:
            measured.append((vals, t))
            if ok[t.number]:
                runs.append(t.number)
        on = _measured_front(measured, directions)
        rows = [measured[i][1].number for i in on if ok[measured[i][1].number]]
        curve.append(hypervolume(true[rows], ref) / info.optimum if rows else 0.0)
        tried.append(hypervolume(true[runs], ref) / info.optimum if runs else 0.0)
    top = None
    if on:  # the front after the last trial
        top = max((measured[i] for i in on), key=lambda vt: oriented([vt[0]], directions)[0, 0])
    return _run_result(
        study,
        trials,
        final,
        curve,
        tried,
        n_infeasible,
        (dict(top[1].params), top[0][0]) if top else None,
        **kw,
    )


def _measured_front(
    measured: Sequence[tuple[list[float], Trial]], directions: list[str]
) -> list[int]:
    """Indices of the measured points no other measured point dominates."""
    if not measured:
        return []
    pts = oriented([v for v, _ in measured], directions)
    return np.flatnonzero(non_dominated(pts)).tolist()


def proxy_tau(study: ResolvedStudy, trials: Sequence[Trial], k: int = 5) -> float | None:
    """Cross-validated Kendall tau of the proxy model on a run's own finished trials.

    The model is set up as the ``cubic`` strategy fits it on one study's trials.

    None when fewer than ``2 * k`` trials measured a throughput.
    """
    from cubic.proxy.model import ProxyModel
    from cubic.proxy.quality import cross_validate
    from cubic.proxy.training import training_set

    kind = study.workload.kind
    X, y, feasible, groups = training_set(trials, lambda _: study.workload, kind)
    if int(feasible.sum()) < 2 * k:
        return None
    cv = cross_validate(
        lambda: ProxyModel(kind=kind, offset="auto"), X, y, feasible, k=k, seed=0, groups=groups
    )
    tau = cv.get("kendall_tau")
    return None if tau is None else float(tau)


def accepts_prior(cls: type[Strategy]) -> bool:
    """Whether a strategy class takes finished trials of other studies as ``prior=``."""
    if getattr(cls, "accepts_prior", False):
        return True
    try:
        param = inspect.signature(cls).parameters.get("prior")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def build_strategy(
    name: str, study: ResolvedStudy, seed: int, prior: Prior | None = None
) -> tuple[Strategy, int]:
    """The named strategy for one run, and how many prior trials it was given.

    The study's own strategy options apply only when it names the same strategy.
    """
    cls = REGISTRY.get(name)
    if cls is None:
        raise InvalidInput(
            f"strategy '{name}' is not available; known: {', '.join(sorted(REGISTRY))}",
            field="strategies",
        )
    s = study.spec.strategy
    opts: dict[str, Any] = dict(s.options) if s.name == name else {}
    spec = study.spec.model_copy(
        update={"strategy": StrategySpec.model_construct(name=name, seed=seed, options=dict(opts))}
    )
    resolved = ResolvedStudy(spec, study.workload, study.space)
    given = 0
    if prior and accepts_prior(cls):
        opts["prior"] = list(prior)
        given = len(prior)
    return cls(resolved, seed=seed, **opts), given


def run_one(
    study: ResolvedStudy,
    strategy: str,
    seed: int,
    *,
    workers: int = 8,
    budget: int = 64,
    prior: Prior | None = None,
    noise: NoiseModel | None = None,
    info: StudyInfo | None = None,
) -> RunResult:
    """One (study, strategy, seed) run, timed and scored."""
    info = info or landscape(study)
    t0 = time.perf_counter()
    strat, given = build_strategy(strategy, study, seed, prior)
    trials = simulate_search(study, strat, seed=seed, workers=workers, budget=budget, noise=noise)
    wall = time.perf_counter() - t0
    return score_run(
        study, info, trials, strategy=strategy, seed=seed, wall_s=wall, prior_trials=given
    )


# ----------------------------------------------------------------------------- transfer


#: Where a transfer history comes from: what a service holds after earlier studies were
#: searched (``cubic``), or the harder case of a history that never came near an optimum.
HISTORY_SOURCES = ("cubic", "random")


@lru_cache(maxsize=64)
def _history(
    path: str, n: int, seed: int, study_id: int, source: str = "cubic"
) -> tuple[Workload, tuple[Trial, ...]]:
    """``n`` finished trials of one study: its ``cubic`` search, or random configs."""
    study = load_study(path)
    if source == "cubic":
        from cubic.strategies.cubic import CubicStrategy

        # A seed of its own, so that no benchmark run replays the history it is given.
        hseed = 10_000 + seed
        trials = simulate_search(study, CubicStrategy(study, seed=hseed), seed=hseed, budget=n)
        done = [replace(t, study_id=study_id) for t in trials if t.is_finished]
        return study.workload, tuple(done)
    if source != "random":
        raise InvalidInput(
            f"unknown history source {source!r}; known: {', '.join(HISTORY_SOURCES)}",
            field="transfer_from",
        )
    rng = np.random.default_rng([seed, study_id])
    configs = study.space.sample(rng, n, study.context)
    out = []
    for i, cfg in enumerate(configs):
        outcome = run_job(study.workload, cfg, seed=job_seed(seed, 10_000 * study_id + i))
        t = _trial(i, cfg, study_id=study_id, worker_id="bench-history", start=0.0)
        end = job_duration(outcome, study.workload)
        out.append(_finished(t, outcome, study, end))
    return study.workload, tuple(out)


def history_from_other_studies(
    studies: Sequence[str | Path],
    exclude: str | Path,
    n_per_study: int = 64,
    seed: int = 0,
    source: str = "cubic",
) -> Prior:
    """The history (``n_per_study`` trials each) of every study but one.

    ``exclude`` is a study's name or file. ``source`` says how each other study was
    searched (:data:`HISTORY_SOURCES`). Each other study's trials carry their own
    ``study_id`` (its position in ``studies`` plus one) so that a consumer can group them.
    """
    out: Prior = []
    for i, path in enumerate(studies):
        spec, _ = load_spec(path)
        if spec.name == str(exclude) or Path(path).resolve() == Path(exclude).resolve():
            continue
        workload, trials = _history(str(Path(path).resolve()), n_per_study, seed, i + 1, source)
        out.extend((workload, t) for t in trials)
    return out


def transfer_history(
    studies: Sequence[str | Path], n_per_study: int = 64, seed: int = 0, source: str = "cubic"
) -> dict[str, Prior]:
    """For each study (by name), the history of all the others."""
    return {
        load_spec(p)[0].name: history_from_other_studies(studies, p, n_per_study, seed, source)
        for p in studies
    }


# ----------------------------------------------------------------------------- many runs


def _quartiles(xs: Iterable[float]) -> dict[str, float]:
    a = np.asarray(list(xs), dtype=float)
    q25, med, q75 = np.percentile(a, [25, 50, 75])
    return {"median": float(med), "q25": float(q25), "q75": float(q75)}


def _tau_summary(taus: Sequence[float | None]) -> dict[str, float | None]:
    vals = [t for t in taus if t is not None]
    if not vals:
        return {"median": None, "min": None}
    return {"median": float(np.median(vals)), "min": float(np.min(vals))}


def _padded(curve: Sequence[float], n: int) -> list[float]:
    """The curve over ``n`` trials; a run that ran out of configs keeps its last value."""
    if not curve:
        return [0.0] * n
    return [curve[min(i, len(curve) - 1)] for i in range(n)]


@dataclass
class BenchResult:
    """All runs of a benchmark, the studies' landscapes, and their per-strategy summary."""

    settings: dict[str, Any]
    studies: dict[str, StudyInfo]
    runs: list[RunResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def budget(self) -> int:
        return int(self.settings["budget"])

    @property
    def checkpoints(self) -> list[int]:
        return [int(c) for c in self.settings["checkpoints"]]

    def groups(self) -> dict[tuple[str, str], list[RunResult]]:
        out: dict[tuple[str, str], list[RunResult]] = {}
        for r in self.runs:
            out.setdefault((r.study, r.strategy), []).append(r)
        return out

    def band(self, study: str, strategy: str) -> dict[str, np.ndarray]:
        """Median and interquartile range over seeds of the score after 1..budget trials."""
        runs = self.groups()[(study, strategy)]
        a = np.asarray([_padded(r.curve, self.budget) for r in runs], dtype=float)
        q25, med, q75 = np.percentile(a, [25, 50, 75], axis=0)
        return {"trials": np.arange(1, self.budget + 1), "median": med, "q25": q25, "q75": q75}

    def summary(self) -> list[dict[str, Any]]:
        rows = []
        for (study, strategy), runs in self.groups().items():
            best_at = {
                str(c): _quartiles(_padded(r.curve, self.budget)[c - 1] for r in runs)
                for c in self.checkpoints
            }
            trials_to = {}
            for x in TARGETS:
                key = f"{x:g}"
                hits = [r.trials_to[key] for r in runs]
                med = float(np.median([math.inf if h is None else h for h in hits]))
                trials_to[key] = {
                    "median": None if math.isinf(med) else med,
                    "reached": sum(h is not None for h in hits),
                }
            rows.append(
                {
                    "study": study,
                    "strategy": strategy,
                    "runs": len(runs),
                    "best_at": best_at,
                    "trials_to": trials_to,
                    "infeasible_share": float(np.mean([r.infeasible_share for r in runs])),
                    "proxy_tau": _tau_summary([r.proxy_tau for r in runs]),
                    "wall_s": float(np.median([r.wall_s for r in runs])),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "settings": self.settings,
            "studies": {k: asdict(v) for k, v in self.studies.items()},
            "runs": [asdict(r) for r in self.runs],
            "summary": self.summary(),
            "skipped": list(self.skipped),
        }

    def write_json(self, path: str | Path) -> None:
        """Write the results (whole or none: a reader never sees half a file)."""
        path = Path(path)
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        part.replace(path)

    def plot(self, path: str | Path) -> None:
        from cubic.bench.plot import plot_convergence

        plot_convergence(self, path)

    def tables(self) -> list[Any]:
        """Rich tables: the studies' landscapes, then the score per study and strategy."""
        from rich.table import Table

        studies = Table(title="benchmark studies (true landscape)")
        for col in ("study", "workload", "size", "infeasible", "optimum", "baseline/opt"):
            studies.add_column(col, justify="left" if col in ("study", "workload") else "right")
        for s in self.studies.values():
            base = "-" if s.baseline_ratio is None else f"{s.baseline_ratio:.3f}"
            optimum = (
                f"front of {len(s.front)}: {' vs '.join(s.objectives)}"
                if s.multi
                else f"{s.optimum:,.0f} {s.metric}"
            )
            studies.add_row(
                s.name,
                f"{s.workload} on {s.cluster}",
                f"{s.size:,}",
                f"{s.infeasible_share:.0%}",
                optimum,
                base,
            )
        seeds = len(self.settings.get("seeds", []))
        scores = Table(
            title=f"best found / optimum (true value): median [IQR] over {seeds} "
            f"seeds, {self.settings.get('workers')} workers",
            caption="infeasible: mean share of trials that could not run or broke a constraint; "
            "tau: median cross-validated Kendall tau of the proxy on each run's trials"
            + (
                "; a study of two or more objectives scores the hypervolume of its found "
                "front over the true front's"
                if any(s.multi for s in self.studies.values())
                else ""
            ),
        )
        scores.add_column("study")
        scores.add_column("strategy")
        for c in self.checkpoints:
            scores.add_column(f"@{c}", justify="right")
        for x in TARGETS:
            scores.add_column(f"to {x:.0%}", justify="right")
        scores.add_column("infeasible", justify="right")
        scores.add_column("tau", justify="right")
        scores.add_column("s/run", justify="right")
        for row in self.summary():
            cells = [row["study"], row["strategy"]]
            for c in self.checkpoints:
                q = row["best_at"][str(c)]
                cells.append(f"{q['median']:.3f} [{q['q25']:.2f}-{q['q75']:.2f}]")
            for x in TARGETS:
                t = row["trials_to"][f"{x:g}"]
                med = f">{self.budget}" if t["median"] is None else f"{t['median']:g}"
                cells.append(f"{med} ({t['reached']}/{row['runs']})")
            cells.append(f"{row['infeasible_share']:.1%}")
            tau = row["proxy_tau"]
            cells.append("-" if tau["median"] is None else f"{tau['median']:.2f}")
            cells.append(f"{row['wall_s']:.1f}")
            scores.add_row(*cells)
        return [studies, scores]


def run_benchmark(
    studies: Sequence[str | Path],
    strategies: Sequence[str],
    seeds: Sequence[int],
    workers: int = 8,
    budget: int = 64,
    history: Mapping[str, Prior] | None = None,
    progress: ProgressFn | None = None,
    noise: NoiseModel | None = None,
    through_service: bool = False,
    job_clock: float | None = None,
    checkpoint: Path | None = None,
) -> BenchResult:
    """Run every strategy on every study for every seed; ``progress(run, done, total)``.

    ``checkpoint``: the results so far are written there (JSON) after every run, so that a
    long benchmark that is stopped or breaks keeps what it measured.

    ``through_service``: each run goes through a real API process and HTTP workers
    (:mod:`cubic.bench.through_service`, whose jobs take ``job_clock`` wall seconds per
    simulated second) instead of the in-process loop."""
    if not studies or not strategies or not seeds:
        raise InvalidInput(
            "the benchmark needs at least one study, strategy and seed", field="studies"
        )
    for name in strategies:
        if name not in REGISTRY:
            raise InvalidInput(
                f"strategy '{name}' is not available; known: {', '.join(sorted(REGISTRY))}",
                field="strategies",
            )
    loaded: list[tuple[ResolvedStudy, StudyInfo]] = []
    for path in studies:
        study = load_study(path)
        if any(s.spec.name == study.spec.name for s, _ in loaded):
            raise InvalidInput(
                f"{path}: two studies are named '{study.spec.name}'", field="studies"
            )
        loaded.append((study, landscape(study, path)))
    noise = NoiseModel() if noise is None else noise
    result = BenchResult(
        settings={
            "studies": [str(p) for p in studies],
            "strategies": list(strategies),
            "seeds": list(seeds),
            "workers": workers,
            "budget": budget,
            "checkpoints": sorted({c for c in CHECKPOINTS if c <= budget} | {budget}),
            "targets": list(TARGETS),
            "transfer": bool(history),
            "noise": asdict(noise),
            "through_service": through_service,
            "job_clock": job_clock if through_service else None,
        },
        studies={info.name: info for _, info in loaded},
    )
    total = len(loaded) * len(strategies) * len(seeds)
    one: Callable[..., RunResult] = run_one
    if through_service:
        from cubic.bench.through_service import JOB_CLOCK, run_through_service

        one = partial(run_through_service, clock=JOB_CLOCK if job_clock is None else job_clock)
    for study, info in loaded:
        prior = (history or {}).get(study.spec.name)
        for name in strategies:
            for seed in seeds:
                run = one(
                    study,
                    name,
                    seed,
                    workers=workers,
                    budget=budget,
                    prior=prior,
                    noise=noise,
                    info=info,
                )
                result.runs.append(run)
                if checkpoint is not None:
                    result.write_json(checkpoint)
                if progress is not None:
                    progress(run, len(result.runs), total)
    return result


# ----------------------------------------------------------------------------- CLI entry


def default_studies() -> list[Path]:
    """The benchmark studies shipped in ``search_spaces/bench/``."""
    return sorted(BENCH_DIR.glob("*.study.yaml"))


def _study_files(studies: Sequence[str | Path] | None) -> list[Path]:
    if not studies:
        return default_studies()
    out: list[Path] = []
    for s in studies:
        p = Path(s)
        if p.is_dir():
            out.extend(sorted(p.glob("*.study.yaml")))
        elif p.exists():
            out.append(p)
        else:
            raise InvalidInput(f"{p}: no such study file or folder", field="studies")
    if not out:
        raise InvalidInput("no study files found", field="studies")
    return out


def parse_seeds(seeds: str | Sequence[int] | None) -> list[int]:
    """Seeds from ``"0-4"``, ``"0,2,7"`` or a list; defaults to 0-4."""
    if seeds is None:
        return list(DEFAULT_SEEDS)
    if not isinstance(seeds, str):
        return [int(s) for s in seeds]
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in seeds.split(","))):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError as exc:
        raise InvalidInput(
            f"seeds: expected e.g. '0-4' or '0,2,7', got {seeds!r}", field="seeds"
        ) from exc
    if not out:
        raise InvalidInput("seeds: none given", field="seeds")
    return out


def _strategy_names(strategies: str | Sequence[str] | None) -> list[str]:
    if strategies is None:
        return list(DEFAULT_STRATEGIES)
    if isinstance(strategies, str):
        return [s.strip() for s in strategies.split(",") if s.strip()]
    return list(strategies)


def bench_search(
    studies: Sequence[str | Path] | None = None,
    strategies: str | Sequence[str] | None = None,
    seeds: str | Sequence[int] | None = None,
    workers: int = 8,
    budget: int = 64,
    json_out: str | Path | None = None,
    plot_out: str | Path | None = None,
    transfer: bool = False,
    console: Any = None,
    through_service: bool = False,
    transfer_from: str = "cubic",
    job_clock: float | None = None,
) -> BenchResult:
    """``cubic bench``: run the benchmark, print its tables, and write JSON and a plot.

    Strategy names that are not registered are skipped with a note (so the default list can
    name strategies that are not installed). ``transfer`` gives every strategy that accepts
    a prior 64 trials of each other study, from its ``cubic`` search or random configs
    (``transfer_from``).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console()
    files = _study_files(studies)
    names = _strategy_names(strategies)
    skipped = [n for n in names if n not in REGISTRY]
    for n in skipped:
        console.print(f"note: strategy '{n}' is not available here; skipped")
    names = [n for n in names if n in REGISTRY]
    if not names:
        raise InvalidInput(
            f"no available strategy to benchmark; known: {', '.join(sorted(REGISTRY))}",
            field="strategies",
        )
    seed_list = parse_seeds(seeds)
    if transfer_from not in HISTORY_SOURCES:
        raise InvalidInput(
            f"unknown history source {transfer_from!r}; known: {', '.join(HISTORY_SOURCES)}",
            field="transfer_from",
        )
    if transfer:
        console.print(f"transfer: 64 trials of each other study ({transfer_from} search)")
    history = transfer_history(files, source=transfer_from) if transfer else None
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("runs", total=len(files) * len(names) * len(seed_list))

        def step(run: RunResult, done: int, total: int) -> None:
            bar.update(
                task, completed=done, description=f"{run.study} {run.strategy} seed {run.seed}"
            )

        result = run_benchmark(
            files,
            names,
            seed_list,
            workers=workers,
            budget=budget,
            history=history,
            progress=step,
            through_service=through_service,
            job_clock=job_clock,
            checkpoint=json_out,
        )
    result.skipped = skipped
    for table in result.tables():
        console.print(table)
    if json_out is not None:
        result.write_json(json_out)
        console.print(f"results: {json_out}")
    if plot_out is not None:
        result.plot(plot_out)
        console.print(f"convergence plot: {plot_out}")
    return result

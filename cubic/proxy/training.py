"""Fitting proxy models on stored trials, measuring them, and keeping them current.

Every finished trial of a workload kind, from every study, is training data: a complete
trial says how fast its configuration ran, a pruned one how fast it ran until it was stopped
for being slow, an infeasible one that it cannot run. Models are
refitted off the request path (:class:`Retrainer`, meant for a background thread) and stored
as versions with their measured quality, so a strategy only ever loads a ready model.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from cubic.proxy.features import feature_names, featurize
from cubic.proxy.model import FORMAT, ProxyModel, select_objective
from cubic.proxy.quality import cross_validate, newest_holdout
from cubic.store import ProxyModelVersion, Store, Trial, TrialState
from cubic.workload import Workload

log = logging.getLogger(__name__)

WorkloadOf = Mapping[int, Workload] | Callable[[int], Workload | None]
KINDS = ("llm", "dlrm")


def usable(trial: Trial) -> bool:
    """Whether a trial teaches the model something: a measured throughput (complete, or
    pruned with what it measured), or infeasible."""
    if trial.state == TrialState.INFEASIBLE:
        return True
    if trial.state not in TrialState.MEASURED or not trial.metrics:
        return False
    value = trial.metrics.get("throughput")
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _lookup(workloads: WorkloadOf) -> Callable[[int], Workload | None]:
    if isinstance(workloads, Mapping):
        return workloads.get
    return workloads


def training_set(
    trials: Iterable[Trial], workloads: WorkloadOf, kind: str | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X, y, feasible, groups)`` from stored trials, in the order they finished.

    Complete and pruned trials with a positive ``metrics['throughput']`` give ``y``; infeasible ones
    give ``y = NaN`` and ``feasible = False``; other trials, and trials of studies whose
    workload is unknown (``workloads`` gives None or lacks the id), are left out. ``groups``
    is the study id. Every workload must be of one kind (``kind``, when given).
    """
    workload_of = _lookup(workloads)
    rows: list[Trial] = []
    wls: dict[int, Workload] = {}
    for t in trials:
        if not usable(t):
            continue
        if t.study_id not in wls:
            wl = workload_of(t.study_id)
            if wl is None:
                continue
            kind = kind or wl.kind
            if wl.kind != kind:
                raise ValueError(f"study {t.study_id} is a {wl.kind!r} workload, not {kind!r}")
            wls[t.study_id] = wl
        rows.append(t)
    rows.sort(key=lambda t: (t.finished_at or t.created_at, t.id))
    width = len(feature_names(kind)) if kind is not None else 0
    X = np.empty((len(rows), width))
    groups = np.array([t.study_id for t in rows], dtype=np.int64)
    for sid, wl in wls.items():
        idx = np.flatnonzero(groups == sid)
        if len(idx):
            X[idx] = featurize(wl, [rows[i].params for i in idx])
    feasible = np.array([t.state in TrialState.MEASURED for t in rows], dtype=bool)
    y = np.array(
        [
            float(t.metrics["throughput"]) if ok and t.metrics else math.nan
            for t, ok in zip(rows, feasible, strict=True)
        ]
    )
    return X, y, feasible, groups


def _clean(value: Any) -> Any:
    """Metrics as strict JSON: NaN and infinities become None."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def fit_and_store(
    store: Store,
    kind: str,
    trials: Iterable[Trial],
    workload_of: WorkloadOf,
    *,
    objective: str = "auto",
    params: Mapping[str, Any] | None = None,
    k: int = 5,
    seed: int = 0,
    n_history: int | None = None,
) -> ProxyModelVersion:
    """Fit a model of ``kind`` on ``trials``, measure it, and store it as a new version.

    ``n_history``: how many finished trials of ``kind`` the store held when ``trials`` were
    read from it (``trials`` may be the newest of them); kept in the version's metrics, it
    is what the next refit is counted from (:class:`Retrainer`).

    ``objective='auto'`` cross-validates the regression and the ranking objective and keeps
    the better ranker; its cross-validation results are the version's ``metrics['cv']``, and
    ``metrics['holdout']`` scores the newest fifth of the trials predicted from the rest.
    Raises ValueError with fewer than two feasible trials.
    """
    params = dict(params or {})
    X, y, feasible, groups = training_set(trials, workload_of, kind)
    n_feasible = int(feasible.sum())
    if n_feasible < 2:
        raise ValueError(f"need at least two complete trials of kind {kind!r}, got {n_feasible}")
    start = time.perf_counter()
    by_objective: dict[str, Any] = {}
    if objective == "auto":
        objective, results = select_objective(
            X, y, feasible, groups, k=k, seed=seed, kind=kind, **params
        )
        cv = results[objective]
        by_objective = {o: r.get("kendall_tau") for o, r in results.items()}
    else:
        cv = cross_validate(
            lambda: ProxyModel(kind=kind, objective=objective, seed=seed, **params),
            X,
            y,
            feasible,
            k=k,
            seed=seed,
            groups=groups,
        )

    def factory() -> ProxyModel:
        return ProxyModel(kind=kind, objective=objective, seed=seed, **params)

    holdout = newest_holdout(factory, X, y, feasible, groups=groups)
    model = factory().fit(X, y, feasible, groups)
    metrics = _clean(
        {
            "objective": objective,
            "kendall_tau_by_objective": by_objective,
            "cv": cv,
            "holdout": holdout,
            "n_feasible": n_feasible,
            "n_studies": len(np.unique(groups)),
            "n_history": len(y) if n_history is None else n_history,
            "seconds": time.perf_counter() - start,
        }
    )
    version = store.save_proxy_model(
        kind, model.save(), model.feature_names_, metrics, n_train=len(y)
    )
    log.info(
        "proxy model %s v%d: %d trials, cv tau %s",
        kind,
        version.version,
        len(y),
        metrics["cv"].get("kendall_tau"),
    )
    return version


def _utcnow() -> datetime:
    return datetime.now(UTC)


def fitted_history(version: ProxyModelVersion) -> int:
    """How many finished trials of its kind the store held when ``version`` was fitted
    (versions stored before that was recorded: the trials it was fitted on)."""
    n = (version.metrics or {}).get("n_history")
    return int(n) if isinstance(n, int | float) else version.n_train


def is_current(version: ProxyModelVersion) -> bool:
    """Whether a stored version can be loaded by this code (same format and features)."""
    return version.model.get("format") == FORMAT and list(version.features) == feature_names(
        version.workload_kind
    )


def load_latest(store: Store, kind: str) -> ProxyModel | None:
    """The newest stored model of ``kind``; None if there is none or it is out of date."""
    version = store.latest_proxy_model(kind)
    if version is None or not is_current(version):
        return None
    return ProxyModel.load(version.model)


class Retrainer:
    """Keeps one proxy model per workload kind fitted on the trials stored so far.

    ``maybe_retrain(kind)`` refits when the finished trials of that kind have grown by
    ``every``, or by ``growth`` times the count the newest version was fitted at if that is
    more, since it was fitted (or when that version is out of date), and does nothing
    otherwise, so callers may invoke it as often as they like. A fit reads only the newest
    ``max_rows`` trials. Together these bound what one fit costs and make the fitting of a
    growing history amortised constant work per trial: refitting every 8 trials on all of a
    10,000-trial history kept a core busy and the process's memory growing with it. Fitting is
    CPU-bound and blocking: run it in a thread (:meth:`run` is a ready-made loop), never in
    an event loop. One refit runs at a time per kind, across every process on the store.
    Workloads come from each study's stored spec unless ``workload_of`` is given.

    ``max_share`` bounds the share of a core the fits take when trials finish faster than a
    fit runs (a quick study on a service): after a fit of ``d`` seconds the next of that kind
    waits until ``d / max_share`` seconds after the first began, in every process on the
    store (the stored version says when it was fitted and how long that took), so that a
    service's processes do not each spend the share in turn. The shared model is a
    cross-study summary (the dashboard's knob importance, its quality figures), not what a
    study proposes with, so a few minutes' staleness costs nothing a request needs.
    """

    def __init__(
        self,
        store: Store,
        every: int = 8,
        *,
        growth: float = 0.25,
        max_rows: int = 4000,
        workload_of: WorkloadOf | None = None,
        objective: str = "auto",
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        max_share: float | None = None,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        if growth < 0:
            raise ValueError("growth must be >= 0")
        if max_rows < 2:
            raise ValueError("max_rows must be at least 2")
        if max_share is not None and not 0 < max_share <= 1:
            raise ValueError("max_share must be in (0, 1]")
        self.store = store
        self.every = every
        self.growth = growth
        self.max_rows = max_rows
        self.workload_of = workload_of
        self.objective = objective
        self.params = dict(params or {})
        self.seed = seed
        self.max_share = max_share
        self._not_before: dict[str, float] = {}  # kind -> monotonic time of its next fit
        self._lock = threading.Lock()
        self._workloads: dict[int, Workload | None] = {}

    def _workload(self, study_id: int) -> Workload | None:
        if self.workload_of is not None:
            return _lookup(self.workload_of)(study_id)
        if study_id not in self._workloads:
            from cubic.errors import CubicError
            from cubic.study import parse_spec

            try:
                spec = parse_spec(self.store.get_study(study_id).spec)
                self._workloads[study_id] = spec.load_workload()
            except CubicError as exc:
                log.warning("study %d: no workload for the proxy model: %s", study_id, exc)
                self._workloads[study_id] = None
        return self._workloads[study_id]

    def due(self, kind: str, finished: int) -> bool:
        """Whether ``finished`` trials of ``kind`` call for a new version now."""
        latest = self.store.latest_proxy_model(kind)
        if latest is None or not is_current(latest):
            return True
        fitted = fitted_history(latest)
        if finished - fitted < max(self.every, int(self.growth * fitted)):
            return False
        return self.max_share is None or _utcnow() >= self._paid_at(latest)

    def _paid_at(self, version: ProxyModelVersion) -> datetime:
        """When ``version``'s fit has taken no more than ``max_share`` of the time since it
        began (it was stored when the fit ended)."""
        took = (version.metrics or {}).get("seconds")
        if not isinstance(took, int | float) or self.max_share is None:
            return version.created_at  # fitted before fit times were kept, or no share
        return version.created_at + timedelta(seconds=took * (1 / self.max_share - 1))

    def maybe_retrain(self, kind: str) -> ProxyModelVersion | None:
        """Fit and store a new version of ``kind`` if enough new trials finished, else None."""
        finished = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.INFEASIBLE]
        with self._lock:
            if time.monotonic() < self._not_before.get(kind, 0.0):
                return None  # the last fit's time is not yet paid for (``max_share``)
            if not self.due(kind, self.store.count_for_kind(kind, finished)):
                return None  # not due: nothing read but a count and the newest version
            # Of several processes that find a refit due, one fits; the others skip it.
            with self.store.try_proxy_fit_lock(kind) as held:
                if not held:
                    return None
                count = self.store.count_for_kind(kind, finished)
                if not self.due(kind, count):  # another process may have just fitted it
                    return None
                history = self.store.history_for_kind(kind, states=finished, limit=self.max_rows)
                trials = [
                    t for t in history if usable(t) and self._workload(t.study_id) is not None
                ]
                if sum(t.state == TrialState.COMPLETE for t in trials) < 2:
                    return None
                t0 = time.monotonic()
                try:
                    return fit_and_store(
                        self.store,
                        kind,
                        trials,
                        self._workload,
                        objective=self.objective,
                        params=self.params,
                        seed=self.seed,
                        n_history=count,
                    )
                finally:
                    if self.max_share is not None:
                        self._not_before[kind] = t0 + (time.monotonic() - t0) / self.max_share

    def run(
        self, stop: threading.Event, kinds: Sequence[str] = KINDS, interval_s: float = 30.0
    ) -> None:
        """Check every ``interval_s`` seconds until ``stop`` is set; errors are logged."""
        while not stop.is_set():
            for kind in kinds:
                if stop.is_set():
                    break
                try:
                    self.maybe_retrain(kind)
                except Exception:
                    log.exception("retraining the %s proxy model failed", kind)
            stop.wait(interval_s)

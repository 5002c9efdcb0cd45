"""Read-only summaries the dashboard plots: a study's compact history, the proxy models,
the knob importance the proxy model learned.

A study of 10,000 trials is the scale these answer at: the history is read from what the
tuner keeps (only what changed is read again) and cached by the study's newest trial event
(a finished trial never changes); a proxy model is loaded once per stored version.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request

from cubic.objectives import job_gpus, number, objective_values
from cubic.store.objects import TrialState
from service.auth import AnyRole
from service.deps import KindQuery, StoreDep, StudyId, TunerDep
from service.schemas import (
    API_ERRORS,
    MAX_ERROR_GROUP,
    MAX_TOP,
    ErrorGroup,
    HistoryColumns,
    HistoryOut,
    ImportanceOut,
    InfeasibleCount,
    KnobImportance,
    ProxyModelOut,
    ProxyModelsOut,
    TopConfig,
)

router = APIRouter(prefix="/v1", tags=["dashboard"], responses=API_ERRORS)
T = TypeVar("T")
_NUMBERS = re.compile(r"\d+(\.\d+)?")


class _Lru:
    """A small thread-safe LRU map; a value computed twice by racing requests is harmless."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


class DashboardCache:
    """What the dashboard's answers are built from, kept per app (per store)."""

    def __init__(self) -> None:
        self.histories = _Lru(8)  # (study, newest event, top) -> HistoryOut
        self.gains = _Lru(4)  # (kind, version) -> (feature names, gains, n_train) or a reason
        self.columns = _Lru(64)  # study -> the feature columns each knob moves


def cache_of(request: Request) -> DashboardCache:
    state = request.app.state
    cache = getattr(state, "dashboard_cache", None)
    if cache is None:
        cache = state.dashboard_cache = DashboardCache()
    return cache


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b of two paired samples; None when undefined."""
    if len(xs) < 3:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(xs, ys).statistic
    return None if tau is None or not math.isfinite(tau) else float(tau)


def _predicted(predicted: dict[str, Any] | None) -> float | None:
    return None if not predicted else number(predicted.get("value"))


def error_group(message: str) -> str:
    """An error's first line with its numbers as ``#``: messages that differ only by sizes
    or ranks (out of memory by 3.2 or by 4.1 GiB) fall in one group."""
    return _NUMBERS.sub("#", message.split("\n", 1)[0])[:MAX_ERROR_GROUP]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def build_history(tuner: Any, study_id: int, top: int) -> HistoryOut:
    resolved = tuner.resolved(study_id)
    spec = resolved.spec
    objective = spec.objectives[0]
    minimize = objective.direction == "minimize"
    cols: dict[str, list[Any]] = {k: [] for k in HistoryColumns.model_fields}
    values: list[tuple[float, int, dict[str, Any]]] = []
    counts: dict[tuple[str, str], list[Any]] = {}  # (knob, value key) -> [value, inf, all]
    errors: Counter[str] = Counter()
    pairs = []  # (predicted, measured) of complete trials with a prediction
    value2: list[float | None] = []
    for t in tuner.trials(study_id):
        vals = None
        if t.state == TrialState.COMPLETE and t.metrics and not t.error:
            # as the tuner scores it: a cost the job did not report is derived
            vals = objective_values(spec, t.metrics, job_gpus(resolved.workload, t.params))
        value = vals[0] if vals else None
        predicted = _predicted(t.predicted)
        if value is not None:
            values.append((value, t.number, t.params))
            if predicted is not None:
                pairs.append((predicted, value))
        if t.state in (TrialState.COMPLETE, TrialState.INFEASIBLE):
            bad = t.state == TrialState.INFEASIBLE
            for knob, v in t.params.items():
                c = counts.get((knob, _key(v)))
                if c is None:
                    c = counts[(knob, _key(v))] = [v, 0, 0]
                c[1] += bad
                c[2] += 1
            if bad:
                errors[error_group(t.error or "(no message)")] += 1
        cols["number"].append(t.number)
        cols["state"].append(t.state)
        cols["source"].append(t.source)
        cols["value"].append(value)
        value2.append(vals[1] if vals and len(vals) > 1 else None)
        cols["predicted"].append(predicted)
        cols["gpu_hours"].append(number((t.metrics or {}).get("gpu_hours")))
    values.sort(key=lambda v: (v[0] if minimize else -v[0], v[1]))
    infeasible = sorted(
        (c for c in counts.items() if c[1][1] > 0), key=lambda c: (-c[1][1], c[0][0], c[0][1])
    )
    return HistoryOut(
        study_id=study_id,
        metric=objective.metric,
        direction=objective.direction or "maximize",
        trials=HistoryColumns.model_construct(**cols),
        value2=value2 if len(spec.objectives) > 1 else None,
        kendall_tau=kendall_tau([a for a, _ in pairs], [b for _, b in pairs]),
        n_predicted=len(pairs),
        infeasible_by_value=[
            InfeasibleCount(knob=knob, value=v, infeasible=bad, finished=n)
            for (knob, _), (v, bad, n) in infeasible
        ],
        errors=[ErrorGroup(message=m, trials=n) for m, n in errors.most_common()],
        top=[TopConfig(number=n, value=v, params=p) for v, n, p in values[:top]],
    )


@router.get("/studies/{study_id:int}/history", response_model=HistoryOut)
def history(
    study_id: StudyId,
    caller: AnyRole,
    tuner: TunerDep,
    request: Request,
    top: Annotated[
        int, Query(ge=1, le=MAX_TOP, description="how many of the best configurations")
    ] = 50,
) -> HistoryOut:
    """All trials of a study in number order, reduced to value, prediction and GPU-hours;
    infeasible trials per knob value and their errors grouped; the ``top`` best
    configurations: one request for the dashboard's plots, even at 10,000 trials."""
    caller.check_study(study_id)
    mark = tuner.store.last_event_id(study_id)  # any change to a trial is a newer event
    return cache_of(request).histories.get(
        (study_id, mark, top), lambda: build_history(tuner, study_id, top)
    )


@router.get("/proxy-models", response_model=ProxyModelsOut)
def proxy_models(
    caller: AnyRole,
    store: StoreDep,
    kind: KindQuery = None,
) -> ProxyModelsOut:
    """Stored proxy model versions with their cross-validated and hold-out quality."""
    if caller.token is not None and caller.token.study_id is not None:
        own = store.get_study(caller.token.study_id).workload_kind  # its own kind only
        kinds = [own] if kind in (None, own) else []
    elif kind is not None:
        kinds = [kind]
    else:
        kinds = sorted({s.workload_kind for s in store.list_studies(limit=None)})
    return ProxyModelsOut(
        models=[
            ProxyModelOut(
                workload_kind=m.workload_kind,
                version=m.version,
                created_at=m.created_at,
                n_train=m.n_train,
                n_features=len(m.features),
                metrics=m.metrics,
            )
            for k in kinds
            for m in store.list_proxy_models(k)
        ]
    )


def _gains(store: Any, kind: str, version: int) -> tuple[list[str], Any, int] | str:
    """The stored model's feature names, total gain per feature and training size; or why
    it cannot be read (saved by another version of cubic)."""
    from cubic.proxy.importance import feature_gains
    from cubic.proxy.model import ProxyModel

    stored = store.get_proxy_model(kind, version)
    try:
        model = ProxyModel.load(stored.model)
    except (ValueError, KeyError, TypeError) as exc:
        return f"the newest {kind} proxy model (version {version}) cannot be read: {exc}"
    return list(model.feature_names_), feature_gains(model), stored.n_train


def _columns(tuner: Any, study_id: int) -> dict[str, Any]:
    from cubic.proxy.importance import knob_columns, study_configs

    study = tuner.resolved(study_id)
    sample = tuner.store.list_trials(study_id, limit=200)
    configs = study_configs(study.space, study.context, sample)
    return knob_columns(study.workload, study.space, configs)


@router.get("/studies/{study_id:int}/importance", response_model=ImportanceOut)
def importance(
    study_id: StudyId, caller: AnyRole, tuner: TunerDep, request: Request
) -> ImportanceOut:
    """Each knob's share of the proxy model's total gain: which knobs the model that ranks
    this study's configurations learned to look at. Nothing is fitted here: the newest
    stored model of the study's workload kind is read (once per version)."""
    caller.check_study(study_id)
    study = tuner.store.get_study(study_id)
    kind = study.workload_kind
    strategy = tuner.resolved(study_id).spec.strategy.name
    empty = {
        "study_id": study_id,
        "workload_kind": kind,
        "strategy": strategy,
        "knobs": [],
        "other_share": None,
    }
    version = tuner.store.latest_proxy_version(kind)
    if version is None:
        return ImportanceOut(
            **empty,
            model_version=None,
            n_train=None,
            reason=f"no {kind} proxy model is stored yet: the service fits one once enough "
            f"trials of that kind have finished",
        )
    cache = cache_of(request)
    read = cache.gains.get((kind, version), lambda: _gains(tuner.store, kind, version))
    if isinstance(read, str):
        return ImportanceOut(**empty, model_version=version, n_train=None, reason=read)
    from cubic.proxy.importance import knob_importance

    names, gains, n_train = read
    columns = cache.columns.get(study_id, lambda: _columns(tuner, study_id))
    shares, other = knob_importance(gains, names, columns)
    if not shares:
        return ImportanceOut(
            **empty,
            model_version=version,
            n_train=n_train,
            reason="the model's trees split on no feature a knob of this study moves",
        )
    knobs = [
        KnobImportance(knob=s.knob, share=s.share, gain=s.gain, features=list(s.features))
        for s in shares
    ]
    return ImportanceOut(
        **{**empty, "other_share": other, "knobs": knobs},
        model_version=version,
        n_train=n_train,
    )

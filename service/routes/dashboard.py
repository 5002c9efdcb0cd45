"""Read-only summaries the dashboard plots: a study's compact history, the proxy models."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter

from cubic.objectives import number, objective_values
from cubic.store.objects import TrialState
from service.auth import AnyRole
from service.deps import KindQuery, StoreDep, StudyId, TunerDep
from service.schemas import (
    API_ERRORS,
    MAX_HISTORY_ERROR,
    HistoryOut,
    HistoryPoint,
    ProxyModelOut,
    ProxyModelsOut,
)

router = APIRouter(prefix="/v1", tags=["dashboard"], responses=API_ERRORS)


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b of two paired samples; None when undefined."""
    if len(xs) < 3:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(xs, ys).statistic
    return None if tau is None or not math.isfinite(tau) else float(tau)


def _predicted(predicted: dict[str, Any] | None) -> float | None:
    return None if not predicted else number(predicted.get("value"))


@router.get("/studies/{study_id:int}/history", response_model=HistoryOut)
def history(study_id: StudyId, caller: AnyRole, tuner: TunerDep) -> HistoryOut:
    """All trials of a study in number order, reduced to params, value, prediction, GPU-hours
    and error: one request for the dashboard's plots, even at thousands of trials."""
    caller.check_study(study_id)
    spec = tuner.resolved(study_id).spec
    objective = spec.objectives[0]
    points = []
    for t in tuner.store.list_trials(study_id):
        value = None
        if t.state == TrialState.COMPLETE and t.metrics and not t.error:
            vals = objective_values(spec, t.metrics)
            value = vals[0] if vals else None
        points.append(
            HistoryPoint(
                number=t.number,
                state=t.state,
                source=t.source,
                params=t.params,
                value=value,
                predicted=_predicted(t.predicted),
                gpu_hours=number((t.metrics or {}).get("gpu_hours")),
                error=None if t.error is None else t.error[:MAX_HISTORY_ERROR],
            )
        )
    pairs = [
        (p.predicted, p.value) for p in points if p.predicted is not None and p.value is not None
    ]
    return HistoryOut(
        study_id=study_id,
        metric=objective.metric,
        direction=objective.direction or "maximize",
        trials=points,
        kendall_tau=kendall_tau([a for a, _ in pairs], [b for _, b in pairs]),
        n_predicted=len(pairs),
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

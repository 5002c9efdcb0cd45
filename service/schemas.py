"""Request and response bodies of the API, kept apart from the store's objects.

Responses are built from the store's snapshots by the ``from_*`` constructors, so a change
in storage never changes the API by accident. A trial's lease token appears only in the
answer to the worker that leased it (:class:`TrialLeaseOut`), never in a listing.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cubic.errors import InvalidInput
from cubic.pruning import MAX_SECONDS, MAX_STEPS, MAX_THROUGHPUT, Progress, Verdict
from cubic.store.objects import ApiToken, Role, Study, StudyState, Trial, TrialEvent, TrialState
from service.errors import MAX_DEPTH

MAX_LOG_TAIL = 64 * 1024
MAX_METRICS = 256
"""Metrics per report: a job reports tens; hundreds would be a log, not measurements."""

_PARAMS_EXAMPLE = {
    "tp": 2,
    "pp": 1,
    "cp": 1,
    "micro_batch": 2,
    "zero_stage": 1,
    "recompute": "selective",
    "sequence_parallel": True,
}
_METRICS_EXAMPLE = {
    "tokens_per_s": 185601.6,
    "mfu": 0.60,
    "peak_memory_gb": 71.2,
    "step_time_s": 22.6,
    "gpu_hours": 2.0,
}


def no_nul(value: Any, path: str = "body", depth: int = 0) -> Any:
    """Refuse NUL characters in any string or key of a JSON value (PostgreSQL cannot store
    them, and no name, id or message needs one), and nesting deeper than ``MAX_DEPTH``."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{path}: NUL characters are not accepted")
    elif isinstance(value, dict):
        for k, v in value.items():
            no_nul(k, path, depth + 1)
            no_nul(v, f"{path}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            no_nul(v, f"{path}.{i}", depth + 1)
    return value


class _In(BaseModel):
    """Request bodies: unknown fields and NUL characters are refused."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return no_nul(data)


def _finite(value: Any, path: str = "metrics") -> Any:
    """Refuse NaN and infinity anywhere in a JSON value (the database refuses them too)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: {value} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite(v, f"{path}.{i}")
    return value


# -- errors -------------------------------------------------------------------------------


class ErrorOut(BaseModel):
    """Every error answer: the message, the field at fault (when one is), the error type
    (``LeaseLost``, ``Forbidden``...); request validation adds FastAPI's ``errors`` list."""

    detail: str
    field: str | None
    type: str
    errors: list[dict[str, Any]] | None = None


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses an operation can answer, with the real body."""
    what = {
        401: "no valid API token (missing, unknown or revoked)",
        403: "the token's role or study does not allow this",
        404: "no such study, trial or token",
        409: "the resource's state does not allow it (a lost lease, a final study)",
        413: "the request body is larger than CUBIC_MAX_BODY_BYTES",
        415: "neither JSON nor YAML",
        422: "invalid input; `field` names the culprit",
        503: "the database is unavailable; retry after `Retry-After` seconds",
    }
    return {c: {"model": ErrorOut, "description": what[c]} for c in codes}


API_ERRORS = error_responses(401, 403, 404, 409, 413, 422, 503)
"""What any ``/v1`` operation may answer besides its success."""


# -- trials -------------------------------------------------------------------------------


class TrialEventOut(BaseModel):
    """One state transition of a trial."""

    id: int
    from_state: TrialState | None
    to_state: TrialState
    at: datetime
    worker_id: str | None
    detail: dict[str, Any]

    @classmethod
    def from_event(cls, e: TrialEvent) -> TrialEventOut:
        return cls(
            id=e.id,
            from_state=e.from_state,
            to_state=e.to_state,
            at=e.at,
            worker_id=e.worker_id,
            detail=e.detail,
        )


class TrialOut(BaseModel):
    """A trial as anyone may see it (without its lease token)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 17,
                    "study_id": 3,
                    "number": 4,
                    "params": _PARAMS_EXAMPLE,
                    "state": "complete",
                    "source": "strategy",
                    "metrics": _METRICS_EXAMPLE,
                    "predicted": None,
                    "worker_id": "node-a-1234",
                    "lease_deadline": None,
                    "attempt": 1,
                    "retry_of": None,
                    "error": None,
                    "log_tail": "20 steps, tokens_per_s=185601.6",
                    "created_at": "2025-01-01T10:00:00Z",
                    "started_at": "2025-01-01T10:00:01Z",
                    "finished_at": "2025-01-01T10:05:00Z",
                    "events": None,
                }
            ]
        }
    )

    id: int
    study_id: int
    number: int
    params: dict[str, Any]
    state: TrialState
    source: str
    metrics: dict[str, Any] | None
    predicted: dict[str, Any] | None
    worker_id: str | None
    lease_deadline: datetime | None
    attempt: int
    retry_of: int | None
    error: str | None
    log_tail: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    events: list[TrialEventOut] | None = Field(
        None, description="state transitions, oldest first (only when one trial is asked for)"
    )

    @classmethod
    def from_trial(cls, t: Trial, events: list[TrialEvent] | None = None) -> TrialOut:
        return cls(
            id=t.id,
            study_id=t.study_id,
            number=t.number,
            params=t.params,
            state=t.state,
            source=t.source,
            metrics=t.metrics,
            predicted=t.predicted,
            worker_id=t.worker_id,
            lease_deadline=t.lease_deadline,
            attempt=t.attempt,
            retry_of=t.retry_of,
            error=t.error,
            log_tail=t.log_tail,
            created_at=t.created_at,
            started_at=t.started_at,
            finished_at=t.finished_at,
            events=None if events is None else [TrialEventOut.from_event(e) for e in events],
        )


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int = Field(description="trials matching the filter, over all pages")
    limit: int
    offset: int


class TrialsOut(BaseModel):
    """Trials created by one request (enqueued configs, imported runs), in order."""

    trials: list[TrialOut]


class TrialLeaseOut(BaseModel):
    """A trial leased to the asking worker, with the token every later call must carry."""

    id: int
    number: int
    study_id: int
    params: dict[str, Any]
    lease_token: str
    lease_deadline: datetime
    attempt: int

    @classmethod
    def from_trial(cls, t: Trial) -> TrialLeaseOut:
        assert t.lease_token is not None and t.lease_deadline is not None
        return cls(
            id=t.id,
            number=t.number,
            study_id=t.study_id,
            params=t.params,
            lease_token=t.lease_token,
            lease_deadline=t.lease_deadline,
            attempt=t.attempt,
        )


class LeaseOut(BaseModel):
    """The trials the worker holds. None and ``study_state`` not ``running``: stop asking."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "trials": [
                        {
                            "id": 17,
                            "number": 4,
                            "study_id": 3,
                            "params": _PARAMS_EXAMPLE,
                            "lease_token": "4f1c0e0c9a9b4f7e8d1f3b2a6c5d4e3f",
                            "lease_deadline": "2025-01-01T10:05:00Z",
                            "attempt": 1,
                        }
                    ],
                    "study_state": "running",
                }
            ]
        }
    )

    trials: list[TrialLeaseOut]
    study_state: StudyState = Field(
        description="an empty lease from a running study means: all trials are out, ask again later"
    )
    retry_after_s: float | None = Field(
        None,
        description="set when fewer trials than asked were waiting: the next ones are being "
        "proposed; ask again after this many seconds",
    )


class LeaseRequest(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"worker_id": "node-a-1234", "count": 2, "lease_seconds": 600}]
        },
    )

    worker_id: str = Field(
        min_length=1,
        max_length=200,
        description="stable id of the worker; asking again with the same "
        "id returns the trials it already holds",
    )
    count: int = Field(1, ge=1, le=64, description="how many trials the worker can run now")
    lease_seconds: float | None = Field(
        None,
        ge=1,
        le=86400,
        description="lease length; keep it alive with heartbeats (default: the server's "
        "CUBIC_DEFAULT_LEASE_S, 300 s)",
    )


class ProgressIn(_In):
    """How far a running job has got (cumulative: resending it is harmless); see
    :class:`cubic.pruning.Progress`."""

    steps: int = Field(ge=0, le=MAX_STEPS, description="steps run, the warm-up included")
    timed_steps: int = Field(0, ge=0, le=MAX_STEPS, description="steps after the warm-up")
    step_time_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS, description="mean step time after the warm-up"
    )
    step_time_std_s: float = Field(
        0.0, ge=0, le=MAX_SECONDS, description="sample standard deviation of those step times"
    )
    throughput: float | None = Field(
        None, ge=0, le=MAX_THROUGHPUT, description="tokens or samples per second after warm-up"
    )
    elapsed_s: float | None = Field(
        None, ge=0, le=MAX_SECONDS, description="seconds of every step, the warm-up included"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ProgressIn:
        self.to_progress()
        return self

    def to_progress(self) -> Progress:
        try:
            return Progress.from_dict(self.model_dump(exclude_none=True))
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None


class HeartbeatRequest(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"lease_token": "4f1c0e0c9a9b4f7e8d1f3b2a6c5d4e3f", "lease_seconds": 300},
                {
                    "lease_token": "4f1c0e0c9a9b4f7e8d1f3b2a6c5d4e3f",
                    "lease_seconds": 300,
                    "progress": {
                        "steps": 15,
                        "timed_steps": 12,
                        "step_time_s": 2.31,
                        "step_time_std_s": 0.05,
                        "throughput": 56740.2,
                        "elapsed_s": 41.2,
                    },
                },
            ]
        },
    )

    lease_token: str = Field(min_length=1, max_length=200)
    lease_seconds: float | None = Field(
        None, ge=1, le=86400, description="new lease length, from now"
    )
    progress: ProgressIn | None = Field(
        None,
        description="how far the job has got; in a study with pruning on, the answer says "
        "whether to stop it",
    )


class PruneOut(BaseModel):
    """The pruner's verdict on a running trial: stop its job and report it ``pruned``."""

    method: str
    timed_steps: int
    throughput: float = Field(description="measured after the warm-up so far")
    bound: float = Field(
        description="what was compared: the upper confidence bound (threshold) or the "
        "measured throughput (median, percentile)"
    )
    limit: float = Field(description="what it had to reach")
    best: float = Field(description="the study's best complete throughput")
    trials: int = Field(description="complete trials it was judged against")
    reason: str

    @classmethod
    def from_verdict(cls, v: Verdict) -> PruneOut:
        return cls(**{k: val for k, val in v.to_dict().items() if k != "prune"})


class HeartbeatOut(TrialOut):
    """The trial with its lease extended, and whether to stop its job now."""

    prune: PruneOut | None = Field(
        None,
        description="set when the study's pruner stops the trial: cancel its job, then "
        "report `pruned` with this evidence",
    )


class ReleaseRequest(_In):
    lease_token: str = Field(min_length=1, max_length=200)


class ReportRequest(_In):
    """How a leased trial ended; repeating the same report with the same token is harmless."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "lease_token": "4f1c0e0c9a9b4f7e8d1f3b2a6c5d4e3f",
                    "state": "complete",
                    "metrics": _METRICS_EXAMPLE,
                    "error": None,
                    "log_tail": "step 20/20 ...",
                },
                {
                    "lease_token": "4f1c0e0c9a9b4f7e8d1f3b2a6c5d4e3f",
                    "state": "infeasible",
                    "metrics": {},
                    "error": "torch.OutOfMemoryError: CUDA out of memory",
                    "log_tail": None,
                },
            ]
        },
    )

    lease_token: str = Field(min_length=1, max_length=200)
    state: Literal["complete", "infeasible", "failed", "pruned"]
    metrics: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        description="measured metrics; `complete` needs the study's objective metric(s)",
    )
    error: str | None = Field(None, max_length=MAX_LOG_TAIL)
    log_tail: str | None = Field(
        None, max_length=MAX_LOG_TAIL, description="the end of the job's log (64 KiB at most)"
    )

    @field_validator("metrics")
    @classmethod
    def _finite_metrics(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _finite(v)


class EnqueueRequest(_In):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"configs": [_PARAMS_EXAMPLE]}]}
    )

    configs: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=1000,
        description="configs to run next (today's production config, say); inactive knobs "
        "may be left out",
    )


class ImportedTrial(_In):
    params: dict[str, Any]
    state: Literal["complete", "infeasible", "failed"]
    metrics: dict[str, Any] = Field(default_factory=dict, max_length=MAX_METRICS)

    @field_validator("metrics")
    @classmethod
    def _finite_metrics(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _finite(v)


class ImportRequest(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "trials": [
                        {
                            "params": _PARAMS_EXAMPLE,
                            "state": "complete",
                            "metrics": _METRICS_EXAMPLE,
                        },
                        {
                            "params": {**_PARAMS_EXAMPLE, "micro_batch": 8},
                            "state": "infeasible",
                            "metrics": {},
                        },
                    ]
                }
            ]
        },
    )

    trials: list[ImportedTrial] = Field(
        min_length=1, max_length=10_000, description="past runs, stored as finished trials"
    )


# -- studies ------------------------------------------------------------------------------


class ProgressOut(BaseModel):
    counts: dict[str, int] = Field(description="trials per state, every state present")
    max_trials: int
    best_value: float | None = Field(description="the best objective value so far")


class StudyOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "name": "llama3-8b-h100x16",
                    "state": "running",
                    "workload_kind": "llm",
                    "max_attempts": 3,
                    "spec": {
                        "name": "llama3-8b-h100x16",
                        "objectives": [{"metric": "tokens_per_s", "direction": "maximize"}],
                    },
                    "created_at": "2025-01-01T10:00:00Z",
                    "updated_at": "2025-01-01T10:00:00Z",
                    "progress": {
                        "counts": {
                            "waiting": 0,
                            "running": 4,
                            "complete": 10,
                            "infeasible": 2,
                            "failed": 0,
                            "pruned": 0,
                        },
                        "max_trials": 64,
                        "best_value": 185601.6,
                    },
                }
            ]
        }
    )

    id: int
    name: str
    state: StudyState
    workload_kind: str
    max_attempts: int
    spec: dict[str, Any] = Field(description="the study as stored, workload and space inlined")
    created_at: datetime
    updated_at: datetime
    progress: ProgressOut | None = Field(None, description="only when one study is asked for")

    @classmethod
    def from_study(cls, s: Study, progress: ProgressOut | None = None) -> StudyOut:
        return cls(
            id=s.id,
            name=s.name,
            state=s.state,
            workload_kind=s.workload_kind,
            max_attempts=s.max_attempts,
            spec=s.spec,
            created_at=s.created_at,
            updated_at=s.updated_at,
            progress=progress,
        )


class StudyPage(BaseModel):
    items: list[StudyOut]
    total: int = Field(description="studies matching the filter, over all pages")
    limit: int
    offset: int


class BestOut(BaseModel):
    """The best trial that respects the constraints, and its speed-up over the baseline."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "study_id": 3,
                    "metric": "tokens_per_s",
                    "direction": "maximize",
                    "value": 185601.6,
                    "trial": TrialOut.model_config["json_schema_extra"]["examples"][0],  # type: ignore[index]
                    "predicted": None,
                    "baseline_value": 174668.4,
                    "baseline_trial_id": 14,
                    "speedup": 1.063,
                }
            ]
        }
    )

    study_id: int
    metric: str
    direction: Literal["maximize", "minimize"]
    value: float
    trial: TrialOut
    predicted: dict[str, Any] | None = Field(description="what the proxy model predicted")
    baseline_value: float | None
    baseline_trial_id: int | None
    speedup: float | None = Field(description="times better than the baseline (> 1: faster)")


class ObjectiveOut(BaseModel):
    metric: str
    direction: Literal["maximize", "minimize"]


class ParetoPointOut(BaseModel):
    """A trial on the Pareto front, with its value of each objective."""

    values: dict[str, float] = Field(description="the trial's value of each objective, by metric")
    trial: TrialOut
    predicted: dict[str, Any] | None = Field(description="what the proxy model predicted")


class ParetoOut(BaseModel):
    """The study's Pareto front: the complete trials within the constraints that no other
    one beats on every objective, best first by the first objective."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "study_id": 5,
                    "objectives": [
                        {"metric": "tokens_per_s", "direction": "maximize"},
                        {"metric": "peak_memory_gb", "direction": "minimize"},
                    ],
                    "points": [
                        {
                            "values": {"tokens_per_s": 185601.6, "peak_memory_gb": 41.2},
                            "trial": TrialOut.model_config["json_schema_extra"]["examples"][0],  # type: ignore[index]
                            "predicted": None,
                        }
                    ],
                    "n_measured": 28,
                }
            ]
        }
    )

    study_id: int
    objectives: list[ObjectiveOut]
    points: list[ParetoPointOut] = Field(
        description="the non-dominated trials (empty until one is complete)"
    )
    n_measured: int = Field(description="distinct configs measured within the constraints")


STUDY_SPEC_EXAMPLE: dict[str, Any] = {
    "name": "llama3-8b-h100x16",
    "workload": {
        "preset": "llama3_8b",
        "cluster": {"gpu": "h100_sxm", "num_gpus": 16, "gpus_per_node": 8},
    },
    "space": "llm_pretrain.yaml",
    "objective": "tokens_per_s",
    "constraints": {"memory_headroom": 0.05},
    "budget": {"max_trials": 64, "max_parallel": 8},
    "strategy": {"name": "tpe", "seed": 0},
}
STUDY_SPEC_YAML_EXAMPLE = """\
name: llama3-8b-h100x16
workload:
  preset: llama3_8b
  cluster: {gpu: h100_sxm, num_gpus: 16, gpus_per_node: 8}
space: llm_pretrain.yaml
objective: tokens_per_s
budget: {max_trials: 64, max_parallel: 8}
strategy: {name: tpe, seed: 0}
"""


# -- tokens -------------------------------------------------------------------------------


class TokenRequest(_In):
    """A token to create: a name to recognise it by, its role, optionally one study."""

    name: str = Field(min_length=1, max_length=255, examples=["slurm-workers"])
    role: Role
    study_id: int | None = Field(None, ge=1, le=2**31 - 1, description="limit it to this study")


class TokenOut(BaseModel):
    """A token's record; its secret is never shown again after creation."""

    id: int
    name: str
    role: Role
    study_id: int | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    model_config = ConfigDict(from_attributes=True)

    @classmethod
    def from_token(cls, t: ApiToken) -> TokenOut:
        return cls.model_validate(t)


class TokenCreated(TokenOut):
    token: str = Field(description="the secret: send it as 'Authorization: Bearer <token>'")


class TokensOut(BaseModel):
    tokens: list[TokenOut]


# -- dashboard ----------------------------------------------------------------------------

MAX_ERROR_GROUP = 160
"""Characters of an error's first line kept as its group (numbers replaced by ``#``)."""
MAX_TOP = 500
"""The most best configurations a history carries (``top``)."""


class HistoryColumns(BaseModel):
    """Every trial reduced to what the plots need, one list per field (entry i of each is
    the i-th trial in number order): a few lists parse and plot far faster than 10,000
    objects. A trial's config is in ``top`` if it is among the best, and every trial's is
    at ``GET /v1/studies/{id}/trials``."""

    number: list[int]
    state: list[TrialState]
    source: list[str]
    value: list[float | None] = Field(
        description="the first objective's measured value (complete trials)"
    )
    predicted: list[float | None] = Field(description="the proxy model's `predicted.value`")
    gpu_hours: list[float | None]


class InfeasibleCount(BaseModel):
    """How often configs with one knob value could not run, of those finished."""

    knob: str
    value: Any
    infeasible: int = Field(description="infeasible trials with this knob value")
    finished: int = Field(description="complete or infeasible trials with this knob value")


class ErrorGroup(BaseModel):
    """Infeasible trials whose errors differ only by numbers."""

    message: str = Field(
        description=f"the error's first line, numbers as #, at most {MAX_ERROR_GROUP} characters"
    )
    trials: int


class TopConfig(BaseModel):
    """One of the best complete trials, with its configuration."""

    number: int
    value: float
    params: dict[str, Any]


class HistoryOut(BaseModel):
    """Every trial of a study in number order, compactly, with the proxy's rank agreement,
    why configurations were infeasible and the best configurations: what the study page
    plots, in one response that stays small at 10,000 trials (about 50 bytes a trial)."""

    study_id: int
    metric: str
    direction: Literal["maximize", "minimize"]
    trials: HistoryColumns
    value2: list[float | None] | None = Field(
        default=None,
        description="each trial's measured value of the second objective, in `trials` order "
        "(complete trials; null for a study of one objective): with `trials.value`, the "
        "plane the dashboard plots the Pareto front in",
    )
    kendall_tau: float | None = Field(
        description="Kendall's tau between predicted and measured values of complete trials "
        "(None with fewer than three such pairs)"
    )
    n_predicted: int = Field(description="complete trials with a prediction")
    infeasible_by_value: list[InfeasibleCount] = Field(
        description="knob values of at least one infeasible trial, the most infeasible first"
    )
    errors: list[ErrorGroup] = Field(description="infeasible trials' errors, largest group first")
    top: list[TopConfig] = Field(description="the best complete trials, best first (`top`)")


class KnobImportance(BaseModel):
    """One knob's share of the proxy model's total gain."""

    knob: str
    share: float = Field(ge=0, le=1, description="the knobs' shares sum to 1")
    gain: float = Field(description="total gain given to this knob (the model's own units)")
    features: list[str] = Field(
        description="the feature columns it moves that the trees split on, most gain first"
    )


class ImportanceOut(BaseModel):
    """Which knobs the proxy model's throughput predictions use, for one study.

    Read from the newest stored proxy model of the study's workload kind: the model the
    retrainer fits on every finished trial of that kind, this study's included, with the
    features the ``cubic`` strategy uses. (The strategy's own per-study refits live in the
    background process's memory only; nothing is fitted on a request.) A feature column's
    total gain goes to the knobs of the study's space that move it, in equal parts; gain
    on columns no knob moves (workload, cluster, knobs the space fixes) is ``other_share``.
    """

    study_id: int
    workload_kind: str
    strategy: str
    importance_type: Literal["total_gain"] = "total_gain"
    model_version: int | None = Field(description="the stored version read; None if none")
    n_train: int | None = Field(description="trials the model was fitted on")
    knobs: list[KnobImportance] = Field(
        description="every knob of the study's space, largest share first; empty when no "
        "model is fitted yet (see `reason`)"
    )
    other_share: float | None = Field(
        description="share of the total gain on columns no knob of the space moves"
    )
    reason: str | None = Field(None, description="why `knobs` is empty")


class ProxyModelOut(BaseModel):
    """A stored proxy model version and its measured quality (without the model itself)."""

    workload_kind: str
    version: int
    created_at: datetime
    n_train: int
    n_features: int
    metrics: dict[str, Any]


class ProxyModelsOut(BaseModel):
    models: list[ProxyModelOut] = Field(description="by workload kind, oldest version first")

"""Study specs: what a search job is, as a user writes it in YAML or JSON.

A spec names a workload (a ready-made name, a file, or inline fields), a search space (a file
or inline), the objective(s), constraints, a budget and a strategy. ``resolve`` turns file
references into inline data, so that a stored study is self-contained and reproducible even
after the files change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cubic.errors import InvalidInput
from cubic.shipped import find
from cubic.space import Space, SpaceError
from cubic.workload import Workload, WorkloadError, get_workload

STRATEGIES = ("random", "tpe", "gp", "qmc", "grid", "cubic")
METRICS = (
    "throughput",
    "tokens_per_s",
    "samples_per_s",
    "mfu",
    "cost",
    "step_time_s",
    "peak_memory_gb",
)
_DEFAULT_DIRECTION = {"cost": "minimize", "step_time_s": "minimize", "peak_memory_gb": "minimize"}


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Objective(_Spec):
    """One measured metric to optimise. ``cost`` is GPU-hours per million tokens or samples
    (derived from the throughput when a job does not report it); ``peak_memory_gb`` is the
    peak memory per GPU in 10^9 bytes. With two or more objectives the study's result is
    its Pareto front (see :mod:`cubic.pareto`)."""

    metric: Literal[METRICS] = "throughput"  # type: ignore[valid-type]
    direction: Literal["maximize", "minimize"] | None = None

    @model_validator(mode="after")
    def _direction(self) -> Objective:
        if self.direction is None:
            object.__setattr__(self, "direction", _DEFAULT_DIRECTION.get(self.metric, "maximize"))
        return self


class Constraints(_Spec):
    """Limits a complete trial must respect to count; a trial that breaks one is infeasible."""

    memory_headroom: float = Field(0.0, ge=0.0, lt=1.0, description="fraction of HBM kept free")
    max_error_score: float | None = Field(None, ge=0.0, description="numerical-error bound")
    max_gpus: int | None = Field(None, ge=1, description="largest cluster a config may use")


class Budget(_Spec):
    max_trials: int = Field(64, ge=1, le=100_000)
    max_parallel: int = Field(8, ge=1, le=10_000)
    max_gpu_hours: float | None = Field(None, gt=0)


class StrategySpec(_Spec):
    name: Literal[STRATEGIES] = "tpe"  # type: ignore[valid-type]
    seed: int | None = None
    options: dict[str, Any] = Field(default_factory=dict)


PRUNING_METHODS = ("threshold", "median", "percentile")
PRUNABLE_METRICS = ("throughput", "tokens_per_s", "samples_per_s")
"""Objectives a pruner can judge from step times: a throughput, which they measure."""


class PruningSpec(_Spec):
    """Early stopping of slow trials (see :mod:`cubic.pruning`); off unless ``enabled``.

    ``threshold`` stops a trial once the upper confidence bound of its throughput after
    warm-up is below ``fraction`` of the study's best; ``median`` and ``percentile`` are
    Optuna's rules (a trial below the median, or outside the top ``percentile`` per cent,
    of the complete trials). The baseline is never pruned.
    """

    enabled: bool = False
    method: Literal[PRUNING_METHODS] = "threshold"  # type: ignore[valid-type]
    fraction: float = Field(
        0.8, gt=0.0, le=1.0, description="threshold: share of the best a trial must reach"
    )
    confidence: float = Field(
        0.95, ge=0.5, lt=1.0, description="threshold: one-sided confidence of the bound"
    )
    percentile: float = Field(
        25.0, gt=0.0, lt=100.0, description="percentile: the top per cent of trials kept"
    )
    warmup_steps: int = Field(
        0, ge=0, le=1_000_000, description="steps a job runs before it can be judged at all"
    )
    min_steps: int = Field(
        5, ge=2, le=1_000_000, description="timed steps (after the job's warm-up) a verdict needs"
    )
    startup_trials: int = Field(
        1, ge=1, le=100_000, description="complete trials the study needs before any pruning"
    )


class JobSpec(_Spec):
    """How a real runner starts a trial's job; see the job contract in the README.

    ``command`` is a Jinja2 template rendered per trial with every knob by name, ``flags``
    (the knobs as ``--name value`` command-line flags), ``params``, ``trial``, ``config_path``
    and ``metrics_path``; ``env`` values are rendered the same way.
    """

    command: str = Field(..., min_length=1, description="shell command template")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")
    workdir: str | None = Field(None, description="working directory of the job")
    warmup_steps: int = Field(
        0, ge=0, description="steps a job leaves out of its throughput (CUBIC_WARMUP_STEPS)"
    )
    resources: dict[str, Any] = Field(
        default_factory=dict,
        description="scheduler hints (nodes, gpus_per_node, cpus_per_task, memory_gb, ...)",
    )

    @field_validator("command")
    @classmethod
    def _template(cls, v: str) -> str:
        from cubic.runners.contract import check_template

        check_template(v)
        return v


class StudySpec(_Spec):
    """A search job. ``workload`` and ``space`` are a name/path or inline mappings."""

    name: str = Field(..., min_length=1, max_length=200)
    description: str = ""
    workload: str | dict[str, Any]
    space: str | dict[str, Any]
    objectives: list[Objective] = Field(default_factory=lambda: [Objective()], min_length=1)
    constraints: Constraints = Field(default_factory=Constraints)
    budget: Budget = Field(default_factory=Budget)
    strategy: StrategySpec = Field(default_factory=StrategySpec)
    trial_timeout_s: float = Field(3600.0, gt=0)
    max_retries: int = Field(2, ge=0, le=100)
    baseline: dict[str, Any] | None = None
    job: JobSpec | None = Field(None, description="the real job; the simulated runner needs none")
    allow_unfit: bool = Field(
        False,
        description="create the study even when the memory estimate says no config fits",
    )
    pruning: PruningSpec = Field(default_factory=PruningSpec)

    @model_validator(mode="before")
    @classmethod
    def _single_objective(cls, data: Any) -> Any:
        """Accept ``objective: tokens_per_s`` or ``objective: {metric: ...}`` as shorthand."""
        if isinstance(data, dict) and "objective" in data:
            data = dict(data)
            obj = data.pop("objective")
            data["objectives"] = [{"metric": obj} if isinstance(obj, str) else obj]
        if isinstance(data, dict) and isinstance(data.get("strategy"), str):
            data = {**data, "strategy": {"name": data["strategy"]}}
        return data

    @field_validator("objectives")
    @classmethod
    def _distinct(cls, v: list[Objective]) -> list[Objective]:
        names = [o.metric for o in v]
        if len(set(names)) != len(names):
            raise ValueError("each metric may appear once")
        return v

    @field_validator("pruning")
    @classmethod
    def _prunable(cls, v: PruningSpec, info: ValidationInfo) -> PruningSpec:
        """A pruner judges a throughput from step times: one maximised throughput objective."""
        objectives = info.data.get("objectives")
        if v.enabled and objectives:
            first = objectives[0]
            if (
                len(objectives) > 1
                or first.metric not in PRUNABLE_METRICS
                or first.direction != "maximize"
            ):
                raise ValueError(
                    "enabled: pruning needs one maximised throughput objective "
                    f"({', '.join(PRUNABLE_METRICS)})"
                )
        return v

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    def load_workload(self, base: Path | None = None) -> Workload:
        try:
            if isinstance(self.workload, dict):
                return Workload.from_dict(self.workload, source=f"{self.name}: workload")
            return get_workload(_resolve_path(self.workload, base))
        except WorkloadError as exc:
            raise InvalidInput(str(exc), field="workload") from exc

    def load_space(self, base: Path | None = None) -> Space:
        try:
            if isinstance(self.space, dict):
                return Space.from_dict(self.space, source=f"{self.name}: space")
            return Space.from_yaml(find(self.space, base))
        except SpaceError as exc:
            raise InvalidInput(str(exc), field="space") from exc

    def resolve(self, base: Path | None = None, *, check_space: bool = True) -> ResolvedStudy:
        """Load the workload and space, check the baseline, and inline both into the spec.

        With ``check_space`` a space that has no valid configuration for the workload is
        refused here, naming the constraints that empty it, instead of after a fruitless
        search; a stored study was checked when it was made and is loaded without it.
        """
        workload = self.load_workload(base)
        space = self.load_space(base)
        if check_space:
            try:
                reason = space.empty_reason(workload.context())
            except SpaceError as exc:
                raise InvalidInput(f"space: {exc}", field="space") from exc
            if reason is not None:
                raise InvalidInput(f"space: {reason}", field="space")
        if self.baseline is not None:
            params = {k: v for k, v in self.baseline.items() if k not in space.derived_names}
            try:
                baseline = space.complete(params, workload.context())
            except SpaceError as exc:
                raise InvalidInput(f"baseline: {exc}", field="baseline") from exc
            problems = space.validate(baseline, workload.context())
            if problems:
                raise InvalidInput(
                    f"baseline: not a valid config of the space: {'; '.join(problems)}",
                    field="baseline",
                )
        inline = self.model_copy(update={"workload": workload.to_dict(), "space": space.to_dict()})
        return ResolvedStudy(inline, workload, space)


class ResolvedStudy:
    """A spec with its workload and space loaded; ``spec`` has both inlined."""

    __slots__ = ("space", "spec", "workload")

    def __init__(self, spec: StudySpec, workload: Workload, space: Space) -> None:
        self.spec = spec
        self.workload = workload
        self.space = space

    @property
    def context(self) -> dict[str, Any]:
        return self.workload.context()

    @classmethod
    def from_stored(cls, spec: dict[str, Any]) -> ResolvedStudy:
        return parse_spec(spec).resolve(check_space=False)


def _resolve_path(ref: str, base: Path | None) -> str:
    if base is not None and not Path(ref).is_absolute():
        candidate = base / ref
        if candidate.exists():
            return str(candidate)
    return ref


def _format_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def parse_spec(data: Any, source: str = "<spec>") -> StudySpec:
    """Validate a spec mapping; errors name the field."""
    if not isinstance(data, dict):
        raise InvalidInput(f"{source}: a study spec must be a mapping", field="spec")
    try:
        return StudySpec.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "spec"
        raise InvalidInput(f"{source}: {_format_errors(exc)}", field=field) from exc


def load_spec(path: str | Path) -> tuple[StudySpec, Path]:
    """Read a study file (or a shipped one by name); returns the spec and the folder
    relative references resolve from."""
    path = find(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}", field="file") from exc
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: not valid YAML: {exc}", field="file") from exc
    return parse_spec(data, str(path)), path.parent

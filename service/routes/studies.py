"""Studies: create (JSON or YAML), list, read with progress, change state, best so far and
the Pareto front."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from cubic.errors import Forbidden, InvalidInput, NotFound
from cubic.shipped import SHIPPED_DIR
from cubic.space import Space, SpaceError
from cubic.store.objects import StudyState
from cubic.study import StudySpec, parse_spec
from cubic.tuner import Tuner
from cubic.workload import PRESETS
from service.auth import AnyRole, Caller, SubmitterRole
from service.deps import KindQuery, PageDep, SettingsDep, StoreDep, StudyId, TunerDep
from service.errors import MAX_DEPTH
from service.schemas import (
    API_ERRORS,
    STUDY_SPEC_EXAMPLE,
    STUDY_SPEC_YAML_EXAMPLE,
    BestOut,
    ErrorOut,
    ObjectiveOut,
    ParetoOut,
    ParetoPointOut,
    ProgressOut,
    StudyOut,
    StudyPage,
    TrialOut,
    error_responses,
    no_nul,
)
from service.settings import ServiceSettings

router = APIRouter(prefix="/v1", tags=["studies"], responses=API_ERRORS)

MAX_SPEC_BYTES = 4 * 1024 * 1024
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"})
_FILE_SUFFIXES = (".yaml", ".yml", ".json")


async def spec_body(request: Request) -> tuple[bytes, str]:
    """The raw body and its media type; parsing waits for the handler's thread."""
    body = await request.body()
    if len(body) > MAX_SPEC_BYTES:
        raise HTTPException(413, f"a study spec may be at most {MAX_SPEC_BYTES} bytes")
    media = request.headers.get("content-type", "application/json")
    return body, media.split(";")[0].strip().lower()


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: nested aliases expand exponentially ("billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "aliases (*name) are not accepted: write the value out",
                self.peek_event().start_mark,
            )
        return super().compose_node(parent, index)


def _check_yaml_depth(body: bytes) -> None:
    """Refuse YAML nested deeper than ``MAX_DEPTH`` from the parser's event stream, which
    stops at the first event too deep: the loader would first build (recursively) every
    level of a 10,000-level document."""
    depth = 0
    for event in yaml.parse(body, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise InvalidInput(f"body: nested more than {MAX_DEPTH} levels deep", field="body")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_body(body: bytes, media: str) -> Any:
    """A spec document from JSON or YAML text; the error says which and where."""
    if media in YAML_TYPES:
        try:
            _check_yaml_depth(body)
            return yaml.load(body, Loader=_NoAliasLoader)  # a SafeLoader: no Python objects
        except yaml.YAMLError as exc:
            raise InvalidInput(f"body: not valid YAML: {exc}", field="body") from exc
    if media in ("application/json", "") or media.endswith("+json"):
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"body: not valid JSON: {exc}", field="body") from exc
    raise HTTPException(
        415, f"unsupported Content-Type {media!r}: send application/json or application/yaml"
    )


def server_side_refs(spec: StudySpec, settings: ServiceSettings) -> StudySpec:
    """The spec with what it names on the server inlined: a ``space:`` file from the
    server's spaces folder (``CUBIC_SPACES_DIR``) or the shipped ones, a ``workload:`` preset
    by name. Nothing else is read from disk: a client must not make the server open its
    files."""
    update: dict[str, Any] = {}
    if isinstance(spec.workload, str):
        if spec.workload not in PRESETS:
            raise InvalidInput(
                f"workload: {spec.workload!r} is not a preset ({', '.join(sorted(PRESETS))}); "
                "send the workload inline",
                field="workload",
            )
        update["workload"] = PRESETS[spec.workload].to_dict()
    if isinstance(spec.space, str):
        path = _space_file(spec.space, settings.spaces_dir)
        if path is None:
            raise InvalidInput(
                f"space: no space file {spec.space!r} in the server's spaces folder or among "
                "the shipped spaces; send the space inline instead",
                field="space",
            )
        try:
            update["space"] = Space.from_yaml(path).to_dict()
        except SpaceError as exc:
            raise InvalidInput(f"space: {exc}", field="space") from exc
    return spec.model_copy(update=update)


def _space_file(name: str, spaces_dir: Path) -> Path | None:
    """A space file by name: in the server's spaces folder, else among the spaces cubic
    ships (so that a server started anywhere knows ``llm_pretrain.yaml``). An absolute
    name, one that leaves the folder or one that is not YAML or JSON is never read."""
    if Path(name).is_absolute() or Path(name).suffix not in _FILE_SUFFIXES:
        return None
    for folder in (spaces_dir, SHIPPED_DIR):
        root = folder.resolve()
        path = (root / name).resolve()
        if path.is_relative_to(root) and path.suffix in _FILE_SUFFIXES and path.is_file():
            return path
    return None


_SPEC_OPENAPI = {
    "requestBody": {
        "required": True,
        "description": "The study spec, as in a study file; a `space:` file name is "
        "looked up in the server's spaces folder (`CUBIC_SPACES_DIR`), then among the "
        "shipped spaces, and nowhere else; "
        "a `workload:` name must be a preset.",
        "content": {
            "application/json": {
                "schema": StudySpec.model_json_schema(),
                "example": STUDY_SPEC_EXAMPLE,
            },
            "application/yaml": {"schema": {"type": "string"}, "example": STUDY_SPEC_YAML_EXAMPLE},
        },
    }
}


@router.post(
    "/studies",
    status_code=201,
    response_model=StudyOut,
    openapi_extra=_SPEC_OPENAPI,
    responses={
        **error_responses(415),
        422: {"model": ErrorOut, "description": "invalid spec; `field` names the culprit"},
    },
)
def create_study(
    caller: SubmitterRole,
    body: Annotated[tuple[bytes, str], Depends(spec_body)],
    request: Request,
    response: Response,
    tuner: TunerDep,
    settings: SettingsDep,
) -> StudyOut:
    """Create a study from its spec; its baseline (if any) is queued as the first trial."""
    if caller.token is not None and caller.token.study_id is not None:
        raise Forbidden("a token limited to one study cannot create studies")
    document = parse_body(*body)
    try:
        no_nul(document, "spec")
    except ValueError as exc:
        raise InvalidInput(str(exc), field="spec") from exc
    spec = parse_spec(document, "spec")
    study = tuner.create_study(server_side_refs(spec, settings), owner_token_id=caller.token_id)
    response.headers["Location"] = request.app.url_path_for("get_study", study_id=study.id)
    return StudyOut.from_study(study)


@router.get("/studies", response_model=StudyPage)
def list_studies(
    caller: AnyRole,
    store: StoreDep,
    page: PageDep,
    state: Annotated[StudyState | None, Query()] = None,
    kind: KindQuery = None,
) -> StudyPage:
    """Studies in creation order (a token limited to one study sees that one)."""
    if caller.token is not None and caller.token.study_id is not None:
        only = store.get_study(caller.token.study_id)
        match = (state is None or only.state == state) and (
            kind is None or only.workload_kind == kind
        )
        items = [only] if match else []
        return StudyPage(
            items=[StudyOut.from_study(s) for s in items[page.offset : page.offset + page.limit]],
            total=len(items),
            limit=page.limit,
            offset=page.offset,
        )
    items = store.list_studies(state, kind, limit=page.limit, offset=page.offset)
    return StudyPage(
        items=[StudyOut.from_study(s) for s in items],
        total=store.count_studies(state, kind),
        limit=page.limit,
        offset=page.offset,
    )


def progress(tuner: Tuner, study_id: int) -> ProgressOut:
    p = tuner.progress(study_id)
    best = tuner.best(study_id)
    return ProgressOut(
        counts=p["counts"],
        max_trials=p["max_trials"],
        best_value=None if best is None else best.value,
    )


@router.get("/studies/{study_id:int}", response_model=StudyOut)
def get_study(study_id: StudyId, caller: AnyRole, tuner: TunerDep) -> StudyOut:
    """A study with its progress: trials per state, the budget, the best value so far."""
    caller.check_study(study_id)
    study = tuner.store.get_study(study_id)
    return StudyOut.from_study(study, progress(tuner, study_id))


def _set_state(caller: Caller, tuner: Tuner, study_id: int, state: StudyState) -> StudyOut:
    caller.check_owner(tuner.store.get_study(study_id))
    return StudyOut.from_study(tuner.set_state(study_id, state))


_409 = {
    409: {
        "model": ErrorOut,
        "description": "the study's state does not allow it (archived is final)",
    }
}


@router.post("/studies/{study_id:int}:pause", response_model=StudyOut, responses=_409)
def pause_study(study_id: StudyId, caller: SubmitterRole, tuner: TunerDep) -> StudyOut:
    """Stop handing out new trials; running ones finish. Only a running study pauses."""
    return _set_state(caller, tuner, study_id, StudyState.PAUSED)


@router.post("/studies/{study_id:int}:resume", response_model=StudyOut, responses=_409)
def resume_study(study_id: StudyId, caller: SubmitterRole, tuner: TunerDep) -> StudyOut:
    """Hand out trials again; only a paused study resumes."""
    return _set_state(caller, tuner, study_id, StudyState.RUNNING)


@router.post("/studies/{study_id:int}:stop", response_model=StudyOut, responses=_409)
def stop_study(study_id: StudyId, caller: SubmitterRole, tuner: TunerDep) -> StudyOut:
    """End a running or paused study for good before its budget is spent."""
    return _set_state(caller, tuner, study_id, StudyState.STOPPED)


@router.post("/studies/{study_id:int}:archive", response_model=StudyOut, responses=_409)
def archive_study(study_id: StudyId, caller: SubmitterRole, tuner: TunerDep) -> StudyOut:
    """Freeze a study: final, no trial is added to it again."""
    return _set_state(caller, tuner, study_id, StudyState.ARCHIVED)


@router.get(
    "/studies/{study_id:int}/best",
    response_model=BestOut,
    responses={404: {"model": ErrorOut, "description": "unknown study, or nothing complete yet"}},
)
def best(study_id: StudyId, caller: AnyRole, tuner: TunerDep) -> BestOut:
    """The best complete trial that respects the constraints, against the baseline."""
    caller.check_study(study_id)
    b = tuner.best(study_id)
    if b is None:
        raise NotFound(f"study {study_id} has no complete trial within its constraints yet")
    objective = tuner.resolved(study_id).spec.objectives[0]
    return BestOut(
        study_id=study_id,
        metric=objective.metric,
        direction=objective.direction or "maximize",
        value=b.value,
        trial=TrialOut.from_trial(b.trial),
        predicted=b.trial.predicted,
        baseline_value=b.baseline_value,
        baseline_trial_id=None if b.baseline is None else b.baseline.id,
        speedup=b.speedup,
    )


@router.get(
    "/studies/{study_id:int}/pareto",
    response_model=ParetoOut,
    responses={404: {"model": ErrorOut, "description": "unknown study"}},
)
def pareto(study_id: StudyId, caller: AnyRole, tuner: TunerDep) -> ParetoOut:
    """The Pareto front of a study of two or more objectives (throughput against cost or
    peak memory): every complete trial within the constraints that no other one beats on
    every objective, best first by the first objective. A single-objective study's front is
    its best trial; before any trial is complete, the front is empty."""
    caller.check_study(study_id)
    front = tuner.pareto(study_id)
    return ParetoOut(
        study_id=study_id,
        objectives=[
            ObjectiveOut(metric=m, direction=d)  # type: ignore[arg-type]
            for m, d in zip(front.metrics, front.directions, strict=True)
        ],
        points=[
            ParetoPointOut(
                values=dict(zip(front.metrics, p.values, strict=True)),
                trial=TrialOut.from_trial(p.trial),
                predicted=p.trial.predicted,
            )
            for p in front.points
        ],
        n_measured=front.n_measured,
    )

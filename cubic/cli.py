"""The ``cubic`` command.

Every command that touches the database reads ``CUBIC_DATABASE_URL`` (or ``--db``); every
error cubic raises on purpose is printed as one line and exits 2, without a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cubic.errors import CubicError, InvalidInput
from cubic.pruning import PROGRESS_REPORT_S
from cubic.retry import DEFAULT_OUTAGE_S

if TYPE_CHECKING:
    from cubic.client import CubicClient

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="cubic: find the fastest configuration for distributed training jobs.",
)
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
spaces_app = typer.Typer(no_args_is_help=True, help="Search spaces.")
study_app = typer.Typer(no_args_is_help=True, help="Studies (search jobs).")
sim_app = typer.Typer(no_args_is_help=True, help="The simulated cluster.")
token_app = typer.Typer(
    no_args_is_help=True, help="API tokens (on the service's database: an operator's tool)."
)
app.add_typer(token_app, name="token")
app.add_typer(db_app, name="db")
app.add_typer(spaces_app, name="spaces")
app.add_typer(study_app, name="study")
app.add_typer(sim_app, name="sim")
bench_app = typer.Typer(help="Benchmarks: search efficiency (default) and the service.")
app.add_typer(bench_app, name="bench")

console = Console(soft_wrap=True)
err_console = Console(stderr=True)

DbOpt = Annotated[str | None, typer.Option("--db", help="database URL (CUBIC_DATABASE_URL)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="CUBIC_URL", help="cubic service URL (else the local database)"),
]


def _client(url: str) -> CubicClient:
    """A client for a command a person waits on: it gives up after ``$CUBIC_OUTAGE_S``
    seconds (60 by default) of an unreachable service, not a worker's 15 minutes."""
    import os

    from pydantic import ValidationError

    from cubic.client import CubicClient
    from cubic.config import ClientSettings

    try:
        outage_s = ClientSettings().outage_s
    except ValidationError:
        raw = os.environ.get("CUBIC_OUTAGE_S")
        raise CubicError(f"CUBIC_OUTAGE_S must be a number of seconds >= 0, not {raw!r}") from None
    return CubicClient(url, outage_s=outage_s)


def _url(db: str | None) -> str:
    """The database URL: ``--db``, else ``CUBIC_DATABASE_URL``, checked (one-line errors)."""
    import os

    from pydantic import ValidationError

    from cubic.config import Settings

    where_env = "CUBIC_DATABASE_URL"

    try:
        return Settings(database_url=db).database_url if db else Settings().database_url
    except ValidationError:
        where, value = ("--db", db) if db else ("CUBIC_DATABASE_URL", os.environ.get(where_env))
        raise InvalidInput(
            f"{where}: expected a sqlite:// or postgresql:// URL, got {value!r}",
            field="database_url",
        ) from None


def _tuner(db: str | None):
    """The tuner on the local database; a SQLite file that does not exist is not created
    here (that is `cubic db upgrade`'s job)."""
    from sqlalchemy.engine import make_url

    from cubic.store import Store
    from cubic.tuner import Tuner

    url = _url(db)
    parsed = make_url(url)
    local_file = parsed.get_backend_name() == "sqlite" and parsed.database not in (
        None,
        "",
        ":memory:",
    )
    if local_file and not Path(str(parsed.database)).exists():
        raise InvalidInput(
            f"no database at {parsed.database}: run `cubic db upgrade` first, or pass "
            "--url (CUBIC_URL) to use a service",
            field="database_url",
        )
    return Tuner(Store(url))


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# db -----------------------------------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Create or migrate the database schema to this version of cubic."""
    from cubic.store.schema import head_revision, upgrade

    url = _url(db)
    upgrade(url)
    console.print(f"database at revision {head_revision()}: {_redact(url)}")


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# tokens -------------------------------------------------------------------------------------
@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="admin, submitter, worker or reader")],
    name: Annotated[str | None, typer.Option(help="what the token is for")] = None,
    study: Annotated[int | None, typer.Option(help="limit the token to this study")] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Create an API token and print its secret, once: only its digest is stored."""
    from cubic.store import Store

    with Store(_url(db)) as store:
        record, secret = store.create_token(name or f"{role} token", role, study)
    if json_out:
        _print_json({**_token_row(record), "token": secret})
        return
    scope = f" for study {study}" if study is not None else ""
    err_console.print(
        f"token {record.id} ({record.role.value}{scope}); shown once, keep it secret:",
        markup=False,
    )
    sys.stdout.write(secret + "\n")


def _token_row(t: Any) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "role": t.role.value,
        "study_id": t.study_id,
        "created_at": t.created_at.isoformat(timespec="seconds"),
        "last_used_at": t.last_used_at and t.last_used_at.isoformat(timespec="seconds"),
        "revoked_at": t.revoked_at and t.revoked_at.isoformat(timespec="seconds"),
    }


@token_app.command("list")
def token_list(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """Every token (never its secret), with when it was last used."""
    from rich.table import Table

    from cubic.store import Store

    with Store(_url(db)) as store:
        rows = [_token_row(t) for t in store.list_tokens()]
    if json_out:
        _print_json(rows)
        return
    table = Table("id", "name", "role", "study", "created", "last used", "revoked")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["name"],
            r["role"],
            "" if r["study_id"] is None else str(r["study_id"]),
            r["created_at"],
            r["last_used_at"] or "never",
            r["revoked_at"] or "",
        )
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int, db: DbOpt = None) -> None:
    """Revoke a token for good: every later request with it gets 401."""
    from cubic.store import Store

    with Store(_url(db)) as store:
        t = store.revoke_token(token_id)
    console.print(f"token {t.id} ({t.name}) revoked")


# spaces -------------------------------------------------------------------------------------
@spaces_app.command("validate")
def spaces_validate(
    file: Path,
    workload: Annotated[
        str | None,
        typer.Option(help="workload name or file: count the valid configs and those that fit"),
    ] = None,
    headroom: Annotated[
        float, typer.Option(min=0.0, max=0.99, help="share of HBM kept free")
    ] = 0.05,
) -> None:
    """Check a search-space file (or a shipped space by name); with --workload, also count
    its valid configurations and the share the memory estimate says fit on the workload's
    GPUs. A space with no valid configuration fails, naming the constraints that empty it."""
    from cubic.shipped import find
    from cubic.space import validate_file
    from cubic.workload import get_workload

    wl = get_workload(workload) if workload else None
    ctx = wl.context() if wl is not None else None
    space = validate_file(find(file), ctx)
    msg = f"{file}: ok, {len(space.names)} parameters"
    if wl is not None:
        reason = space.empty_reason(wl.context())
        if reason is not None:
            raise InvalidInput(f"{file}: {reason}", field="space")
        from cubic.strategies.candidates import survey, unfit_reason

        s = survey(wl, space, limit=1.0 - headroom)
        counted = "valid configurations" if s.exhaustive else "valid configurations sampled"
        msg += (
            f"; {s.valid:,} {counted} for {workload}, {s.on_hardware / max(1, s.valid):.1%} "
            f"run on {wl.cluster.gpu}, {s.fit_share:.1%} fit in memory by the estimate "
            f"({headroom:.0%} headroom)"
        )
        reason = unfit_reason(s, wl)
        if reason is not None:
            console.print(msg)
            raise InvalidInput(reason, field="space")
    console.print(msg)


# studies ------------------------------------------------------------------------------------
@study_app.command("create")
def study_create(
    file: Path, db: DbOpt = None, url: UrlOpt = None, json_out: JsonOpt = False
) -> None:
    """Create a study from a YAML spec (on the service with --url or CUBIC_URL)."""
    if url:
        with _client(url) as client:
            made = client.create_study_from_file(file)
        sid, name = made["id"], made["name"]
    else:
        from cubic.study import load_spec

        spec, base = load_spec(file)
        study = _tuner(db).create_study(spec, base)
        sid, name = study.id, study.name
    if json_out:
        _print_json({"id": sid, "name": name})
    else:
        console.print(f"created study {sid}: {name}")


@study_app.command("list")
def study_list(db: DbOpt = None, url: UrlOpt = None, json_out: JsonOpt = False) -> None:
    """List studies (of the service with --url or CUBIC_URL)."""
    if url:
        with _client(url) as client:
            items = client.list_studies(limit=500)["items"]
        rows = [
            {
                "id": s["id"],
                "name": s["name"],
                "state": s["state"],
                "kind": s["workload_kind"],
                "trials": sum((s.get("progress") or {}).get("counts", {}).values()),
            }
            for s in items
        ]
        if json_out:
            _print_json([{k: r[k] for k in ("id", "name", "state", "kind")} for r in rows])
            return
        table = Table("id", "name", "kind", "state")
        for r in rows:
            table.add_row(str(r["id"]), r["name"], r["kind"], r["state"])
        console.print(table)
        return
    tuner = _tuner(db)
    studies = tuner.store.list_studies(limit=1000)
    if json_out:
        _print_json(
            [
                {"id": s.id, "name": s.name, "state": str(s.state), "kind": s.workload_kind}
                for s in studies
            ]
        )
        return
    table = Table("id", "name", "kind", "state", "trials")
    for s in studies:
        counts = tuner.store.count_trials(s.id)
        table.add_row(str(s.id), s.name, s.workload_kind, str(s.state), str(sum(counts.values())))
    console.print(table)


@study_app.command("show")
def study_show(
    study_id: int, db: DbOpt = None, url: UrlOpt = None, json_out: JsonOpt = False
) -> None:
    """Show a study's spec summary and progress (from the service with --url or CUBIC_URL)."""
    if url:
        with _client(url) as client:
            got = client.get_study(study_id)
        sid, name, state, kind, spec = (
            got["id"],
            got["name"],
            got["state"],
            got["workload_kind"],
            got["spec"],
        )
        prog = got["progress"]
    else:
        tuner = _tuner(db)
        s = tuner.store.get_study(study_id)
        sid, name, state, kind, spec = s.id, s.name, str(s.state), s.workload_kind, s.spec
        prog = tuner.progress(study_id)
    if json_out:
        _print_json({"id": sid, "name": name, "state": state, "spec": spec, "progress": prog})
        return
    console.print(f"[bold]study {sid}[/bold]: {name} ({kind}, {state})")
    console.print(f"workload: {spec['workload']['name']} on {spec['workload']['cluster']}")
    objs = ", ".join(f"{o['direction']} {o['metric']}" for o in spec["objectives"])
    console.print(f"objectives: {objs}; strategy: {spec['strategy']['name']}")
    console.print(f"trials: {prog['counts']} of budget {prog['max_trials']}")


@app.command("trials")
def trials(
    study_id: int,
    state: Annotated[str | None, typer.Option(help="only trials in this state")] = None,
    db: DbOpt = None,
    url: UrlOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List a study's trials."""
    if url:
        with _client(url) as client:
            rows = client.all_trials(study_id, state=state)
            metric = client.get_study(study_id)["spec"]["objectives"][0]["metric"]
    else:
        tuner = _tuner(db)
        rows = [
            _trial_json(t)
            for t in tuner.store.list_trials(study_id, states=[state] if state else None)
        ]
        metric = tuner.resolved(study_id).spec.objectives[0].metric
    if json_out:
        _print_json(rows)
        return
    table = Table("#", "state", "source", "attempt", metric, "params")
    for t in rows:
        v = (t["metrics"] or {}).get(metric)
        table.add_row(
            str(t["number"]),
            str(t["state"]),
            t["source"],
            str(t["attempt"]),
            f"{v:,.1f}" if isinstance(v, int | float) else "",
            _short(t["params"]),
        )
    console.print(table)


def _short(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _trial_json(t: Any) -> dict[str, Any]:
    return {
        "id": t.id,
        "number": t.number,
        "state": str(t.state),
        "source": t.source,
        "attempt": t.attempt,
        "params": t.params,
        "metrics": t.metrics,
        "predicted": t.predicted,
        "error": t.error,
    }


ParetoOpt = Annotated[
    bool | None,
    typer.Option(
        "--pareto/--no-pareto",
        help="the Pareto front instead of one best config (default: when the study has "
        "two or more objectives)",
    ),
]


@app.command("best")
def best(
    study_id: int,
    db: DbOpt = None,
    url: UrlOpt = None,
    json_out: JsonOpt = False,
    pareto: ParetoOpt = None,
) -> None:
    """The best configuration found so far and its speed-up over the baseline; for a study
    of two or more objectives, its Pareto front."""
    if url:
        with _client(url) as client:
            if pareto is None:
                pareto = len(client.get_study(study_id)["spec"]["objectives"]) > 1
            out = client.pareto(study_id) if pareto else client.best(study_id)
    else:
        tuner = _tuner(db)
        if pareto is None:
            pareto = len(tuner.resolved(study_id).spec.objectives) > 1
        if pareto:
            out = _pareto_json(tuner, study_id)
        else:
            b = tuner.best(study_id)
            if b is None:
                raise CubicError(f"study {study_id} has no complete trial yet")
            out = {
                "study_id": study_id,
                "metric": tuner.resolved(study_id).spec.objectives[0].metric,
                "trial": _trial_json(b.trial),
                "value": b.value,
                "baseline_value": b.baseline_value,
                "speedup": b.speedup,
            }
    if json_out:
        _print_json(out)
        return
    if pareto:
        print_pareto(out)
    else:
        print_best(out)


def _pareto_json(tuner: Any, study_id: int) -> dict[str, Any]:
    """The Pareto front from the local database, shaped as the service's answer."""
    front = tuner.pareto(study_id)
    return {
        "study_id": study_id,
        "objectives": [
            {"metric": m, "direction": d}
            for m, d in zip(front.metrics, front.directions, strict=True)
        ],
        "points": [
            {
                "values": dict(zip(front.metrics, p.values, strict=True)),
                "trial": _trial_json(p.trial),
                "predicted": p.trial.predicted,
            }
            for p in front.points
        ],
        "n_measured": front.n_measured,
    }


def _figure(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def print_pareto(front: dict[str, Any], out: Console | None = None) -> None:
    """Print a Pareto-front answer (the JSON of `cubic best --pareto`) as a table: one row
    per config on the front, best first by the first objective."""
    out = out or console
    objectives = front["objectives"]
    points = front["points"]
    if not points:
        out.print(f"study {front['study_id']}: no complete trial within its constraints yet")
        return
    arrows = {"maximize": "max", "minimize": "min"}
    cols = [f"{o['metric']} ({arrows[o['direction']]})" for o in objectives]
    # Only the knobs that differ along the front: what the trade-off is made of.
    names = list(dict.fromkeys(k for p in points for k in p["trial"]["params"]))
    differ = [k for k in names if len({repr(p["trial"]["params"].get(k)) for p in points}) > 1]
    table = Table(
        "trial",
        *cols,
        "knobs that differ along the front",
        title=f"Pareto front: {len(points)} of {front['n_measured']} configs measured",
    )
    for p in points:
        params = p["trial"]["params"]
        table.add_row(
            str(p["trial"]["number"]),
            *(_figure(p["values"][o["metric"]]) for o in objectives),
            " ".join(f"{k}={params.get(k)}" for k in differ),
        )
    out.print(table)


def print_best(best: dict[str, Any], out: Console | None = None) -> None:
    """Print a best-config answer (the JSON of `cubic best`) as a table."""
    out = out or console
    metric, trial = best["metric"], best["trial"]
    table = Table("knob", "value", title=f"best config (trial {trial['number']})")
    for k, v in trial["params"].items():
        table.add_row(k, str(v))
    out.print(table)
    out.print(f"{metric}: [bold]{best['value']:,.1f}[/bold]")
    if best.get("speedup") is not None:
        out.print(
            f"baseline {metric}: {best['baseline_value']:,.1f}  ->  "
            f"speed-up [bold green]{best['speedup']:.2f}x[/bold green]"
        )


# simulator ----------------------------------------------------------------------------------
def _load_yaml(path: Path, what: str) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CubicError(f"{path}: cannot read {what}: {exc}") from exc
    if not isinstance(doc, dict):
        raise CubicError(f"{path}: a {what} must be a mapping")
    return doc


@app.command("simulate")
def simulate_cmd(
    workload: Annotated[str, typer.Option(help="workload name or YAML file")],
    config: Annotated[Path, typer.Option(help="YAML file with the knobs")],
    json_out: JsonOpt = False,
) -> None:
    """Predict step time, throughput, memory and MFU of one configuration."""
    from cubic.sim import simulate, unknown_knobs
    from cubic.workload import get_workload

    wl = get_workload(workload)
    cfg = _load_yaml(config, "config")
    unknown = unknown_knobs(wl.kind, cfg)
    if unknown:
        raise InvalidInput(f"{config}: unknown knob(s) {', '.join(unknown)}", field="config")
    row = simulate(wl, [cfg]).row(0)
    if json_out:
        _print_json(row)
        return
    table = Table("output", "value", title=f"{wl.name} on {wl.cluster.num_gpus}x {wl.cluster.gpu}")
    if row["feasible"]:
        table.add_row("step time", f"{row['step_time_s']:.3f} s")
        table.add_row("throughput", f"{row['throughput']:,.0f} {row['throughput_unit']}")
        table.add_row("MFU", f"{row['mfu']:.1%}")
    else:
        table.add_row("runs", f"[red]no: {row['reason']}[/red]")
    table.add_row("peak memory / GPU", f"{row['peak_memory_gb']:.1f} GB")
    table.add_row("numerical-error score", f"{row['error_score']:.3g}")
    for k, v in row["breakdown_s"].items():
        table.add_row(f"  time: {k}", f"{v:.4f} s")
    for k, v in row["memory_gb"].items():
        table.add_row(f"  memory: {k}", f"{v:.2f} GB")
    console.print(table)


@sim_app.command("validate")
def sim_validate(
    file: Annotated[
        Path | None, typer.Argument(help="CSV of published runs (default: shipped)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Simulate every published run in a calibration CSV and report the error."""
    from cubic.sim.calibrate import load_rows, validate

    res = validate(load_rows(file))
    if json_out:
        _print_json(res)
        return
    table = Table("id", "metric", "published", "predicted", "error")
    for r in res["rows"]:
        table.add_row(
            r["id"],
            r["metric"],
            f"{r['published']:,.3f}",
            f"{r['predicted']:,.3f}",
            f"{r['error_pct']:+.1f}%",
        )
    console.print(table)
    for src, m in res["by_source"].items():
        console.print(f"MAPE {m:5.1f}%  {src}")
    console.print(f"[bold]overall MAPE {res['mape']:.1f}%[/bold]")


@sim_app.command("bench")
def sim_bench(
    n: Annotated[int, typer.Option(help="configurations per batch")] = 200_000,
    repeat: Annotated[int, typer.Option(help="batches to time")] = 3,
) -> None:
    """Print how many configurations per second the simulator scores (one core)."""
    from cubic.sim.bench import bench

    for line in bench(n, repeat):
        console.print(line)


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="CUBIC_PORT", help="port")] = 8000,
    db: DbOpt = None,
    auth: Annotated[
        bool | None,
        typer.Option(
            "--auth/--no-auth",
            help="require API tokens (default: on, unless it listens on loopback only)",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=256,
            envvar="CUBIC_API_WORKERS",
            help="API processes (uvicorn workers) sharing the port; /metrics sums them all",
        ),
    ] = 1,
) -> None:
    """Start the API on the configured database (one process, or ``--workers`` of them)."""
    import ipaddress
    import os

    import uvicorn

    from cubic.store.engine import make_engine
    from cubic.store.schema import check_schema
    from service.app import create_app
    from service.settings import ServiceSettings

    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if auth is None and "CUBIC_AUTH" not in os.environ:
        auth = not loopback
    overrides: dict[str, Any] = {"database_url": _url(db)}
    if auth is not None:
        overrides["auth"] = auth
    settings = ServiceSettings.from_env(**overrides)
    if not settings.auth:
        warn = (
            "" if loopback else " ON A NON-LOOPBACK ADDRESS: anyone who reaches it can do anything"
        )
        err_console.print(
            f"authentication is off: the API on {host}:{port} needs no token{warn}"
            + ("" if warn else " (it listens on loopback only; pass --auth to require tokens)"),
            markup=False,
            highlight=False,
        )
    engine = make_engine(settings.database_url)
    try:
        check_schema(engine)  # refuse to start on an out-of-date schema, naming the command
    finally:
        engine.dispose()
    if workers == 1:
        uvicorn.run(create_app(settings), host=host, port=port)
        return
    # Each worker process builds its app from the environment: hand it what was decided here.
    os.environ["CUBIC_DATABASE_URL"] = settings.database_url
    os.environ["CUBIC_AUTH"] = "true" if settings.auth else "false"
    with _metrics_folder():
        uvicorn.run("service.app:create_app", factory=True, host=host, port=port, workers=workers)


@contextmanager
def _metrics_folder() -> Iterator[None]:
    """A ``PROMETHEUS_MULTIPROC_DIR`` for the API processes, empty when they start (counts
    of an earlier run would be added to theirs): the given one emptied of its ``*.db``
    files, else a temporary folder removed at the end."""
    import os
    import shutil
    import tempfile

    from service.metrics import MULTIPROC_ENV

    given = os.environ.get(MULTIPROC_ENV)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):
            stale.unlink()
        yield
        return
    folder = Path(tempfile.mkdtemp(prefix="cubic-metrics-"))
    os.environ[MULTIPROC_ENV] = str(folder)
    try:
        yield
    finally:
        del os.environ[MULTIPROC_ENV]
        shutil.rmtree(folder, ignore_errors=True)


@app.command("submit")
def submit(file: Path, url: UrlOpt = None, json_out: JsonOpt = False) -> None:
    """Submit a study file to the service (or create it in the local database)."""
    if not url:
        study_create(file, db=None, url=None, json_out=json_out)
        return
    with _client(url) as client:
        study = client.create_study_from_file(file)
    if json_out:
        _print_json(study)
    else:
        console.print(f"submitted study {study['id']}: {study['name']} to {url}")


@app.command("status")
def status(
    study_id: int,
    url: UrlOpt = None,
    follow: Annotated[bool, typer.Option(help="keep watching until the study ends")] = True,
) -> None:
    """A live progress display of a study, with the best value so far."""
    if not url:
        study_show(study_id, db=None, url=None, json_out=False)
        return
    from cubic.progress import summary, watch_study

    with _client(url) as client:
        study = watch_study(client, study_id, console, timeout=None if follow else 0)
        console.print(summary(client, study), markup=False, highlight=False)


def _runner_options(config: Path | None, options: list[str]) -> dict[str, Any]:
    """A runner's keyword options: the YAML file first, then each ``key=value`` (YAML value)."""
    import yaml

    opts = _load_yaml(config, "runner config") if config is not None else {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CubicError(f"--runner-option: expected key=value, got {item!r}")
        try:
            opts[key.strip().replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise CubicError(f"--runner-option {key}: not a YAML value: {exc}") from exc
    return opts


@app.command("worker")
def worker(
    study: Annotated[
        int | None,
        typer.Option(
            envvar="CUBIC_STUDY",
            help="study id (default: every running study in turn, until stopped)",
        ),
    ] = None,
    url: UrlOpt = None,
    runner: Annotated[
        str, typer.Option(help="where trials run: simulated, local, slurm, ray, kubernetes")
    ] = "simulated",
    runner_config: Annotated[
        Path | None, typer.Option(help="YAML mapping of the runner's options")
    ] = None,
    runner_option: Annotated[
        list[str] | None,
        typer.Option("--runner-option", "-o", help="one runner option, key=value (repeatable)"),
    ] = None,
    parallel: Annotated[int, typer.Option(min=1, help="trials in flight")] = 1,
    worker_id: Annotated[str | None, typer.Option(help="stable id (default host-pid)")] = None,
    lease_seconds: Annotated[float, typer.Option(min=1)] = 300.0,
    progress_s: Annotated[
        float,
        typer.Option(
            min=0, help="least seconds between two progress reports of a job (pruning studies)"
        ),
    ] = PROGRESS_REPORT_S,
    max_trials: Annotated[int | None, typer.Option(help="stop after this many")] = None,
    seed: Annotated[int, typer.Option(help="seed of the simulated noise")] = 0,
    time_scale: Annotated[float, typer.Option(help="simulated seconds per step")] = 0.0,
    outage_s: Annotated[
        float,
        typer.Option(
            min=0,
            envvar="CUBIC_OUTAGE_S",
            help="how long to ride through an unreachable service (seconds)",
        ),
    ] = DEFAULT_OUTAGE_S,
    log_level: Annotated[
        str, typer.Option(help="what the worker logs to stderr: debug, info, warning, error")
    ] = "info",
    outbox: Annotated[
        Path | None,
        typer.Option(
            help="where outcomes wait until the service accepts them "
            "(default $CUBIC_OUTBOX or ~/.local/state/cubic/outbox)"
        ),
    ] = None,
) -> None:
    """Lease trials of a study, run them through a runner, and report the results.

    Without --study it serves every running study, oldest first, and waits for new ones
    until stopped (SIGTERM or Ctrl-C): a pool of workers needs no study id.
    """
    from cubic.client import CubicClient
    from cubic.runners import make_runner
    from cubic.worker import StudyLoop, Worker

    if not url:
        raise CubicError("cubic worker needs the service: pass --url or set CUBIC_URL")
    import logging

    level = logging.getLevelName(log_level.upper())
    if not isinstance(level, int):
        raise InvalidInput(
            f"--log-level: expected debug, info, warning or error, got {log_level!r}"
        )
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpcore"):  # one line per request is not a worker's news
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    opts: dict[str, Any] = {}
    if runner == "simulated":
        opts = {"seed": seed, "time_scale": time_scale, "max_workers": parallel}
    opts.update(_runner_options(runner_config, runner_option or []))
    job_runner = make_runner(runner, **opts)
    try:
        with CubicClient(url, outage_s=outage_s) as client:
            options: dict[str, Any] = {
                "worker_id": worker_id,
                "parallel": parallel,
                "lease_seconds": lease_seconds,
                "progress_s": progress_s,
                "outbox": outbox,
            }
            if study is None:
                n = StudyLoop(client, job_runner, **options).run(max_trials=max_trials)
                who = worker_id or "pool"  # each study's worker logs its own id
            else:
                w = Worker(client, study, job_runner, **options)
                n = w.run(max_trials=max_trials)
                who = w.worker_id
    finally:
        job_runner.close()
    console.print(f"worker {who}: reported {n} trials")


@bench_app.callback(invoke_without_command=True)
def bench_search_cmd(
    ctx: typer.Context,
    studies: Annotated[
        list[Path] | None,
        typer.Option("--studies", help="study files or folders (default: search_spaces/bench/)"),
    ] = None,
    strategies: Annotated[
        str, typer.Option(help="comma-separated strategy names")
    ] = "cubic,tpe,random",
    seeds: Annotated[str, typer.Option(help="seeds: 0-4 or 0,2,7")] = "0-4",
    workers: Annotated[int, typer.Option(min=1, help="parallel workers")] = 8,
    budget: Annotated[int, typer.Option(min=1, help="trials per run")] = 64,
    transfer: Annotated[
        bool, typer.Option(help="give strategies the other studies' history")
    ] = False,
    transfer_from: Annotated[
        str, typer.Option(help="how that history was searched: cubic or random")
    ] = "cubic",
    through_service: Annotated[
        bool,
        typer.Option(
            "--through-service",
            help="run each study through a real API process and HTTP workers (SQLite)",
        ),
    ] = False,
    job_clock: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="with --through-service: wall seconds per simulated second of a job "
            "(default 0.01; 0: every job returns at once)",
        ),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results here")] = None,
    plot: Annotated[Path | None, typer.Option(help="convergence plot (PNG)")] = Path(
        "bench_convergence.png"
    ),
) -> None:
    """Search efficiency: strategies x studies x seeds on the simulated cluster."""
    if ctx.invoked_subcommand is not None:
        return
    from cubic.bench.search import bench_search

    bench_search(
        studies=studies or None,
        strategies=strategies,
        seeds=seeds,
        workers=workers,
        budget=budget,
        json_out=json_out,
        plot_out=plot,
        transfer=transfer,
        console=console,
        through_service=through_service,
        transfer_from=transfer_from,
        job_clock=job_clock,
    )


@bench_app.command("pruning")
def bench_pruning_cmd(
    studies: Annotated[
        list[Path] | None,
        typer.Option(
            "--studies",
            help="study files (default: search_spaces/llama3_8b_pruning.study.yaml); their "
            "pruning: section, else its defaults",
        ),
    ] = None,
    strategies: Annotated[
        str | None, typer.Option(help="comma-separated strategy names (default: the study's)")
    ] = None,
    seeds: Annotated[str, typer.Option(help="seeds: 0-4 or 0,2,7")] = "0-4",
    workers: Annotated[int, typer.Option(min=1, help="parallel workers")] = 8,
    budget: Annotated[int, typer.Option(min=1, help="trials per run")] = 64,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results here")] = None,
) -> None:
    """GPU-hours spent and saved by stopping slow trials early: each study, strategy and
    seed searched without and with pruning on the simulated cluster."""
    from cubic.bench.pruning import bench_pruning

    result = bench_pruning(
        studies, strategies, seeds, workers=workers, budget=budget, console=console
    )
    console.print(result.table())
    if json_out is not None:
        json_out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        console.print(f"results: {json_out}")


@bench_app.command("proposal")
def bench_proposal_cmd(
    history: Annotated[int, typer.Option(min=10, help="finished trials in the history")] = 10_000,
    n: Annotated[int, typer.Option(min=1, help="proposals in the round")] = 8,
    study: Annotated[Path | None, typer.Option(help="study file")] = None,
    strategy: Annotated[
        str, typer.Option(help="cubic, or an Optuna-backed one (gp, tpe, qmc, random)")
    ] = "cubic",
) -> None:
    """Time one proposal round (of the cubic strategy: with and without the proxy fit)."""
    from cubic.bench.proposal import bench_proposal, bench_sampler_round

    if strategy != "cubic":
        r = bench_sampler_round(strategy, study, history=history, n=n)
        console.print(
            f"one round of {r['n']} {strategy} proposals with {r['history']:,} finished "
            f"trials: {r['round_s']:.2f} s (median of 3)"
        )
        return
    r = bench_proposal(study, history=history, n=n)
    console.print(
        f"one round of {r['n']} proposals with {r['history']:,} finished trials: "
        f"{r['round_with_fit_s']:.2f} s with the proxy fit, "
        f"{r['round_on_fitted_proxy_s']:.2f} s on a fitted proxy (median of 3); a new "
        f"strategy's first round (every trial seen once): {r['first_round_s']:.2f} s; the "
        f"study's survey of its space (once per study): {r['survey_s']:.2f} s"
    )


@bench_app.command("dashboard")
def bench_dashboard_cmd(
    trials: Annotated[int, typer.Option(min=10, help="trials of the finished study")] = 10_000,
    loads: Annotated[int, typer.Option(min=1, help="page loads, cold and warm each")] = 5,
    study: Annotated[Path | None, typer.Option(help="study file")] = None,
    chromium: Annotated[
        str, typer.Option(envvar="CUBIC_CHROMIUM", help="the Chromium binary Playwright drives")
    ] = "/usr/bin/chromium",
    json_out: Annotated[Path | None, typer.Option("--json", help="write results here")] = None,
) -> None:
    """Time the study page of a finished study of many trials, from navigation start to
    every panel drawn, in headless Chromium against a real API process."""
    from cubic.bench.dashboard import bench_dashboard

    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise CubicError("the playwright package is needed: pip install playwright") from None
    try:
        r = bench_dashboard(trials, loads, study, chromium, say=console.print)
    except FileNotFoundError as exc:
        raise CubicError(str(exc)) from None
    kib = {k: v / 1024 for k, v in r["bytes"].items()}
    console.print(
        f"study page of {r['trials']:,} trials, navigation start to every panel drawn "
        f"(median of {r['loads']} loads): {r['warm_median_ms']:.0f} ms warm (the browser "
        f"cache holds plotly.js), {r['cold_median_ms']:.0f} ms cold (a fresh browser "
        f"context); after plotly.js has run {r['warm_after_plotly_median_ms']:.0f} / "
        f"{r['cold_after_plotly_median_ms']:.0f} ms; "
        f"renderer CPU {r['warm_cpu_median_ms']:.0f} / {r['cold_cpu_median_ms']:.0f} "
        f"ms; history {kib['history']:.0f} KiB, importance {kib['importance']:.0f} KiB; load "
        f"average {r['load_avg_1m']:.1f} on {r['cpus']} CPUs"
    )
    for key in ("warm", "cold"):
        console.print(
            f"{key}: "
            + ", ".join(f"{t:.0f}" for t in r[f"{key}_ms"])
            + " ms; after plotly.js has run "
            + ", ".join(f"{t:.0f}" for t in r[f"{key}_after_plotly_ms"])
            + " ms; renderer CPU "
            + ", ".join(f"{t:.0f}" for t in r[f"{key}_cpu_ms"])
            + " ms"
        )
    if json_out:
        json_out.write_text(json.dumps(r, indent=2))


@bench_app.command("service")
def bench_service_cmd(
    pg: Annotated[
        str | None,
        typer.Option(
            envvar="CUBIC_BENCH_DATABASE_URL",
            help="PostgreSQL URL (a fresh schema is used); default: a cluster of its own",
        ),
    ] = None,
    trials: Annotated[int, typer.Option(min=1)] = 500,
    workers: Annotated[int, typer.Option(min=1, help="worker processes")] = 64,
    api_workers: Annotated[int, typer.Option(min=1, help="uvicorn processes")] = 4,
    strategy: str = "random",
    reference: Annotated[bool, typer.Option(help="also run Optuna RDBStorage")] = True,
    window: Annotated[
        int | None, typer.Option(min=1, help="also report latency per this many trials")
    ] = None,
    job_s: Annotated[
        float,
        typer.Option(min=0, help="seconds each trial's job holds its worker, in both systems"),
    ] = 0.0,
    client_nice: Annotated[
        int,
        typer.Option(
            min=0,
            max=19,
            help="run both systems' clients this many nice levels below the servers, "
            "as if on machines of their own",
        ),
    ] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write results here")] = None,
) -> None:
    """Lease/report latency and trials/s of many workers against several API processes,
    beside Optuna's RDBStorage with the same clients and sampler."""
    from cubic.bench.pgcluster import can_run_postgres
    from cubic.bench.service import bench_service

    if pg is not None and not pg.startswith("postgresql"):
        raise CubicError("--pg must be a PostgreSQL URL (postgresql+psycopg://...)")
    if pg is None and (why := can_run_postgres()):
        raise CubicError(f"cannot start a PostgreSQL cluster here ({why}): pass --pg URL")
    res = bench_service(
        pg,
        trials=trials,
        workers=workers,
        api_workers=api_workers,
        strategy=strategy,
        reference=reference,
        window=window,
        job_s=job_s,
        client_nice=client_nice,
    )
    st = res["settings"]
    table = Table(
        "system",
        "clients",
        "trials",
        "trials/s",
        "lease p50 / p95 / p99 ms",
        "report p50 / p95 / p99 ms",
        "load avg",
        title=f"{trials} trials, strategy {strategy}, jobs of {job_s:g} s, clients at nice "
        f"{client_nice}, PostgreSQL "
        f"({st['database']}, max_connections {st['max_connections']})",
    )
    for key in ("cubic", "optuna"):
        if key in res:
            r = res[key]
            table.add_row(
                r["system"],
                str(r["clients"]),
                str(r["trials"]),
                f"{r['trials_per_s']:.2f}",
                " / ".join(f"{r[f'lease_p{q}_ms']:.1f}" for q in (50, 95, 99)),
                " / ".join(f"{r[f'report_p{q}_ms']:.1f}" for q in (50, 95, 99)),
                f"{r['load_avg_1m']:.1f}",
            )
    console.print(table)
    c = res["cubic"]
    if "lease_server_p50_ms" in c:
        console.print(
            "cubic by the service's clock (Server-Timing), without the workers' wait for a "
            "core: lease "
            + " / ".join(f"{c[f'lease_server_p{q}_ms']:.1f}" for q in (50, 95, 99))
            + " ms, report "
            + " / ".join(f"{c[f'report_server_p{q}_ms']:.1f}" for q in (50, 95, 99))
            + " ms (p50 / p95 / p99)"
        )
    if st.get("optuna_sampler"):
        console.print(
            f"Optuna: {st['optuna_sampler']} for strategy {strategy}; ask and tell latency in "
            "place of lease and report; both with the same number of clients"
        )
    if "windows" in res.get("cubic", {}):
        wt = Table("trials", "trials/s", "lease p50 / p99 ms", "report p50 / p99 ms")
        for w in res["cubic"]["windows"]:
            wt.add_row(
                w["trials"],
                f"{w['trials_per_s']:.2f}",
                f"{w['lease_p50_ms']:.1f} / {w['lease_p99_ms']:.1f}",
                f"{w['report_p50_ms']:.1f} / {w['report_p99_ms']:.1f}",
            )
        console.print(wt)
    rss = res["cubic"].get("api_rss_mib") or []
    if rss:
        console.print(
            "API processes' RSS after the run: " + ", ".join(f"{m:.0f}" for m in rss) + " MiB"
        )
    rss_bg = res["cubic"].get("background_rss_mib") or []
    if rss_bg:
        console.print(
            "their background processes' (proposing, fitting): "
            + ", ".join(f"{m:.0f}" for m in rss_bg)
            + " MiB"
        )
    inv = res["invariants"]
    console.print(
        f"invariants: {inv['trials']} trials, study {inv['study_state']}, "
        f"lost reports {len(inv['lost_reports'])}, leased more than once per "
        f"attempt {len(inv['trials_leased_not_once'])}, unfinished "
        f"{len(inv['unfinished'])}, counts kept right: {inv['counts_match']}"
    )
    if json_out:
        json_out.write_text(json.dumps(res, indent=2))


# demo ---------------------------------------------------------------------------------------
@app.command("demo")
def demo(
    in_process: Annotated[
        bool,
        typer.Option("--in-process", help="run without the service: one process, worker threads"),
    ] = False,
    port: Annotated[int, typer.Option(help="port of the demo service (0: any free)")] = 0,
    study: Annotated[
        Path | None, typer.Option(help="study file (default: the shipped Llama-3 70B study)")
    ] = None,
    trials: Annotated[int | None, typer.Option(help="override the trial budget")] = None,
    workers: Annotated[int, typer.Option(help="simulated workers")] = 4,
    db: Annotated[
        str | None, typer.Option("--db", help="database URL (default: a fresh SQLite file)")
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the search and the noise")] = 0,
) -> None:
    """Run a whole study against the simulated cluster: service, workers, live progress."""
    from cubic.demo import run_demo, run_service_demo

    if in_process:
        run_demo(study, trials=trials, workers=workers, db=db, seed=seed, console=console)
    else:
        run_service_demo(
            study, trials=trials, workers=workers, db=db, seed=seed, port=port, console=console
        )


def main() -> None:
    """Entry point: cubic's own errors become one line on stderr and exit status 2."""
    from cubic.hardware import HardwareError
    from cubic.space import SpaceError
    from cubic.workload import WorkloadError

    try:
        app(standalone_mode=False)
    except (CubicError, SpaceError, WorkloadError, HardwareError) as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:
        # Usage errors (an unknown option or command, a missing argument, a bad value):
        # typer's own exception classes, or click's for older typers. One line, exit 2.
        if callable(getattr(exc, "format_message", None)) and hasattr(exc, "exit_code"):
            err_console.print(
                f"error: {exc.format_message()} (see --help)",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()

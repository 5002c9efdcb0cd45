"""The `cubic` command, run as a user runs it: a real process, a real SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPACES = ROOT / "search_spaces"


def cubic(*args: str, db: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    if db is not None:
        env["CUBIC_DATABASE_URL"] = f"sqlite:///{db}"
    proc = subprocess.run(
        [sys.executable, "-m", "cubic.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"cubic {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def test_spaces_validate_ok_counts_configs() -> None:
    out = cubic(
        "spaces", "validate", str(SPACES / "llm_pretrain.yaml"), "--workload", "llama3_70b"
    ).stdout
    assert "ok, 22 parameters" in out
    assert "valid configurations for llama3_70b" in out
    assert "run on h100_sxm" in out and "fit in memory by the estimate (5% headroom)" in out


def test_spaces_validate_refuses_a_space_where_nothing_fits(tmp_path: Path) -> None:
    wl = tmp_path / "small.yaml"
    wl.write_text("preset: llama3_405b\ncluster: {gpu: a100_40gb, num_gpus: 16}\n")
    proc = cubic(
        "spaces", "validate", str(SPACES / "llm_pretrain.yaml"), "--workload", str(wl),
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "0.0% fit in memory" in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "GiB per GPU" in line and "allow_unfit" in line


def test_spaces_validate_fails_on_a_space_with_no_valid_configuration(tmp_path: Path) -> None:
    never = tmp_path / "never.yaml"
    never.write_text(
        "parameters:\n"
        "  tp: {type: categorical, choices: [3, 5, 7]}\n"
        "  micro_batch: {type: categorical, choices: [1, 2]}\n"
        "constraints:\n"
        "  - {expr: 'num_gpus % tp == 0', message: tp must divide the GPUs}\n"
        "  - 'micro_batch > 1'\n"
    )
    proc = cubic("spaces", "validate", str(never), "--workload", "llama3_8b", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert not proc.stdout.strip()  # no "ok" line before the refusal
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {never}: no valid configuration for this workload;")
    first = "'num_gpus % tp == 0' (tp must divide the GPUs) removes 6 (100%)"
    assert first in line and "'micro_batch > 1' removes 3 (50%)" in line
    assert line.index(first) < line.index("micro_batch >")


def test_spaces_validate_finds_a_shipped_space_by_name_from_any_folder(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cubic.cli", "spaces", "validate", "llm_pretrain.yaml",
         "--workload", "llama3_8b"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, cwd=tmp_path,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("llm_pretrain.yaml: ok, 22 parameters")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("parameters: {tp: {type: int, low: 4, high: 2}}", "parameter 'tp'"),
        ("parameters: {tp: {type: wat}}", "parameter 'tp'"),
        ("parameters: [oops", "bad.yaml"),
        (
            "parameters: {a: {type: bool, when: 'b > 1', default: false},"
            " b: {type: int, low: 1, high: 2}}",
            "parameter 'a'",
        ),
    ],
)
def test_spaces_validate_broken_file_is_one_line_exit_2(
    tmp_path: Path, text: str, needle: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = cubic("spaces", "validate", str(bad), check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert needle in lines[0] and "bad.yaml" in lines[0]


def test_missing_schema_is_refused_with_the_command_to_run(tmp_path: Path) -> None:
    proc = cubic("study", "list", db=tmp_path / "x.db", check=False)
    assert proc.returncode == 2
    assert "cubic db upgrade" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.db").exists()  # no empty database left behind


def test_study_lifecycle_through_the_cli(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    cubic("db", "upgrade", db=db)
    study = tmp_path / "s.yaml"
    study.write_text(
        "name: cli-study\n"
        "workload: {preset: llama3_8b, cluster: {gpu: h100_sxm, num_gpus: 16}}\n"
        f"space: {SPACES / 'llm_pretrain.yaml'}\n"
        "objective: tokens_per_s\n"
        "budget: {max_trials: 6, max_parallel: 2}\n"
        "strategy: {name: random, seed: 1}\n"
    )
    created = json.loads(cubic("study", "create", str(study), "--json", db=db).stdout)
    sid = str(created["id"])
    listed = json.loads(cubic("study", "list", "--json", db=db).stdout)
    assert [s["name"] for s in listed] == ["cli-study"]
    assert "objectives: maximize tokens_per_s" in cubic("study", "show", sid, db=db).stdout
    proc = cubic("best", sid, db=db, check=False)
    assert proc.returncode == 2 and "no complete trial" in proc.stderr
    assert json.loads(cubic("trials", sid, "--json", db=db).stdout) == []


def test_bad_study_spec_names_the_field(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    cubic("db", "upgrade", db=db)
    study = tmp_path / "s.yaml"
    study.write_text(
        "name: x\nworkload: llama3_8b\nspace: {parameters: {a: {type: bool}}}\n"
        "budget: {max_trials: -1}\n"
    )
    proc = cubic("study", "create", str(study), db=db, check=False)
    assert proc.returncode == 2
    assert "budget.max_trials" in proc.stderr and "Traceback" not in proc.stderr


def test_demo_finds_a_faster_config_than_the_baseline(tmp_path: Path) -> None:
    out = cubic(
        "demo",
        "--in-process",
        "--trials",
        "16",
        "--workers",
        "2",
        "--db",
        f"sqlite:///{tmp_path / 'd.db'}",
    ).stdout
    assert "best config" in out
    assert "speed-up" in out
    speedup = float(out.split("speed-up")[1].split("x")[0])
    assert speedup >= 1.0


def test_simulate_one_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("tp: 8\npp: 4\nmicro_batch: 1\nrecompute: full\nsequence_parallel: true\n")
    row = json.loads(
        cubic("simulate", "--workload", "llama3_70b", "--config", str(cfg), "--json").stdout
    )
    assert row["feasible"] and row["throughput_unit"] == "tokens/s"
    assert 0.1 < row["mfu"] < 0.7
    assert row["step_time_s"] == pytest.approx(sum(row["breakdown_s"].values()), rel=0.05)
    table = cubic("simulate", "--workload", "llama3_70b", "--config", str(cfg)).stdout
    assert "MFU" in table and "peak memory" in table


def test_sim_validate_json_reports_error_per_source(tmp_path: Path) -> None:
    res = json.loads(cubic("sim", "validate", "--json").stdout)
    assert set(res) >= {"rows", "by_source", "mape"}
    shipped = (ROOT / "cubic" / "data" / "published_runs.csv").read_text().splitlines()
    assert len(res["rows"]) == len(shipped) - 1  # every row but the header is priced
    assert res["mape"] <= 12.0
    assert all(m <= 20.0 for m in res["by_source"].values())
    # A CSV of the user's own, in the same format, is read too.
    src = (ROOT / "cubic" / "data" / "published_runs.csv").read_text().splitlines()
    mine = tmp_path / "mine.csv"
    mine.write_text("\n".join(src[:3]) + "\n")
    res = json.loads(cubic("sim", "validate", str(mine), "--json").stdout)
    assert [r["id"] for r in res["rows"]] == ["meg21-1.7B", "meg21-3.6B"]


def test_sim_bench_prints_configs_per_second() -> None:
    out = cubic("sim", "bench", "--n", "20000", "--repeat", "1").stdout
    assert "llm" in out and "dlrm" in out and "configurations/s" in out


@pytest.mark.parametrize("study", sorted(SPACES.glob("*.study.yaml")), ids=lambda p: p.name)
def test_shipped_study_files_resolve(study: Path) -> None:
    """Each shipped study resolves and its space holds more than 100 valid configs (counted
    among random draws: a Blackwell space with a format per GEMM site is too large to list)."""
    import numpy as np

    from cubic.strategies.base import config_key
    from cubic.study import load_spec

    spec, base = load_spec(study)
    resolved = spec.resolve(base)
    space, ctx = resolved.space, resolved.context
    configs = space.sample(np.random.default_rng(0), 1000, ctx)
    assert all(not space.validate(c, ctx) for c in configs[:50])
    assert len({config_key(c) for c in configs}) > 100


def test_demo_runs_the_service_and_workers(tmp_path: Path) -> None:
    out = cubic(
        "demo", "--trials", "12", "--workers", "2", "--db", f"sqlite:///{tmp_path / 'svc.db'}"
    ).stdout
    assert "service at http://127.0.0.1:" in out
    assert "speed-up" in out and "API docs: http://127.0.0.1:" in out
    assert "completed" in out


def test_tokens_created_listed_revoked_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator makes a token on the database; a worker uses it over HTTP (CUBIC_TOKEN);
    a revoked token is refused in one line."""
    import json

    from cubic.bench.service import free_port

    db = tmp_path / "t.db"
    cubic("db", "upgrade", db=db)
    made = cubic("token", "create", "--role", "submitter", "--name", "ci", db=db)
    secret = made.stdout.strip()
    assert secret.startswith("cubic_") and "shown once" in made.stderr
    listed = json.loads(cubic("token", "list", "--json", db=db).stdout)
    assert [(t["id"], t["role"], t["revoked_at"]) for t in listed] == [(1, "submitter", None)]
    assert secret not in cubic("token", "list", db=db).stdout
    bad = cubic("token", "create", "--role", "root", db=db, check=False)
    assert (
        bad.returncode == 2
        and "role: expected one of" in bad.stderr
        and "Traceback" not in bad.stderr
    )

    port = free_port()
    env = {**os.environ, "CUBIC_DATABASE_URL": f"sqlite:///{db}"}
    serve = subprocess.Popen(
        [sys.executable, "-m", "cubic.cli", "serve", "--port", str(port), "--auth"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import httpx

        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and serve.poll() is None
            time.sleep(0.2)
        study = tmp_path / "s.yaml"
        study.write_text(
            "name: with-token\nworkload: llama3_8b\nspace: llm_pretrain.yaml\n"
            "objective: tokens_per_s\nbudget: {max_trials: 2, max_parallel: 1}\n"
            "strategy: {name: random, seed: 0}\n"
        )
        (tmp_path / "llm_pretrain.yaml").write_text((SPACES / "llm_pretrain.yaml").read_text())
        monkeypatch.setenv("CUBIC_TOKEN", secret)
        out = cubic("submit", str(study), "--url", url)
        assert "submitted study 1" in out.stdout
        monkeypatch.delenv("CUBIC_TOKEN")
        anonymous = cubic("status", "1", "--url", url, "--no-follow", check=False)
        assert anonymous.returncode == 2 and "API token is needed" in anonymous.stderr
        cubic("token", "revoke", "1", db=db)
        monkeypatch.setenv("CUBIC_TOKEN", secret)
        revoked = cubic("status", "1", "--url", url, "--no-follow", check=False)
        assert revoked.returncode == 2 and "was revoked" in revoked.stderr
        assert "Traceback" not in revoked.stderr
    finally:
        serve.terminate()
        serve.wait(timeout=30)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("best", "1", "--jsn"), "No such option: --jsn"),
        (("bogus",), "No such command 'bogus'"),
        (("best",), "Missing argument"),
        (("worker", "--study", "x"), "Invalid value for '--study'"),
        (("token", "create"), "Missing option '--role'"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: tuple[str, ...], says: str) -> None:
    out = cubic(*args, check=False)
    assert out.returncode == 2
    assert says in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_bad_database_url_or_hardware_file_is_one_line(tmp_path: Path) -> None:
    out = cubic("study", "list", "--db", "mysql://x", check=False)
    assert out.returncode == 2 and "--db: expected a sqlite:// or postgresql:// URL" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    hw = tmp_path / "hw.yaml"
    hw.write_text("gpus: {x: {base: nope}}\n")
    env = {**os.environ, "CUBIC_HARDWARE": str(hw), "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "cubic.cli", "spaces", "validate", str(SPACES / "llm_pretrain.yaml"),
         "--workload", "llama3_8b"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: CUBIC_HARDWARE:") and "unknown gpu 'nope'" in out.stderr
    assert "Traceback" not in out.stderr


def test_best_of_a_two_objective_study_is_its_pareto_front(tmp_path: Path) -> None:
    from cubic.cli import _tuner
    from cubic.sim.job import NoiseModel, run_job

    db = tmp_path / "mo.db"
    cubic("db", "upgrade", db=db)
    study = tmp_path / "s.yaml"
    study.write_text(
        "name: memory-vs-speed\n"
        "workload: {preset: llama3_8b, cluster: {gpu: h100_sxm, num_gpus: 16}}\n"
        f"space: {SPACES / 'llm_pretrain.yaml'}\n"
        "objectives: [{metric: tokens_per_s}, {metric: peak_memory_gb}]\n"
        "budget: {max_trials: 10, max_parallel: 2}\n"
        "strategy: {name: random, seed: 3}\n"
    )
    sid = json.loads(cubic("study", "create", str(study), "--json", db=db).stdout)["id"]
    tuner = _tuner(f"sqlite:///{db}")
    workload = tuner.resolved(sid).workload
    while leased := tuner.lease(sid, "w", 2).trials:
        for t in leased:
            tuner.tell(t.id, t.lease_token, run_job(workload, t.params, noise=NoiseModel.off()))
    expected = tuner.pareto(sid)
    assert expected.points

    out = json.loads(cubic("best", str(sid), "--json", db=db).stdout)
    assert out["objectives"] == [
        {"metric": "tokens_per_s", "direction": "maximize"},
        {"metric": "peak_memory_gb", "direction": "minimize"},
    ]
    assert [p["trial"]["id"] for p in out["points"]] == [p.trial.id for p in expected.points]
    assert out["points"][0]["values"]["tokens_per_s"] == max(p.values[0] for p in expected.points)
    assert out == json.loads(cubic("best", str(sid), "--pareto", "--json", db=db).stdout)

    table = cubic("best", str(sid), db=db).stdout
    assert "Pareto front" in table and "peak_memory_gb (min)" in table
    for p in expected.points:
        assert f"{p.values[0]:,.0f}" in table
    # --no-pareto: the best by the first objective, as for a single-objective study.
    single = json.loads(cubic("best", str(sid), "--no-pareto", "--json", db=db).stdout)
    assert single["trial"]["id"] == expected.points[0].trial.id


def test_bench_dashboard_without_chromium_is_one_line_and_status_2() -> None:
    proc = cubic("bench", "dashboard", "--trials", "10", "--chromium", "/nonexistent", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error:") and "/nonexistent" in proc.stderr
    assert "Traceback" not in proc.stderr


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_command_gives_up_on_an_unreachable_service_in_one_line() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    env = {**os.environ, "CUBIC_OUTAGE_S": "1", "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "cubic.cli", "best", "1", "--url", url],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "gave up after 1 s" in last, out.stderr
    assert "Traceback" not in out.stderr
    env["CUBIC_OUTAGE_S"] = "soon"
    out = subprocess.run(
        [sys.executable, "-m", "cubic.cli", "best", "1", "--url", url],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    says = "error: CUBIC_OUTAGE_S must be a number of seconds >= 0, not 'soon'"
    assert out.stderr.strip() == says


def test_interactive_commands_wait_a_minute_not_a_workers_fifteen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cubic.cli import _client
    from cubic.retry import DEFAULT_OUTAGE_S, INTERACTIVE_OUTAGE_S

    monkeypatch.delenv("CUBIC_OUTAGE_S", raising=False)
    with _client("http://127.0.0.1:1") as client:
        assert client.outage_s == INTERACTIVE_OUTAGE_S < DEFAULT_OUTAGE_S

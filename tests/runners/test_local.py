"""The local runner: real subprocesses, killed whole, and their endings classified."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cubic.bench.service import study_spec
from cubic.client import CubicClient
from cubic.runners import make_runner
from cubic.runners.base import TrialJob
from cubic.runners.local import LocalRunner
from cubic.worker import Worker
from tests.runners.outcomes import wait

PY = shlex.quote(sys.executable)
# A job that reads its config through the SDK and reports a throughput that depends on it.
REPORTING_JOB = (
    f"{PY} -c 'from cubic.job import load_config, report; "
    'c = load_config(); report(tokens_per_s=100.0 * c["micro_batch"])\''
)


def job(command: str, *, timeout_s: float = 60, params: dict[str, Any] | None = None) -> TrialJob:
    return TrialJob(
        trial_id=11,
        study_id=2,
        number=0,
        attempt=1,
        params=params if params is not None else {"micro_batch": 4, "bf16": True},
        timeout_s=timeout_s,
        job={"command": command},
        objectives=("tokens_per_s",),
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): it has exited, its parent has not reaped it yet
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[1].split()[0] != "Z"


def wait_for_file(path: Path, limit: float = 10) -> str:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


@pytest.fixture
def runner(tmp_path: Path) -> LocalRunner:
    return LocalRunner(root=tmp_path / "jobs", kill_grace_s=2)


def test_a_job_gets_its_config_every_way_and_reports_through_the_sdk(runner: LocalRunner) -> None:
    command = (
        REPORTING_JOB + ' && echo "flags: {{ flags }}" && echo "env: $CUBIC_PARAM_MICRO_BATCH"'
        ' && cat "$CUBIC_CONFIG"'
    )
    h = runner.submit(job(command))
    out = wait(runner, h)
    assert out.state == "complete", out
    assert out.metrics == {"tokens_per_s": 400.0}
    log = out.log_tail or ""
    assert "flags: --micro-batch 4 --bf16" in log
    assert "env: 4" in log
    assert '"micro_batch": 4' in log
    assert (runner.job_dir(h.job) / "metrics.json").exists()
    assert runner.describe(h) == {"pid": h.proc.pid, "dir": str(runner.job_dir(h.job))}


def test_a_metrics_line_alone_is_enough(runner: LocalRunner) -> None:
    out = wait(runner, runner.submit(job("echo 'CUBIC_METRICS {\"tokens_per_s\": 7.5}'")))
    assert (out.state, out.metrics) == ("complete", {"tokens_per_s": 7.5})


def test_running_out_of_host_memory_is_infeasible(runner: LocalRunner) -> None:
    command = (
        f"{PY} -c 'import resource; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
        "x = bytearray(2**31)'"
    )
    out = wait(runner, runner.submit(job(command)))
    assert out.state == "infeasible"
    assert "MemoryError" in (out.error or "")


def test_a_process_killed_by_sigkill_is_taken_for_an_oom_kill(runner: LocalRunner) -> None:
    out = wait(runner, runner.submit(job("echo allocating; kill -KILL $$")))
    assert out.state == "infeasible"
    assert "OOM" in (out.error or "")


def test_a_crash_is_failed_with_the_tail_of_its_log(runner: LocalRunner) -> None:
    out = wait(runner, runner.submit(job("echo loading; echo 'bad rank' >&2; exit 3")))
    assert out.state == "failed"
    assert out.error == "job exited with code 3"
    assert "bad rank" in (out.log_tail or "")


def test_timeout_kills_the_whole_process_group(runner: LocalRunner, tmp_path: Path) -> None:
    pids = tmp_path / "child.pid"
    # the child ignores SIGTERM, so only the SIGKILL after the grace period stops it
    command = f"(trap '' TERM; sleep 300) & echo $! > {pids}; wait"
    h = runner.submit(job(command, timeout_s=0.5))
    child = int(wait_for_file(pids))
    out = wait(runner, h, limit=20)
    assert (out.state, out.error) == ("failed", "timeout after 0.5 s")
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_cancel_stops_the_job_and_its_children(runner: LocalRunner, tmp_path: Path) -> None:
    pids = tmp_path / "child.pid"
    h = runner.submit(job(f"sleep 300 & echo $! > {pids}; wait"))
    child = int(wait_for_file(pids))
    started = time.monotonic()
    runner.cancel(h)
    runner.cancel(h)  # idempotent
    assert time.monotonic() - started < 60  # far below the 300 s the job would sleep
    out = wait(runner, h)
    assert (out.state, out.error) == ("failed", "cancelled")
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_a_missing_workdir_fails_at_submit(runner: LocalRunner, tmp_path: Path) -> None:
    bad = TrialJob.sample({}, command="true", workdir=str(tmp_path / "absent"))
    with pytest.raises(OSError):
        runner.submit(bad)


# end to end: a real service, a worker, the local runner -------------------------------------


def local_study(trials: int, command: str) -> dict[str, Any]:
    spec = study_spec(trials, 2, "random")
    spec["job"] = {"command": command, "warmup_steps": 1}
    return spec


def test_a_worker_runs_a_study_through_the_local_runner(url: str, tmp_path: Path) -> None:
    with CubicClient(url) as client:
        sid = client.create_study(local_study(6, REPORTING_JOB))["id"]
        worker = Worker(client, sid, make_runner("local", root=tmp_path), parallel=2, idle_s=0.1)
        assert worker.run() == 6
        trials = client.all_trials(sid)
        assert [t["state"] for t in trials] == ["complete"] * 6
        for t in trials:  # measured by the job from its own config, not simulated
            assert t["metrics"] == {"tokens_per_s": 100.0 * t["params"]["micro_batch"]}
        folders = sorted(p.name for p in (tmp_path / f"study-{sid}").iterdir())
        assert len(folders) == 6


def test_a_study_without_a_job_command_is_refused_before_leasing(url: str) -> None:
    from cubic.errors import InvalidInput

    with CubicClient(url) as client:
        sid = client.create_study(study_spec(2, 1, "random"))["id"]
        worker = Worker(client, sid, make_runner("local"), idle_s=0.1)
        with pytest.raises(InvalidInput, match=r"job\.command"):
            worker.run()
        assert {t["state"] for t in client.all_trials(sid)} <= {"waiting"}


def test_cli_worker_takes_runner_options(url: str, tmp_path: Path) -> None:
    with CubicClient(url) as client:
        sid = client.create_study(local_study(2, REPORTING_JOB))["id"]
    cubic = [sys.executable, "-m", "cubic.cli"]
    args = ["worker", "--url", url, "--study", str(sid), "--runner", "local"]
    done = subprocess.run(
        [*cubic, *args, "-o", f"root={tmp_path / 'cli-jobs'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "reported 2 trials" in done.stdout
    assert (tmp_path / "cli-jobs" / f"study-{sid}").is_dir()
    bad = subprocess.run(
        [*cubic, *args, "-o", "colour=blue"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2
    assert "colour" in bad.stderr and "Traceback" not in bad.stderr
    unknown = subprocess.run(
        [*cubic, *args[:-1], "pbs"], capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2 and "runner 'pbs' is not available" in unknown.stderr


def test_the_runner_reads_the_progress_a_running_job_keeps(tmp_path: Path) -> None:
    """A job timing its steps with the SDK: its progress is seen while it runs."""
    command = (
        f"{PY} -c 'import time; from cubic.job import StepTimer; t = StepTimer(warmup=1)\n"
        "for _ in range(400):\n"
        "    t.record(0.05, tokens=10.0); time.sleep(0.05)'"
    )
    runner = LocalRunner(root=tmp_path, kill_grace_s=5)
    handle = runner.submit(job(command))
    try:
        deadline = time.monotonic() + 60
        while (p := runner.progress(handle)) is None or p.timed_steps < 3:
            assert runner.poll(handle) is None, runner.poll(handle)
            assert time.monotonic() < deadline, "no progress within 60 s"
            time.sleep(0.02)
        assert p.steps == p.timed_steps + 1
        assert p.step_time_s == pytest.approx(0.05) and p.throughput == pytest.approx(200.0)
    finally:
        runner.cancel(handle)
    assert wait(runner, handle).error == "cancelled"

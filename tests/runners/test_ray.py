"""The ``ray`` runner against a real local Ray head (Jobs API, supervisor actors, drivers)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cubic.bench.service import api_server, free_port
from cubic.client import CubicClient
from cubic.errors import InvalidInput
from cubic.runners import make_runner
from cubic.runners.base import TrialJob
from cubic.store.schema import upgrade
from cubic.study import parse_spec
from cubic.worker import Worker
from tests.runners.ray_cluster import RayHead, ray_head, skip_module_without_ray  # noqa: F401

skip_module_without_ray()  # the runner module imports ray

from cubic.runners.ray import RayHandle, RayRunner, job_outcome  # noqa: E402
from tests.runners.outcomes import wait as _run  # noqa: E402

PY = shlex.quote(sys.executable)
# A job that reads its config the three ways and reports metrics with the job SDK. No
# braces: the command is a Jinja2 template.
REPORT = (
    "import json, os, sys; from pathlib import Path; "
    "from cubic.job import load_config, load_document, report; "
    "cfg = load_config(); path = Path(os.environ['CUBIC_CONFIG']); "
    "from_file = json.loads(path.read_text())['params']; "
    "print('CWD=' + os.getcwd()); print('ARGV=' + ' '.join(sys.argv[1:])); "
    "report(tokens_per_s=cfg['micro_batch'] * 100.0, from_file=float(from_file['micro_batch']), "
    "extra=float(os.environ['EXTRA']), trial=float(load_document()['trial']['id']), "
    "trial_env=float(os.environ['CUBIC_TRIAL_ID']))"
)


def _code(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


def _trial(
    command: str,
    *,
    trial_id: int = 1,
    timeout_s: float = 120.0,
    **job: Any,
) -> TrialJob:
    return TrialJob(
        trial_id=trial_id,
        study_id=7,
        number=trial_id,
        attempt=1,
        params={"micro_batch": 4},
        timeout_s=timeout_s,
        job={"command": command, **job},
        objectives=("tokens_per_s",),
    )


def _wait_status(runner: RayRunner, handle: RayHandle, wanted: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        status = str(runner.client.get_job_status(handle.submission_id))
        if status == wanted:
            return
        time.sleep(0.1)
    raise AssertionError(f"ray job {handle.submission_id} never reached {wanted}: {status}")


@pytest.fixture
def runner(ray_head: RayHead, tmp_path: Path) -> Iterator[RayRunner]:  # noqa: F811
    r = RayRunner(
        address=ray_head.address,
        remote_dir=str(tmp_path / "remote"),
        runtime_env={"env_vars": {"EXTRA": "7", "CUBIC_TRIAL_ID": "overridden-by-cubic"}},
        metadata={"team": "perf"},
        poll_interval_s=0.1,
        stop_grace_s=20.0,
    )
    yield r
    r.close()


def test_job_reports_metrics_and_reads_its_config_on_the_node(
    runner: RayRunner, tmp_path: Path
) -> None:
    workdir = tmp_path / "wd"
    workdir.mkdir()
    job = _trial(_code(REPORT) + " {{ flags }}", trial_id=11, workdir=str(workdir))
    handle = runner.submit(job)
    assert handle.submission_id.startswith("cubic-s7-t11-a1-")
    outcome = _run(runner, handle)
    assert outcome.state == "complete", outcome
    # The metrics came back from the log line; the config from the file the wrapper wrote.
    # EXTRA from the runner's runtime_env; its CUBIC_TRIAL_ID lost to cubic's own.
    assert outcome.metrics == {
        "tokens_per_s": 400.0,
        "from_file": 4.0,
        "extra": 7.0,
        "trial": 11,
        "trial_env": 11,
    }
    assert f"CWD={workdir}" in outcome.log_tail
    assert "ARGV=--micro-batch 4" in outcome.log_tail
    written = tmp_path / "remote" / handle.submission_id / "config.json"
    assert json.loads(written.read_text())["params"] == {"micro_batch": 4}
    info = runner.client.get_job_info(handle.submission_id)
    assert info.metadata["cubic_study"] == "7" and info.metadata["cubic_trial"] == "11"
    assert info.metadata["team"] == "perf"
    assert info.driver_exit_code == 0
    assert runner.poll(handle) is outcome  # a finished handle answers without asking Ray


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        # What the raylet prints when Ray's memory monitor kills the job's workers.
        "(raylet) 1 worker(s) were killed due to the node running low on memory.",
    ],
    ids=["cuda", "ray-memory-monitor"],
)
def test_out_of_memory_is_infeasible(runner: RayRunner, line: str) -> None:
    # The job prints the line in two halves: only its output, not its command, holds it whole.
    half = len(line) // 2
    code = f"import sys; print({line[:half]!r} + {line[half:]!r}, file=sys.stderr); sys.exit(1)"
    outcome = _run(runner, runner.submit(_trial(_code(code))))
    assert outcome.state == "infeasible", outcome
    assert outcome.error.startswith("out of memory")
    assert f"\n{line}\n" in outcome.log_tail


def test_non_zero_exit_is_failed_with_the_log_tail(runner: RayRunner) -> None:
    code = (
        "import sys; print('loading', 'shards'); print('bad', '--tp', file=sys.stderr); sys.exit(3)"
    )
    handle = runner.submit(_trial(_code(code)))
    outcome = _run(runner, handle)
    assert outcome.state == "failed"
    assert outcome.error == "job exited with code 3"
    assert "\nloading shards\nbad --tp\n" in outcome.log_tail
    assert "Running entrypoint" not in outcome.log_tail  # Ray's echo of the command is cut
    assert runner.client.get_job_info(handle.submission_id).driver_exit_code == 3


def test_cancel_stops_a_running_job(runner: RayRunner) -> None:
    handle = runner.submit(_trial("echo started; exec sleep 120"))
    _wait_status(runner, handle, "RUNNING")
    started = time.monotonic()
    runner.cancel(handle)
    assert str(runner.client.get_job_status(handle.submission_id)) == "STOPPED"
    assert time.monotonic() - started < 15
    runner.cancel(handle)  # idempotent
    outcome = _run(runner, handle)
    assert (outcome.state, outcome.error) == ("failed", "cancelled")


def test_deadline_stops_a_long_job_as_a_timeout(runner: RayRunner) -> None:
    handle = runner.submit(_trial("echo working; exec sleep 120", timeout_s=2.0))
    started = time.monotonic()
    outcome = _run(runner, handle, limit=30)
    assert (outcome.state, outcome.error) == ("failed", "timeout after 2 s")
    assert 2.0 <= time.monotonic() - started < 20
    assert str(runner.client.get_job_status(handle.submission_id)) == "STOPPED"


def test_dead_supervisor_actor_is_a_lost_job_not_out_of_memory(
    runner: RayRunner, tmp_path: Path
) -> None:
    import psutil  # Ray's bundled copy, importable once ray is

    pidfile = tmp_path / "job.pid"
    handle = runner.submit(_trial(f"echo $$ > {pidfile}; exec sleep 120"))
    _wait_status(runner, handle, "RUNNING")
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    job = psutil.Process(int(pidfile.read_text()))
    supervisor = next(p for p in job.parents() if "JobSupervisor" in p.name())
    try:
        supervisor.send_signal(signal.SIGKILL)  # what a lost node does to it
        outcome = _run(runner, handle, limit=30)
    finally:
        # The driver may outlive its supervisor (Ray cannot stop it any more) or
        # be reaped with it; either way it must not be left running.
        with contextlib.suppress(psutil.NoSuchProcess):
            job.kill()
    assert outcome.state == "failed"
    assert outcome.error.startswith("ray job failed (JOB_SUPERVISOR_ACTOR_DIED)")
    # Ray's message mentions "the OOM killer" as one possible cause; not evidence of OOM.
    assert "OOM killer" in outcome.log_tail


def test_a_job_ray_no_longer_knows_is_lost(runner: RayRunner) -> None:
    job = _trial("true")
    handle = RayHandle(job, "cubic-s7-t1-a1-gone", "true", time.monotonic() + 60)
    outcome = runner.poll(handle)
    assert outcome is not None and outcome.state == "failed"
    assert outcome.error.startswith("ray job cubic-s7-t1-a1-gone no longer exists")


def test_unreachable_address_is_a_clear_error() -> None:
    address = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(InvalidInput, match="cannot reach the Ray Jobs API") as err:
        RayRunner(address=address)
    assert err.value.field == "address" and address in str(err.value)
    assert time.monotonic() - started < 10


def test_address_comes_from_ray_address_unless_given(
    ray_head: RayHead,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", ray_head.address)
    assert RayRunner().address == ray_head.address
    # Ray itself would let the variable override an explicit address; cubic does not.
    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{free_port()}")
    assert RayRunner(address=ray_head.address).address == ray_head.address
    assert os.environ["RAY_ADDRESS"] != ray_head.address  # restored after connecting


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"runtime_env": ["pip"]}, "runtime_env"),
        ({"runtime_env": {"env_vars": "A=1"}}, "runtime_env.env_vars"),
        ({"entrypoint_num_gpus": -1}, "entrypoint_num_gpus"),
        ({"entrypoint_num_cpus": True}, "entrypoint_num_cpus"),
        ({"entrypoint_resources": {"TPU": "many"}}, "entrypoint_resources.TPU"),
        ({"address": 8265}, "address"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        RayRunner(**options)
    assert err.value.field == field


# Ray's own words for how a job ended, as its Jobs API reports them (Ray 2.60).
SUPERVISOR_DIED = (
    "Job supervisor actor died: The actor died unexpectedly before finishing this task.\n"
    "\tclass_name: JobSupervisor\nThe actor is dead because its worker process has died. "
    "Worker exit type: {kind} Worker exit detail: {detail}"
)


@pytest.mark.parametrize(
    ("status", "kwargs", "state", "error"),
    [
        (
            "FAILED",
            {
                "error_type": "JOB_SUPERVISOR_ACTOR_DIED",
                "message": SUPERVISOR_DIED.format(
                    kind="NODE_OUT_OF_MEMORY",
                    detail="Task was killed due to the node running low on memory.",
                ),
            },
            "infeasible",
            "out of memory",
        ),
        (
            "FAILED",
            {
                "error_type": "JOB_SUPERVISOR_ACTOR_DIED",
                "message": "Job supervisor actor died: The actor died because its node has "
                "died. Node Id: 1f2e",
            },
            "failed",
            "ray job failed (JOB_SUPERVISOR_ACTOR_DIED): Job supervisor actor died",
        ),
        (
            "FAILED",
            {
                "error_type": "RUNTIME_ENV_SETUP_FAILURE",
                "message": "runtime_env setup failed: No matching distribution for nosuchpkg",
            },
            "failed",
            "ray job failed (RUNTIME_ENV_SETUP_FAILURE): runtime_env setup failed",
        ),
        (
            "FAILED",
            {
                "exit_code": 1,
                "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
                "log": "ray.exceptions.NodeDiedError: the node running task f was lost\n",
            },
            "failed",
            "ray node lost: ray.exceptions.NodeDiedError",
        ),
        ("STOPPED", {}, "failed", "ray job was stopped outside cubic"),
        ("SUCCEEDED", {"exit_code": 0, "log": "CUBIC_METRICS {}\n"}, "failed", "job exited 0"),
    ],
    ids=["memory-monitor", "node-died", "runtime-env", "driver-saw-node-die", "stopped", "empty"],
)
def test_how_ray_reports_an_end_maps_to_an_outcome(
    status: str, kwargs: dict[str, Any], state: str, error: str
) -> None:
    args = {"exit_code": None, "error_type": None, "message": "", "log": "", **kwargs}
    outcome = job_outcome(status, objectives=("tokens_per_s",), **args)
    assert outcome.state == state
    assert outcome.error.startswith(error), outcome.error


def test_worker_runs_a_study_through_the_ray_runner(
    ray_head: RayHead,  # noqa: F811
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    code = (
        "import sys; from cubic.job import load_config, report; x = load_config()['x']; "
        "x > 4 and sys.exit(print('CUDA out of memory') or 1); "
        "report(tokens_per_s=100.0 + 10 * x)"
    )
    spec = parse_spec(
        {
            "name": "ray-e2e",
            "workload": {"preset": "llama3_8b"},
            "space": {"name": "tiny", "parameters": {"x": {"type": "int", "low": 0, "high": 9}}},
            "objective": "tokens_per_s",
            "budget": {"max_trials": 4, "max_parallel": 2},
            "strategy": {"name": "random", "seed": 3},
            "trial_timeout_s": 120,
            "job": {"command": _code(code)},
        }
    )
    with api_server(db, 1) as url, CubicClient(url) as client:
        sid = client.create_study(spec.resolve().spec.model_dump(mode="json"))["id"]
        runner = make_runner(
            "ray",
            address=ray_head.address,
            poll_interval_s=0.1,
            remote_dir=str(tmp_path / "remote"),
        )
        worker = Worker(CubicClient(url), sid, runner, parallel=2, lease_seconds=60, idle_s=0.1)
        thread = threading.Thread(target=worker.run)
        thread.start()
        thread.join(timeout=90)
        assert not thread.is_alive(), "the worker did not finish the study"
        trials = client.all_trials(sid)
        assert client.get_study(sid)["state"] == "completed"
    assert len(trials) == 4 and worker.reported == 4
    assert {t["state"] for t in trials} == {"complete", "infeasible"}  # seed 3: x = 1, 2, 4, 6
    for t in trials:
        x = t["params"]["x"]
        if x > 4:
            assert t["state"] == "infeasible"
        else:
            assert t["state"] == "complete", t
            assert t["metrics"]["tokens_per_s"] == 100.0 + 10 * x

"""The slurm runner: the state mapping and script, then real jobs on a real Slurm cluster."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cubic.errors import InvalidInput
from cubic.outcome import Outcome
from cubic.runners import make_runner
from cubic.runners.base import TrialJob
from cubic.runners.contract import prepare
from cubic.runners.slurm import (
    SlurmError,
    SlurmRunner,
    parse_exit_code,
    slurm_outcome,
    slurm_resources,
    slurm_time,
)
from tests.runners.outcomes import wait
from tests.runners.slurm_cluster import SlurmCluster

CPU = {"gpus_per_node": 0, "nodes": 1, "cpus_per_task": 1}
GPU_WORKLOAD = {"name": "w", "cluster": {"gpu": "h100_sxm", "num_gpus": 16, "gpus_per_node": 8}}
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
METRICS = {"tokens_per_s": 1234.5, "throughput": 1234.5}


def py(code: str) -> str:
    """A shell command that runs ``code`` with this venv's Python (the job imports cubic)."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def trial_job(command: str, *, trial_id: int = 1, timeout_s: float = 120.0, **job: Any) -> TrialJob:
    return TrialJob(
        trial_id=trial_id,
        study_id=5,
        number=trial_id,
        attempt=0,
        params={"micro_batch": 4, "zero": "z1"},
        workload=GPU_WORKLOAD,
        timeout_s=timeout_s,
        job={"command": command, "resources": CPU, **job},
        objectives=("tokens_per_s",),
    )


# -- pure parts: state mapping, time limit, resources, the script ------------------------


@pytest.mark.parametrize(
    ("state", "rc", "log", "expect", "error"),
    [
        ("COMPLETED", 0, 'CUBIC_METRICS {"tokens_per_s": 1.0}', "complete", None),
        ("COMPLETED", 0, "no metrics here", "failed", "no metrics"),
        ("FAILED", 3, "Traceback: boom", "failed", "exited with code 3"),
        ("FAILED", 1, OOM, "infeasible", "out of memory"),
        ("FAILED", 0, "", "failed", "exited with code 1"),
        ("OUT_OF_MEMORY", 0, "", "infeasible", "OOM kill"),
        ("TIMEOUT", 143, "", "failed", "timeout after 60 s"),
        ("NODE_FAIL", None, "", "failed", "NODE_FAIL"),
        ("PREEMPTED", None, "", "failed", "PREEMPTED"),
        ("BOOT_FAIL", None, "", "failed", "BOOT_FAIL"),
        ("DEADLINE", None, "", "failed", "DEADLINE"),
        ("CANCELLED by 1000", 143, "", "failed", "cancelled outside cubic"),
        ("CANCELLED+", 143, "", "failed", "cancelled outside cubic"),
        ("SPECIAL_EXIT", 1, "", "failed", "SPECIAL_EXIT"),
        (None, None, "", "failed", "lost track"),
    ],
)
def test_every_slurm_state_maps_to_an_outcome(
    state: str | None, rc: int | None, log: str, expect: str, error: str | None
) -> None:
    from cubic.runners.contract import parse_metrics

    out = slurm_outcome(
        state, rc, log, parse_metrics(log), objectives=("tokens_per_s",), timeout_s=60
    )
    assert out.state == expect
    if error is None:
        assert out.error is None and out.metrics == {"tokens_per_s": 1.0}
    else:
        assert error in out.error


def test_what_the_runner_did_explains_a_cancelled_job_but_not_a_finished_one() -> None:
    def end(state: str | None, **ours: bool) -> Outcome:
        log = 'CUBIC_METRICS {"tokens_per_s": 2.0}'
        return slurm_outcome(
            state, 0, log, {"tokens_per_s": 2.0}, objectives=("tokens_per_s",), timeout_s=30, **ours
        )

    assert end("CANCELLED", cancelled_by_runner=True).error == "cancelled by cubic (scancel)"
    assert end(None, cancelled_by_runner=True).error == "cancelled by cubic (scancel)"
    assert end("CANCELLED", timed_out_by_runner=True).error == "timeout after 30 s"
    assert end("COMPLETED", cancelled_by_runner=True).state == "complete"  # it won the race


def test_exit_codes_and_time_limits_in_slurm_format() -> None:
    assert parse_exit_code("3:0") == 3
    assert parse_exit_code("0:15") == 128 + 15
    assert parse_exit_code("0:0") == 0
    assert parse_exit_code("") is None
    assert slurm_time(1) == "00:01:00"
    assert slurm_time(60) == "00:01:00"
    assert slurm_time(61) == "00:02:00"
    assert slurm_time(3600) == "01:00:00"
    assert slurm_time(2 * 86400 + 90) == "2-00:02:00"


def test_resources_come_from_the_cluster_unless_the_study_overrides_them() -> None:
    gpu = slurm_resources(GPU_WORKLOAD, {})
    assert gpu == {
        "nodes": 2,
        "gpus_per_node": 8,
        "ntasks_per_node": 1,
        "cpus_per_task": None,
        "mem": None,
    }
    assert slurm_resources(GPU_WORKLOAD, {"gpus_per_node": 4})["nodes"] == 4
    small = {"cluster": {"num_gpus": 2, "gpus_per_node": 8}}
    assert slurm_resources(small, {}) == {**gpu, "nodes": 1, "gpus_per_node": 2}
    cpu = slurm_resources(GPU_WORKLOAD, {**CPU, "cpus_per_task": 2, "memory_gb": 1.5})
    assert cpu == {
        "nodes": 1,
        "gpus_per_node": 0,
        "ntasks_per_node": 1,
        "cpus_per_task": 2,
        "mem": "1536M",
    }
    with pytest.raises(InvalidInput) as err:
        slurm_resources(GPU_WORKLOAD, {"nodes": 0})
    assert err.value.field == "job.resources.nodes"
    with pytest.raises(InvalidInput) as err:
        slurm_resources(GPU_WORKLOAD, {"mem": [1]})
    assert err.value.field == "job.resources.mem"


def _script(runner: SlurmRunner, job: TrialJob, tmp_path: Path) -> str:
    prepared = prepare(job, tmp_path / "files")
    return runner.render_script(runner.script_variables(job, prepared, tmp_path / "files"))


def test_builtin_script_asks_for_gpus_only_when_there_are_some(tmp_path: Path) -> None:
    runner = SlurmRunner(root=tmp_path, qos="high", extra_args=["#SBATCH --exclusive", "-C a100"])
    job = trial_job("train {{ flags }}", env={"NOTE": "it's $HOME"}, resources={}, timeout_s=90)
    gpu = _script(runner, job, tmp_path)
    assert "#SBATCH --nodes=2\n" in gpu and "#SBATCH --gpus-per-node=8\n" in gpu
    assert "#SBATCH --time=00:02:00\n" in gpu and "#SBATCH --job-name=cubic-5-1\n" in gpu
    assert "#SBATCH --qos=high\n" in gpu and "--partition" not in gpu and "--account" not in gpu
    assert "#SBATCH --exclusive\n" in gpu and "#SBATCH -C a100\n" in gpu
    assert "export NOTE='it'\"'\"'s $HOME'\n" in gpu  # quoted: the shell expands nothing
    assert gpu.rstrip().endswith("train --micro-batch 4 --zero z1")
    cpu = _script(runner, trial_job("train", resources=CPU), tmp_path)
    assert "--gpus-per-node" not in cpu and "--gres" not in cpu
    assert "#SBATCH --nodes=1\n" in cpu and "#SBATCH --cpus-per-task=1\n" in cpu
    # The exported environment reaches the job verbatim.
    out = subprocess.run(
        [
            "bash",
            "-c",
            "\n".join(li for li in gpu.splitlines() if li.startswith("export "))
            + '\nprintf %s "$NOTE"',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "it's $HOME"


def test_a_template_with_an_unknown_variable_is_invalid_input_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sbatch.j2"
    bad.write_text("#!/bin/bash\n#SBATCH --reservation={{ reservation }}\n{{ command }}\n")
    runner = SlurmRunner(root=tmp_path, template=bad)
    with pytest.raises(InvalidInput, match=r"bad\.sbatch\.j2.*reservation") as err:
        _script(runner, trial_job("true"), tmp_path)
    assert err.value.field == "template"
    with pytest.raises(InvalidInput, match=r"bad\.sbatch\.j2") as err:
        runner.check({"name": "s", "workload": GPU_WORKLOAD, "job": {"command": "true"}})
    assert err.value.field == "template"
    with pytest.raises(InvalidInput) as err:
        SlurmRunner(template=tmp_path / "missing.j2")
    assert err.value.field == "template"
    (tmp_path / "broken.j2").write_text("{% if %}")
    with pytest.raises(InvalidInput, match=r"broken\.j2"):
        SlurmRunner(template=tmp_path / "broken.j2")
    bad_nodes = {"command": "true", "resources": {"nodes": 0}}
    with pytest.raises(InvalidInput) as err:
        SlurmRunner(root=tmp_path).check({"name": "s", "workload": {}, "job": bad_nodes})
    assert err.value.field == "job.resources.nodes"
    with pytest.raises(InvalidInput) as err:
        make_runner("slurm", extra_args="--exclusive")
    assert err.value.field == "extra_args"


# -- a real cluster ------------------------------------------------------------------------


@pytest.fixture
def runner(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[SlurmRunner]:
    r = SlurmRunner(root=tmp_path / "jobs", poll_interval_s=0.3)
    yield r
    r.close()


def squeue_state(job_id: str) -> str:
    res = subprocess.run(
        ["squeue", "--noheader", "--format=%T", f"--jobs={job_id}"], capture_output=True, text=True
    )
    return res.stdout.strip()


def scontrol_field(job_id: str, name: str) -> str:
    res = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True
    )
    fields = dict(p.split("=", 1) for p in res.stdout.split() if "=" in p)
    return fields.get(name, "")


def wait_running(job_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while squeue_state(job_id) != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} never started"
        time.sleep(0.2)


def test_a_job_that_reports_metrics_completes_with_them(runner: SlurmRunner) -> None:
    code = (
        "import os; from cubic.job import load_config, report; c = load_config(); "
        "assert c == {'micro_batch': 4, 'zero': 'z1'}, c; "
        "assert os.environ['CUBIC_PARAM_MICRO_BATCH'] == '4'; "
        f"assert os.getcwd() == {os.getcwd()!r}, os.getcwd(); "  # the worker's, by default
        f"report({METRICS!r})"
    )
    h = runner.submit(trial_job(py(code)))
    assert h.job_id.isdigit()
    out = wait(runner, h)
    assert out.state == "complete", out
    assert out.metrics == METRICS
    assert scontrol_field(h.job_id, "JobName") == "cubic-5-1"
    assert scontrol_field(h.job_id, "NumCPUs") == "1"
    assert (h.job_dir / "job.sbatch").is_file() and (h.job_dir / "config.json").is_file()
    assert runner.poll(h) is out  # the outcome is final


def test_a_cuda_out_of_memory_error_is_infeasible(runner: SlurmRunner) -> None:
    code = f"import sys; print({OOM!r}, file=sys.stderr); sys.exit(1)"
    out = wait(runner, runner.submit(trial_job(py(code))))
    assert out.state == "infeasible"
    assert "CUDA out of memory" in out.error


def test_a_failing_job_is_failed_with_its_log_tail(runner: SlurmRunner) -> None:
    out = wait(runner, runner.submit(trial_job("echo loading shards; echo bad rank >&2; exit 3")))
    assert out.state == "failed"
    assert out.error == "job exited with code 3"
    assert "loading shards" in out.log_tail and "bad rank" in out.log_tail


def test_cancel_stops_a_running_job(runner: SlurmRunner) -> None:
    h = runner.submit(trial_job("echo started; sleep 120"))
    wait_running(h.job_id)
    started = time.monotonic()
    runner.cancel(h)
    runner.cancel(h)  # idempotent
    out = wait(runner, h, limit=30)
    assert time.monotonic() - started < 30
    assert out.state == "failed" and out.error == "cancelled by cubic (scancel)"
    assert squeue_state(h.job_id) == ""
    assert scontrol_field(h.job_id, "JobState") == "CANCELLED"
    runner.cancel(h)  # after the end too


def test_a_job_cancelled_outside_cubic_says_so(runner: SlurmRunner) -> None:
    h = runner.submit(trial_job("sleep 120"))
    wait_running(h.job_id)
    subprocess.run(["scancel", h.job_id], check=True)
    out = wait(runner, h, limit=30)
    assert out.state == "failed" and out.error.startswith("cancelled outside cubic")


def test_the_runner_deadline_cancels_a_job_past_its_time(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    runner = SlurmRunner(root=tmp_path, poll_interval_s=0.3, deadline_slack_s=1.0)
    started = time.monotonic()
    h = runner.submit(trial_job("echo working; sleep 120", timeout_s=2.0))
    out = wait(runner, h, limit=30)
    assert out.state == "failed" and out.error == "timeout after 2 s"
    assert 3.0 <= time.monotonic() - started < 20
    assert "working" in out.log_tail
    assert squeue_state(h.job_id) == ""


@pytest.mark.slow
def test_slurms_own_time_limit_ends_as_a_timeout(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # --time=00:01:00; slurmctld enforces limits about every 30 s, so this takes 60-90 s.
    runner = SlurmRunner(root=tmp_path, poll_interval_s=1.0, deadline_slack_s=300.0)
    h = runner.submit(trial_job("sleep 600", timeout_s=60.0))
    out = wait(runner, h, limit=180)
    assert scontrol_field(h.job_id, "JobState") == "TIMEOUT"
    assert out.state == "failed" and out.error == "timeout after 60 s"


def test_a_user_template_gets_partition_and_account(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    template = tmp_path / "site.sbatch.j2"
    template.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name={{ job_name }}\n"
        "#SBATCH --partition={{ partition }}\n"
        "#SBATCH --account={{ account }}\n"
        "#SBATCH --output={{ output }}\n"
        "#SBATCH --time={{ time }}\n"
        "#SBATCH --nodes={{ nodes }} --cpus-per-task={{ cpus_per_task }}\n"
        "{{ exports | join('\\n') }}\n"
        "cd {{ workdir | shell_quote }}\n"
        'echo "site template for trial {{ trial.number }}"\n'
        "{{ command }}\n"
    )
    runner = SlurmRunner(
        root=tmp_path / "jobs",
        template=str(template),
        partition="debug",
        account="ml-research",
        poll_interval_s=0.3,
    )
    h = runner.submit(trial_job(py(f"from cubic.job import report; report({METRICS!r})")))
    script = h.script_path.read_text()
    assert "#SBATCH --partition=debug\n#SBATCH --account=ml-research\n" in script
    assert scontrol_field(h.job_id, "Partition") == "debug"
    assert scontrol_field(h.job_id, "Account") == "ml-research"
    out = wait(runner, h)
    assert out.state == "complete" and out.metrics == METRICS
    assert "site template for trial 1" in out.log_tail


def test_a_refused_sbatch_raises_with_its_message(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    runner = SlurmRunner(root=tmp_path, partition="no-such-partition")
    with pytest.raises(SlurmError, match=r"(?i)invalid partition"):
        runner.submit(trial_job("true"))


def test_one_squeue_call_serves_every_job_per_interval(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    calls = tmp_path / "squeue.calls"
    counting = tmp_path / "squeue"
    real = subprocess.run(["which", "squeue"], capture_output=True, text=True).stdout.strip()
    counting.write_text(f'#!/bin/sh\necho x >> "{calls}"\nexec {real} "$@"\n')
    counting.chmod(counting.stat().st_mode | stat.S_IEXEC)
    runner = SlurmRunner(root=tmp_path / "jobs", poll_interval_s=1.0, squeue=str(counting))
    handles = [runner.submit(trial_job("sleep 2", trial_id=i)) for i in range(4)]
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    while len(outcomes) < len(handles):
        assert time.monotonic() - started < 60
        for h in handles:
            out = runner.poll(h)
            if out is not None:
                outcomes[h.job_id] = out
        time.sleep(0.01)  # a tight loop: hundreds of polls
    elapsed = time.monotonic() - started
    assert {o.error for o in outcomes.values()} == {
        "job exited 0 but reported no metrics (write CUBIC_METRICS or print a "
        "'CUBIC_METRICS {...}' line)"
    }
    assert len(calls.read_text().split()) <= elapsed / 1.0 + 2


def test_a_worker_runs_a_study_through_slurm(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    from cubic.bench.service import api_server, study_spec
    from cubic.client import CubicClient
    from cubic.store.schema import upgrade
    from cubic.worker import Worker

    code = (
        "from cubic.job import load_document, report; n = load_document()['trial']['number']; "
        "report(tokens_per_s=100.0 + n, throughput=100.0 + n)"
    )
    spec = study_spec(4, 2, "random")
    spec["job"] = {"command": py(code), "resources": CPU}
    spec["trial_timeout_s"] = 120
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    runner = make_runner("slurm", root=str(tmp_path / "jobs"), poll_interval_s=0.3)
    with api_server(db, 1) as url, CubicClient(url) as client, CubicClient(url) as own:
        sid = client.create_study(spec)["id"]
        worker = Worker(own, sid, runner, worker_id="slurm-w", parallel=2, idle_s=0.1)
        thread = threading.Thread(target=worker.run)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert client.get_study(sid)["state"] == "completed"
        trials = client.all_trials(sid)
    assert len(trials) == 4 and worker.reported == 4
    for t in trials:
        assert t["state"] == "complete", t
        assert t["metrics"]["tokens_per_s"] == 100.0 + t["number"]
    scripts = sorted((tmp_path / "jobs").glob("study-*/trial-*/job.sbatch"))
    assert len(scripts) == 4
    assert all("--gpus-per-node" not in s.read_text() for s in scripts)
    assert os.environ["SLURM_CONF"] == str(slurm_cluster.conf)


@pytest.mark.slow
def test_the_torch_ddp_example_tunes_through_slurm(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example study as a user submits it, on a CPU partition: real torchrun jobs."""
    import importlib.util

    from cubic.bench.service import api_server
    from cubic.client import CubicClient
    from cubic.store.schema import upgrade
    from cubic.study import load_spec
    from cubic.worker import Worker
    from tests.requirements import need

    need("torch", importlib.util.find_spec("torch") is not None, "torch is not importable")
    repo = Path(__file__).resolve().parents[2]
    spec, base = load_spec(repo / "examples" / "torch_ddp" / "study.yaml")
    resolved = spec.resolve(base).spec
    assert spec.job is not None
    # A CPU cluster: no GPUs to ask Slurm for, the cores of this node for the ranks.
    job = spec.job.model_copy(
        update={"workdir": str(repo), "resources": {**CPU, "cpus_per_task": os.cpu_count() or 1}}
    )
    doc = spec.model_copy(
        update={"workload": resolved.workload, "space": resolved.space, "job": job}
    ).model_dump(mode="json")
    doc["budget"] = {"max_trials": 3, "max_parallel": 1}
    # Not a test of deadlines: on a loaded machine torchrun's start alone can take a minute, and
    # a trial killed at the example's 120 s would be retried as a fourth.
    doc["trial_timeout_s"] = 900
    # The job's ``python`` is this venv's: sbatch hands the worker's environment to the job.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    db = f"sqlite:///{tmp_path / 'cubic.db'}"
    upgrade(db)
    runner = make_runner("slurm", root=str(tmp_path / "jobs"), poll_interval_s=0.5)
    with api_server(db, 1) as url, CubicClient(url) as client, CubicClient(url) as own:
        sid = client.create_study(doc)["id"]
        worker = Worker(own, sid, runner, worker_id="slurm-cpu", idle_s=0.2)
        worker.run()
        assert client.get_study(sid)["state"] == "completed"
        trials = client.all_trials(sid)
        best = client.best(sid)
    problems = [(t["params"], t["error"], (t["log_tail"] or "")[-2000:]) for t in trials]
    assert len(trials) == 3 and all(t["state"] == "complete" for t in trials), problems
    for t in trials:
        assert t["metrics"]["tokens_per_s"] > 0
        assert t["metrics"]["timed_steps"] == 6  # --steps 8 less the study's 2 warm-up steps
        assert t["metrics"]["world_size"] == t["params"]["nproc_per_node"]
    assert best["value"] == max(t["metrics"]["tokens_per_s"] for t in trials)

"""The job contract: what a job receives and how its end becomes an outcome."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cubic.errors import InvalidInput
from cubic.runners.base import TrialJob
from cubic.runners.contract import (
    classify,
    param_env,
    parse_metrics,
    prepare,
    remote_command,
    render_flags,
)
from cubic.study import parse_spec

PARAMS = {"micro_batch": 4, "bf16": True, "activation_checkpointing": False, "zero": "z1"}


def trial_job(command: str = "train {{ flags }}", **job: object) -> TrialJob:
    return TrialJob(
        trial_id=7,
        study_id=3,
        number=2,
        attempt=1,
        params=PARAMS,
        workload={"name": "w"},
        timeout_s=60,
        job={"command": command, **job},
        objectives=("tokens_per_s",),
    )


def test_flags_render_argparse_style() -> None:
    assert render_flags(PARAMS) == [
        "--micro-batch",
        "4",
        "--bf16",
        "--no-activation-checkpointing",
        "--zero",
        "z1",
    ]


def test_every_knob_has_an_environment_variable() -> None:
    assert param_env(PARAMS) == {
        "CUBIC_PARAM_MICRO_BATCH": "4",
        "CUBIC_PARAM_BF16": "1",
        "CUBIC_PARAM_ACTIVATION_CHECKPOINTING": "0",
        "CUBIC_PARAM_ZERO": "z1",
    }


def test_prepare_writes_the_config_and_renders_the_command(tmp_path: Path) -> None:
    job = trial_job(
        "torchrun --nproc {{ micro_batch }} t.py {{ flags }} --trial {{ trial.id }}",
        env={"OUT": "{{ metrics_path }}", "MB": "{{ micro_batch * 2 }}"},
        warmup_steps=3,
    )
    p = prepare(job, tmp_path)
    assert shlex.split(p.command) == [
        "torchrun",
        "--nproc",
        "4",
        "t.py",
        *render_flags(PARAMS),
        "--trial",
        "7",
    ]
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["params"] == PARAMS
    assert doc["trial"] == {"id": 7, "study_id": 3, "number": 2, "attempt": 1}
    assert doc["warmup_steps"] == 3
    assert p.env["CUBIC_CONFIG"] == str(tmp_path / "config.json")
    assert json.loads(p.env["CUBIC_CONFIG_JSON"]) == doc
    assert p.env["OUT"] == p.metrics_path == str(tmp_path / "metrics.json")
    assert p.env["MB"] == "8"
    assert p.env["CUBIC_WARMUP_STEPS"] == "3"


def test_remote_jobs_see_paths_on_their_node(tmp_path: Path) -> None:
    p = prepare(trial_job(), None, remote_dir="/scratch/t7")
    assert p.config_path == "/scratch/t7/config.json"
    assert not list(tmp_path.iterdir())
    assert remote_command(p).endswith("&& train " + shlex.join(render_flags(PARAMS)))


def test_an_unknown_template_name_is_an_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"job\.command.*nproc_per_node") as exc:
        prepare(trial_job("torchrun --nproc {{ nproc_per_node }}"), tmp_path)
    assert exc.value.field == "job.command"


def test_a_study_without_a_command_cannot_run_on_a_real_runner(tmp_path: Path) -> None:
    job = TrialJob(trial_id=1, study_id=1, number=0, attempt=1, params={})
    with pytest.raises(InvalidInput, match=r"no job\.command"):
        prepare(job, tmp_path)


def test_a_broken_template_is_refused_when_the_study_is_parsed() -> None:
    with pytest.raises(InvalidInput, match=r"job\.command") as exc:
        parse_spec({"name": "x", "workload": "w", "space": "s", "job": {"command": "a {{ b"}})
    assert exc.value.field == "job.command"


def test_metrics_file_wins_over_the_log_and_the_last_line_wins(tmp_path: Path) -> None:
    log = 'step 1\nCUBIC_METRICS {"tokens_per_s": 1}\nCUBIC_METRICS {"tokens_per_s": 2}\n'
    assert parse_metrics(log) == {"tokens_per_s": 2}
    f = tmp_path / "m.json"
    assert parse_metrics(log, str(f)) == {"tokens_per_s": 2}  # no file yet: the log
    f.write_text('{"tokens_per_s": 3}')
    assert parse_metrics(log, str(f)) == {"tokens_per_s": 3}
    assert parse_metrics("CUBIC_METRICS {not json}\n") is None


@pytest.mark.parametrize(
    "message",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: HIP out of memory. Tried to allocate 512.00 MiB",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=12.batch",
    ],
)
def test_out_of_memory_is_infeasible(message: str) -> None:
    out = classify(1, f"step 3\n{message}\nTraceback ...\n", None)
    assert out.state == "infeasible"
    assert message[:40] in (out.error or "")


def test_outcomes_of_other_endings() -> None:
    ok = classify(0, "", {"tokens_per_s": 5.0}, objectives=["tokens_per_s"])
    assert (ok.state, ok.metrics) == ("complete", {"tokens_per_s": 5.0})
    crash = classify(3, "x" * 20_000 + "Segmentation fault", None)
    assert crash.state == "failed" and "code 3" in (crash.error or "")
    assert crash.log_tail is not None and crash.log_tail.endswith("Segmentation fault")
    assert len(crash.log_tail) <= 8192
    assert classify(0, "", None).state == "failed"  # exited cleanly but said nothing
    missing = classify(0, "", {"step_time_s": 1.0}, objectives=["tokens_per_s"])
    assert missing.state == "failed" and "tokens_per_s" in (missing.error or "")
    assert classify(None, "", None, oom_killed=True).state == "infeasible"
    timeout = classify(None, "out of memory", None, timed_out=True, timeout_s=30)
    assert (timeout.state, timeout.error) == ("failed", "timeout after 30 s")
    lost = classify(1, "", None, lost="NODE_FAIL: the node stopped responding")
    assert lost.state == "failed" and "NODE_FAIL" in (lost.error or "")
    assert classify(0, "", {"tokens_per_s": 1.0}, cancelled=True).state == "failed"

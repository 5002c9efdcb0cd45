"""The job-side SDK: config in, warm-up-free throughput and metrics out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cubic.job import StepTimer, load_config, load_document, report


def test_outside_a_runner_the_config_is_empty_and_report_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("CUBIC_CONFIG", "CUBIC_CONFIG_JSON", "CUBIC_METRICS"):
        monkeypatch.delenv(var, raising=False)
    assert load_config() == {}
    report({"tokens_per_s": 10.5}, step_time_s=2)
    assert capsys.readouterr().out == 'CUBIC_METRICS {"step_time_s": 2, "tokens_per_s": 10.5}\n'


def test_config_from_file_or_inline_and_metrics_to_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = {"params": {"micro_batch": 2}, "trial": {"id": 1}}
    monkeypatch.setenv("CUBIC_CONFIG", str(tmp_path / "absent.json"))
    monkeypatch.setenv("CUBIC_CONFIG_JSON", json.dumps(doc))
    assert load_config() == {"micro_batch": 2}  # the file is not there: inline JSON
    (tmp_path / "c.json").write_text(json.dumps({**doc, "params": {"micro_batch": 8}}))
    monkeypatch.setenv("CUBIC_CONFIG", str(tmp_path / "c.json"))
    assert load_document()["params"] == {"micro_batch": 8}
    monkeypatch.setenv("CUBIC_METRICS", str(tmp_path / "out" / "metrics.json"))
    report(tokens_per_s=3.0)
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == {"tokens_per_s": 3.0}


@pytest.mark.parametrize("bad", [float("nan"), "fast", True])
def test_report_refuses_what_is_not_a_finite_number(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="tokens_per_s"):
        report(tokens_per_s=bad)


def test_step_timer_leaves_warm_up_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBIC_WARMUP_STEPS", "2")
    timer = StepTimer()
    for seconds in (10.0, 5.0, 1.0, 1.0, 2.0):  # compilation makes the first steps slow
        timer.record(seconds, tokens=100)
    m = timer.metrics()
    assert m["timed_steps"] == 3
    assert m["step_time_s"] == pytest.approx(4.0 / 3)
    assert m["tokens_per_s"] == m["throughput"] == pytest.approx(300 / 4.0)
    assert "samples_per_s" not in m
    with pytest.raises(RuntimeError, match="no timed steps"):
        StepTimer(warmup=5).metrics()

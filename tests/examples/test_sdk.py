"""The SDK example runs as documented against a real service."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_sdk_example_runs_a_study_to_its_best(url: str, tmp_path: Path) -> None:
    study = tmp_path / "small.study.yaml"
    study.write_text(
        "name: sdk-example\nworkload: {preset: llama3_8b, cluster: {num_gpus: 16}}\n"
        f"space: {ROOT / 'search_spaces' / 'llm_pretrain.yaml'}\nobjective: tokens_per_s\n"
        "budget: {max_trials: 6, max_parallel: 4}\nstrategy: {name: random, seed: 0}\n"
    )
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sdk" / "run_study.py"), str(study)],
        env={**os.environ, "CUBIC_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": complete") + out.stdout.count(": infeasible") == 6
    assert "best tokens_per_s:" in out.stdout and "  tp: " in out.stdout

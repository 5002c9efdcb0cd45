"""Tiny benchmark studies (tens of configs) so that every test runs in well under a second."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

LLM_SPACE = {
    "parameters": {
        "tp": {"type": "categorical", "choices": [1, 2, 4, 8]},
        "pp": {"type": "categorical", "choices": [1, 2]},
        "micro_batch": {"type": "categorical", "choices": [1, 2, 4]},
        "zero_stage": {"type": "categorical", "choices": [0, 1]},
        "recompute": {"type": "categorical", "choices": ["none", "full"]},
        "sequence_parallel": {"type": "bool", "default": False, "when": "tp > 1"},
    },
    "derived": {"dp": "num_gpus // (tp * pp)"},
    "constraints": [
        "num_gpus % (tp * pp) == 0",
        "dp > 0 and global_batch % (micro_batch * dp) == 0",
    ],
}

DLRM_SPACE = {
    "parameters": {
        "sharding_large": {"type": "categorical", "choices": ["table_wise", "row_wise"]},
        "placement_large": {"type": "categorical", "choices": ["hbm", "host", "cached"]},
        "cache_load_factor": {
            "type": "categorical",
            "choices": [0.1, 0.4],
            "default": 1.0,
            "when": "placement_large == 'cached'",
        },
        "a2a_precision": {"type": "categorical", "choices": ["fp32", "fp8"]},
        "batch_per_gpu": {"type": "categorical", "choices": [1024, 16384]},
        "pipeline_sparse": {"type": "bool"},
    },
}


def _write(path: Path, name: str, workload: dict, space: dict, metric: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "workload": workload,
                "space": space,
                "objective": metric,
                "constraints": {"memory_headroom": 0.05, "max_error_score": 1.0},
                "budget": {"max_trials": 64, "max_parallel": 8},
                "max_retries": 2,
            },
            sort_keys=False,
        )
    )
    return path


@pytest.fixture
def llm_study(tmp_path: Path) -> Path:
    wl = {
        "preset": "llama3_8b",
        "cluster": {"gpu": "h100_sxm", "num_gpus": 8},
        "training": {"global_batch": 64},
    }
    return _write(tmp_path / "llm.study.yaml", "tiny-llm", wl, LLM_SPACE, "tokens_per_s")


@pytest.fixture
def dlrm_study(tmp_path: Path) -> Path:
    wl = {"preset": "dlrm_criteo_dot", "cluster": {"gpu": "a100_80gb", "num_gpus": 8}}
    return _write(tmp_path / "dlrm.study.yaml", "tiny-dlrm", wl, DLRM_SPACE, "samples_per_s")

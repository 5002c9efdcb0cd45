"""Workloads: ready-made shapes, YAML loading and validation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cubic.workload import PRESETS, Workload, WorkloadError, get_workload


@pytest.mark.parametrize(
    ("name", "billions"),
    [("gpt3_175b", 175.0), ("llama3_8b", 8.03), ("llama3_70b", 70.6), ("llama3_405b", 405.9)],
)
def test_preset_parameter_counts_match_the_published_sizes(name: str, billions: float) -> None:
    assert PRESETS[name].model.params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_flops_per_token_is_6n_plus_attention() -> None:
    m = PRESETS["gpt3_175b"].model
    n = m.active_params()
    assert m.flops_per_token() == pytest.approx(6 * n + 6 * m.layers * m.seq_len * m.hidden)


def test_criteo_dlrm_presets() -> None:
    dot, dcn = PRESETS["dlrm_criteo_dot"].model, PRESETS["dlrm_criteo_dcnv2"].model
    assert len(dot.tables) == 26 and dot.embedding_dim == 128
    # 26 tables of the Criteo 1TB data set, 128-wide: 204.2M rows -> 26.1B parameters.
    assert dot.embedding_params() == pytest.approx(26.14e9, rel=0.01)
    assert sum(t.pooling for t in dcn.tables) == 214  # MLPerf multi-hot pooling factors
    assert dcn.interaction_width() == 27 * 128
    assert dcn.dense_flops_per_sample() > dot.dense_flops_per_sample()


def test_yaml_preset_with_overrides(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(
        "preset: llama3_70b\ncluster: {gpu: h200, num_gpus: 128}\ntraining: {global_batch: 256}\n"
    )
    wl = get_workload(str(f))
    assert wl.cluster.gpu == "h200" and wl.cluster.num_gpus == 128
    assert wl.training.global_batch == 256 and wl.model == PRESETS["llama3_70b"].model
    assert wl.context()["num_gpus"] == 128 and wl.context()["kv_heads"] == 8


def test_inline_dlrm_workload_round_trips() -> None:
    wl = PRESETS["dlrm_criteo_dcnv2"]
    again = Workload.from_dict(wl.to_dict())
    assert again == wl


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"preset": "gpt5"}, "preset"),
        ({"preset": "llama3_8b", "cluster": {"gpu": "tpu"}}, "cluster.gpu"),
        ({"preset": "llama3_8b", "training": {"optimizer": "lion"}}, "training.optimizer"),
        (
            {
                "model": {
                    "kind": "llm",
                    "name": "x",
                    "layers": 2,
                    "hidden": 100,
                    "heads": 3,
                    "kv_heads": 3,
                    "ffn": 4,
                    "vocab": 5,
                    "seq_len": 6,
                }
            },
            "model.heads",
        ),
        ({"model": {"kind": "dlrm", "name": "x"}}, "model.tables"),
        ({"model": {"kind": "cnn"}}, "model.kind"),
        ({"preset": "llama3_8b", "colour": "red"}, "unknown field"),
    ],
)
def test_bad_workload_names_the_field(doc: dict, needle: str) -> None:
    with pytest.raises(WorkloadError, match=needle):
        Workload.from_dict(doc)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            {"preset": "llama3_8b", "cluster": {"num_gpus": "sixteen"}},
            "cluster.num_gpus: expected int",
        ),
        ({"preset": "llama3_8b", "cluster": {"gpu_per_node": 8}}, "did you mean 'gpus_per_node'"),
        ({"preset": "llama3_8b", "training": {"global_batch": True}}, "global_batch: expected int"),
        ({"preset": "llama3_8b", "cluster": [1]}, "cluster: expected a mapping"),
        (
            {"model": {"layers": 2, "hidden": 8, "heads": 2, "ffn": 16, "vocab": 10, "sq_len": 4}},
            "did you mean 'seq_len'",
        ),
    ],
)
def test_workload_fields_are_checked_before_anything_is_built(data: dict, says: str) -> None:
    with pytest.raises(WorkloadError, match=re.escape(says)):
        Workload.from_dict(data)

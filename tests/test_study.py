"""Study specs: where their files are found, and the refusal of a space with no valid config."""

from __future__ import annotations

from pathlib import Path

import pytest

from cubic.errors import InvalidInput
from cubic.shipped import SHIPPED_DIR
from cubic.space import Space
from cubic.store import Store
from cubic.study import ResolvedStudy, load_spec, parse_spec
from cubic.tuner import Tuner

WORKLOAD = {"preset": "llama3_8b", "cluster": {"gpu": "h100_sxm", "num_gpus": 16}}
NEVER = {
    "parameters": {
        "tp": {"type": "categorical", "choices": [3, 5, 7]},
        "micro_batch": {"type": "categorical", "choices": [1, 2]},
    },
    "constraints": [
        {"expr": "num_gpus % tp == 0", "message": "tp must divide the GPUs"},
        "micro_batch > 1",
    ],
}


def _study_file(folder: Path, space: str) -> Path:
    path = folder / "mine.study.yaml"
    path.write_text(
        f"name: mine\nworkload: {{preset: llama3_8b}}\nspace: {space}\n"
        "strategy: {name: random, seed: 0}\n"
    )
    return path


def test_a_study_outside_the_repository_uses_the_shipped_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec, base = load_spec(_study_file(tmp_path, "llm_pretrain.yaml"))
    resolved = spec.resolve(base)
    assert resolved.space == Space.from_yaml(SHIPPED_DIR / "llm_pretrain.yaml")


def test_a_space_next_to_the_study_wins_over_the_shipped_one(tmp_path: Path) -> None:
    (tmp_path / "llm_pretrain.yaml").write_text(
        "parameters: {tp: {type: categorical, choices: [1, 2]}}\n"
    )
    spec, base = load_spec(_study_file(tmp_path, "llm_pretrain.yaml"))
    assert spec.resolve(base).space.names == ("tp",)


def test_a_missing_space_file_is_named_as_written(tmp_path: Path) -> None:
    spec, base = load_spec(_study_file(tmp_path, "nope.yaml"))
    with pytest.raises(InvalidInput, match=r"nope\.yaml") as err:
        spec.resolve(base)
    assert err.value.field == "space"


@pytest.mark.parametrize(
    "name", ["llama3_8b.study.yaml", "search_spaces/bench/llama3_8b_h100x16.study.yaml"]
)
def test_a_shipped_study_loads_by_name_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)
    spec, base = load_spec(name)
    assert base.is_relative_to(SHIPPED_DIR.resolve())
    assert spec.resolve(base).space.size(spec.resolve(base).context) > 100


def test_a_space_with_no_valid_configuration_is_refused_naming_its_constraints() -> None:
    spec = parse_spec({"name": "never", "workload": WORKLOAD, "space": NEVER})
    with pytest.raises(InvalidInput) as err:
        spec.resolve()
    assert err.value.field == "space"
    message = str(err.value)
    assert message.startswith("space: no valid configuration for this workload;")
    assert "'num_gpus % tp == 0' (tp must divide the GPUs) removes 6 (100%)" in message
    assert "'micro_batch > 1' removes 3 (50%)" in message
    # A stored study was checked when it was made: loading it again never refuses it.
    stored = ResolvedStudy.from_stored(spec.model_dump(mode="json"))
    assert stored.space.size(stored.context) == 0


def test_the_python_api_refuses_it_and_stores_nothing(store: Store) -> None:
    spec = parse_spec({"name": "never", "workload": WORKLOAD, "space": NEVER, "allow_unfit": True})
    with pytest.raises(InvalidInput, match="'micro_batch > 1' removes 3") as err:
        Tuner(store).create_study(spec)
    assert err.value.field == "space"
    assert store.list_studies() == []

"""Feasibility-first candidates, the space survey and the refusal of spaces that cannot fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from cubic.errors import InvalidInput
from cubic.proxy.features import featurize, hardware_ok
from cubic.proxy.memory import estimate_ratio
from cubic.sim import simulate
from cubic.store import Store
from cubic.strategies.candidates import survey, unfit_reason
from cubic.study import parse_spec
from cubic.tuner import Tuner

ROOT = Path(__file__).resolve().parents[2]
LLM_SPACE = str(ROOT / "search_spaces" / "llm_pretrain.yaml")


def _study(gpu: str, n: int, preset: str = "gpt3_175b", space: object = LLM_SPACE, **extra):
    spec = {
        "name": "c",
        "workload": {"preset": preset, "cluster": {"gpu": gpu, "num_gpus": n}},
        "space": space,
        **extra,
    }
    return parse_spec(spec)


def test_candidates_are_valid_run_on_the_gpu_and_fit_by_the_estimate() -> None:
    study = _study("a100_40gb", 256).resolve()
    s = survey(study.workload, study.space, limit=0.95, slack=0.15)
    base = s.candidates
    assert base.exhaustive and s.exhaustive
    assert 0 < len(base) < s.valid
    assert all(not study.space.validate(c, study.context) for c in base.configs[:300])
    assert np.all(base.estimate <= 0.95 * 1.15)
    assert np.allclose(estimate_ratio("llm", featurize(study.workload, base.arrays)), base.estimate)
    # The survey's count is the brute-force count over the whole space.
    everything = study.space.enumerate_arrays(study.context)
    est = estimate_ratio("llm", featurize(study.workload, everything))
    assert s.valid == len(est) and s.fit == int(np.sum(est <= 0.95))
    # Against the simulator: most of the space runs out of memory, most candidates do not.
    true = simulate(study.workload, everything).peak_memory / study.workload.gpu.hbm_bytes
    sim_true = simulate(study.workload, base.configs).peak_memory / study.workload.gpu.hbm_bytes
    assert np.mean(true <= 1.0) < 0.2 and np.mean(sim_true <= 1.0) > 0.6


def test_a_space_that_offers_fp8_on_a100_yields_no_fp8_candidate(tmp_path: Path) -> None:
    """A user's space without the hardware condition: cubic still rules FP8 out on A100."""
    doc = yaml.safe_load(Path(LLM_SPACE).read_text())
    for name in doc["parameters"]:
        if name.startswith("fp8_"):
            doc["parameters"][name] = {"type": "bool"}
    path = tmp_path / "ungated.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    study = _study("a100_80gb", 128, space=str(path)).resolve()
    base = survey(study.workload, study.space, limit=0.95).candidates
    assert len(base) > 0
    assert not any(c[k] for c in base.configs for k in c if k.startswith("fp8_"))
    assert hardware_ok(study.workload, base.X).all()


def test_a_space_that_offers_mx_formats_on_h100_yields_no_mx_candidate(tmp_path: Path) -> None:
    """A user's space whose format knobs lack the hardware condition: on an H100 cubic
    rules the block-scaled formats out, as it rules FP8 out on an A100."""
    doc = yaml.safe_load(Path(LLM_SPACE).read_text())
    params = doc["parameters"]
    for name in list(params):
        if name.endswith("_format") or name == "mxfp4_error_reduction":
            params[name] = {k: v for k, v in params[name].items() if k not in ("when", "default")}
    doc["constraints"] = [c for c in doc["constraints"] if "has_mx" not in str(c)]
    path = tmp_path / "ungated.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    study = _study("h100_sxm", 64, preset="llama3_8b", space=str(path)).resolve()
    s = survey(study.workload, study.space, limit=0.95)
    assert len(s.candidates) > 0 and s.on_hardware < s.valid
    formats = [k for k in study.space.names if k.endswith("_format")]
    assert all(c[k] == "bf16" for c in s.candidates.configs for k in formats)


def test_a_space_with_no_config_that_fits_is_refused_with_the_smallest_estimate(
    store: Store,
) -> None:
    spec = _study("a100_40gb", 16, preset="llama3_405b")
    resolved = spec.resolve()
    s = survey(resolved.workload, resolved.space, limit=0.95)
    assert s.fit == 0 and s.valid > 0
    reason = unfit_reason(s, resolved.workload)
    assert reason is not None and "GiB per GPU" in reason and "allow_unfit" in reason
    knob = s.helpful_knob()
    assert knob is not None and knob[0] in resolved.space.names
    tuner = Tuner(store)
    with pytest.raises(InvalidInput, match="no configuration of the space fits") as err:
        tuner.create_study(spec)
    assert err.value.field == "space"
    assert tuner.store.list_studies() == []  # nothing stored
    # A user who knows better goes on.
    forced = _study("a100_40gb", 16, preset="llama3_405b", allow_unfit=True)
    assert tuner.create_study(forced).id > 0


def test_a_space_that_fits_is_created_and_a_space_without_memory_knobs_is_not_judged(
    store: Store,
) -> None:
    tuner = Tuner(store)
    assert tuner.create_study(_study("h100_sxm", 256)).id > 0
    toy = {"parameters": {"lr": {"type": "categorical", "choices": [1, 2, 3]}}}
    assert tuner.create_study(_study("a100_40gb", 8, preset="llama3_405b", space=toy)).id > 0


def test_a_space_with_no_valid_configuration_is_refused(store: Store) -> None:
    never = {
        "parameters": {"tp": {"type": "categorical", "choices": [3, 5]}},
        "constraints": [{"expr": "num_gpus % tp == 0", "message": "tp must divide the GPUs"}],
    }
    with pytest.raises(InvalidInput, match="no valid configuration") as err:
        Tuner(store).create_study(_study("h100_sxm", 64, space=never))
    assert err.value.field == "space"


def test_candidates_hold_arrays_and_make_dicts_only_when_read() -> None:
    """The configs, keys and a subset agree with the arrays they are read from."""
    from cubic.strategies.base import config_key

    study = _study("h100_sxm", 256).resolve()
    base = survey(study.workload, study.space, limit=0.95).candidates
    rows = np.array([0, 7, len(base) - 1])
    every = study.space.from_arrays(base.arrays)
    assert base.configs.rows(rows) == [every[i] for i in rows]
    assert base.configs[-1] == every[-1] and base.configs[2:5] == every[2:5]
    assert list(base.configs) == every and len(base.configs) == len(every)
    assert base.keys == [config_key(c) for c in every]
    sub = base.take(rows)
    assert list(sub.configs) == [every[i] for i in rows] and sub.keys == [
        base.keys[i] for i in rows
    ]
    with pytest.raises(IndexError):
        base.configs[len(base)]


def test_a_study_is_checked_without_a_whole_survey_when_sampled_configs_fit() -> None:
    """The creation check answers from a sample when one fits, else from the survey."""
    from cubic.strategies import candidates

    fits = _study("h100_sxm", 256).resolve()
    candidates._CACHE.clear()
    assert candidates.check_fit(fits.workload, fits.space, limit=0.95) is None
    assert not candidates._CACHE  # no survey was needed
    unfit = _study("a100_40gb", 16, preset="llama3_405b").resolve()
    reason = candidates.check_fit(unfit.workload, unfit.space, limit=0.95)
    assert reason is not None and "GiB per GPU" in reason

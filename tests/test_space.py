from __future__ import annotations

import dataclasses
import itertools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from cubic.hardware import get_gpu
from cubic.space import Space, SpaceError, validate_file

ROOT = Path(__file__).resolve().parents[1]
LLM_FILE = ROOT / "search_spaces" / "llm_pretrain.yaml"
DLRM_FILE = ROOT / "search_spaces" / "dlrm_sharding.yaml"
LLM_CONTEXT = {
    "num_gpus": 64,
    "gpus_per_node": 8,
    "global_batch": 1024,
    "layers": 80,
    "heads": 64,
    "kv_heads": 8,
    "seq_len": 8192,
    "hidden": 8192,
    **get_gpu("h100_sxm").capabilities(8),
}
DLRM_CONTEXT = {"num_gpus": 64, "gpus_per_node": 8, **get_gpu("h100_sxm").capabilities(8)}

SMALL: dict[str, Any] = {
    "name": "small",
    "parameters": {
        "a": {"type": "int", "low": 1, "high": 4},
        "b": {"type": "categorical", "choices": ["x", "y", "z"]},
        "c": {"type": "categorical", "choices": [1, 2, 4], "default": 1, "when": "a > 1"},
        "d": {"type": "bool", "default": False, "when": "b != 'x'"},
        "e": {"type": "float", "low": 0.0, "high": 1.0, "step": 0.5},
        "g": {"type": "int", "low": 2, "high": 8, "step": 3},
    },
    "derived": {"s": "a * c", "q": "n // s"},
    "constraints": [
        {"expr": "n % s == 0", "message": "a * c must divide n"},
        "e <= 0.5 or d",
        "q >= 2 or g == 2",
    ],
}
CTX = {"n": 8}


@pytest.fixture
def small() -> Space:
    return Space.from_dict(SMALL)


def full_grid(space: Space) -> list[dict[str, Any]]:
    """Every combination of every parameter's values (defaults of inactive ones included)."""
    axes = []
    for p in space.parameters:
        values = p.to_python(p.grid())
        if p.default is not None and not any(v == p.default for v in values):
            values.append(p.default)
        axes.append(values)
    return [dict(zip(space.names, combo, strict=True)) for combo in itertools.product(*axes)]


# ----------------------------------------------------------------------------- loading


def test_from_dict_builds_typed_parameters(small: Space) -> None:
    assert small.names == ("a", "b", "c", "d", "e", "g")
    assert small.derived_names == ("s", "q")
    assert small.context_names == frozenset({"n"})
    assert [p.type for p in small.parameters] == [
        "int",
        "categorical",
        "categorical",
        "bool",
        "float",
        "int",
    ]
    assert small["c"].when is not None and small["c"].when.source == "a > 1"
    assert small.is_finite
    assert small.constraints[0].reason == "a * c must divide n"
    assert "e <= 0.5 or d" in small.constraints[1].reason


def test_space_is_frozen_and_round_trips_through_dict(small: Space) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        small.name = "other"  # type: ignore[misc]
    again = Space.from_dict(small.to_dict())
    assert again == small
    assert again.to_dict() == small.to_dict()
    assert hash(again) == hash(small)


def test_space_pickles(small: Space) -> None:
    again = pickle.loads(pickle.dumps(small))
    assert again == small
    assert again.size(CTX) == small.size(CTX)


def test_from_yaml_defaults_name_to_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "tiny_space.yaml"
    path.write_text("parameters:\n  x: {type: bool}\n")
    space = Space.from_yaml(path)
    assert space.name == "tiny_space"
    assert space.source == str(path)


def test_float_bounds_written_as_exponent_strings_are_accepted(tmp_path: Path) -> None:
    # YAML 1.1 reads 1e-5 (no dot) as a string.
    path = tmp_path / "lr.yaml"
    path.write_text("parameters:\n  lr: {type: float, low: 1e-5, high: 1e-3, log: true}\n")
    lr = Space.from_yaml(path)["lr"]
    assert (lr.low, lr.high) == (1e-5, 1e-3)
    assert not lr.is_finite


BROKEN = [
    ("tp: {type: int, low: 4, high: 2}", "parameter 'tp': low (4) is greater than high (2)"),
    ("tp: {type: integer, low: 1, high: 2}", "parameter 'tp': unknown type 'integer'"),
    ("tp: {low: 1, high: 2}", "parameter 'tp': missing 'type'"),
    ("tp: {type: int, low: 1}", "parameter 'tp': missing 'high'"),
    ("tp: {type: int, low: 1, hgih: 2}", "parameter 'tp': unknown key 'hgih'"),
    ("tp: {type: int, low: 1.5, high: 2}", "parameter 'tp': low must be an integer"),
    ("tp: {type: int, low: 1, high: 10, step: 4}", "parameter 'tp': high (10) is not low"),
    (
        "tp: {type: int, low: 0, high: 8, log: true}",
        "parameter 'tp': a log-scale range needs low > 0",
    ),
    (
        "lr: {type: float, low: 0.0, high: 1.0, log: true}",
        "parameter 'lr': a log-scale range needs low > 0",
    ),
    ("lr: {type: float, low: abc, high: 1.0}", "parameter 'lr': low must be a number"),
    ("tp: {type: categorical, choices: []}", "parameter 'tp': choices is empty"),
    ("tp: {type: categorical, choices: [1, 2, 1]}", "parameter 'tp': choice 1 is listed twice"),
    ("tp: {type: categorical, choices: 4}", "parameter 'tp': choices must be a list"),
    ("tp: {type: categorical, choices: [[1, 2]]}", "parameter 'tp': choice [1, 2] is not a string"),
    (
        "tp: {type: categorical, choices: [1, 2], default: 3}",
        "parameter 'tp': default 3 is not one of",
    ),
    ("tp: {type: bool, default: 1}", "parameter 'tp': default 1 has the wrong type"),
    (
        "pp: {type: int, low: 1, high: 4}\n  vp: {type: int, low: 1, high: 4, when: 'pp >'}",
        "parameter 'vp': bad 'when' condition: expression 'pp >': syntax error",
    ),
    (
        "pp: {type: int, low: 1, high: 4}\n"
        "  vp: {type: int, low: 1, high: 4, default: 1, when: \"__import__('os')\"}",
        "parameter 'vp': bad 'when' condition",
    ),
    (
        "vp: {type: int, low: 1, high: 4, default: 1, when: 'pp > 1'}\n"
        "  pp: {type: int, low: 1, high: 4}",
        "parameter 'vp': condition 'pp > 1' uses parameter 'pp', which is declared after it",
    ),
    (
        "vp: {type: int, low: 1, high: 4, default: 1, when: 'vp > 1'}",
        "parameter 'vp': condition 'vp > 1' uses the parameter itself",
    ),
    (
        "pp: {type: int, low: 1, high: 4}\n  vp: {type: int, low: 1, high: 4, when: 'pp > 1'}",
        "parameter 'vp': has a 'when' condition but no 'default'",
    ),
    ("tp: 4", "parameter 'tp': expected a mapping"),
    ("1tp: {type: bool}", "parameter name '1tp' is not a valid identifier"),
    ("tp: {type: bool}\n  tp: {type: bool}", "duplicate key 'tp'"),
]


@pytest.mark.parametrize(("params", "message"), BROKEN)
def test_broken_parameter_gives_space_error_naming_file_and_parameter(
    tmp_path: Path, params: str, message: str
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(f"name: broken\nparameters:\n  {params}\n")
    with pytest.raises(SpaceError) as info:
        Space.from_yaml(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ")
    assert message in text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "parameters:\n  tp: {type: bool}\nconstraints:\n  - 'tp and'\n",
            "constraint 1: expression 'tp and': syntax error",
        ),
        (
            "parameters:\n  tp: {type: bool}\nconstraints:\n  - tp\n  - {expr: 'tp.x'}\n",
            "constraint 2: expression 'tp.x': attribute access is not allowed",
        ),
        (
            "parameters:\n  tp: {type: bool}\nconstraints:\n  - {exp: tp}\n",
            "constraint 1: expected keys 'expr'",
        ),
        (
            "parameters:\n  tp: {type: int, low: 1, high: 2}\nderived:\n  dp: '8 // (tp'\n",
            "derived 'dp': expression '8 // (tp': syntax error",
        ),
        (
            "parameters:\n  tp: {type: int, low: 1, high: 2}\nderived:\n  a: 'b + 1'\n  b: 'tp'\n",
            "derived 'a': 'b + 1' uses 'b', which is not derived before it",
        ),
        (
            "parameters:\n  tp: {type: int, low: 1, high: 2}\nderived:\n  tp: '1'\n",
            "derived 'tp': the name is already taken",
        ),
        (
            "parameters:\n  tp: {type: int, low: 1, high: 2}\n"
            "  sp: {type: bool, default: false, when: 'dp > 1'}\nderived:\n  dp: '8 // tp'\n",
            "parameter 'sp': condition 'dp > 1' uses derived value 'dp'",
        ),
        ("paramters:\n  tp: {type: bool}\n", "unknown top-level key 'paramters'"),
        ("name: x\n", "'parameters' must be a non-empty mapping"),
        ("parameters:\n  tp: {type: bool\n", "invalid YAML at line 3"),
        ("parameters:\n\ttp: {type: bool}\n", "invalid YAML at line 2"),
        ("", "the file is empty"),
        ("- a\n- b\n", "a space must be a mapping"),
    ],
)
def test_broken_file_gives_space_error_naming_file(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(body)
    with pytest.raises(SpaceError) as info:
        Space.from_yaml(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_missing_file_is_a_space_error(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="cannot read the file"):
        Space.from_yaml(tmp_path / "nope.yaml")


def test_space_error_is_a_value_error() -> None:
    assert issubclass(SpaceError, ValueError)


# ----------------------------------------------------------------------------- one config


def test_every_parameter_type_checks_its_domain(small: Space) -> None:
    good = {"a": 2, "b": "y", "c": 2, "d": True, "e": 1.0, "g": 5}
    assert small.validate(good, CTX) == []
    bad_values = {
        "a": [5, 0, 2.0, True, "2"],
        "b": ["w", 1],
        "c": [3, "1", True],
        "d": [1, "true"],
        "e": [0.25, 1.5, "0.5", False],
        "g": [3, 9, 11],
    }
    for name, values in bad_values.items():
        for value in values:
            reasons = small.validate({**good, name: value}, CTX)
            assert any(r.startswith(f"parameter {name!r}: {value!r} is not") for r in reasons), (
                name,
                value,
                reasons,
            )


def test_inactive_parameter_takes_its_default(small: Space) -> None:
    config = small.complete({"a": 1, "b": "x", "e": 0.0, "g": 2}, CTX)
    assert config == {"a": 1, "b": "x", "c": 1, "d": False, "e": 0.0, "g": 2, "s": 1, "q": 8}
    # A value given for an inactive parameter is replaced by the default.
    assert small.complete({"a": 1, "b": "x", "c": 4, "d": True, "e": 0.0, "g": 2}, CTX)["c"] == 1
    # Inactive parameters may be omitted from a valid config, but not set to another value.
    assert small.validate({"a": 1, "b": "x", "e": 0.0, "g": 2}, CTX) == []
    reasons = small.validate({"a": 1, "b": "x", "c": 2, "e": 0.0, "g": 2}, CTX)
    assert reasons == ["parameter 'c' must be 1 (its default) when 'a > 1' is false, got 2"]


def test_active_parameter_must_be_present(small: Space) -> None:
    assert small.validate({"a": 2, "b": "x", "e": 0.0, "g": 2}, CTX) == ["parameter 'c' is missing"]
    # complete() fills an active knob the space gives a default for...
    assert small.complete({"a": 2, "b": "x", "e": 0.0, "g": 2}, CTX)["c"] == 1
    # ...and names every other missing one at once (not one per attempt).
    with pytest.raises(SpaceError, match=r"missing parameter\(s\) b, e$"):
        small.complete({"a": 2, "g": 2}, CTX)


def test_complete_checks_domains_and_names_unknown_keys(small: Space) -> None:
    with pytest.raises(SpaceError, match=r"parameter 'c': '4' is not"):
        small.complete({"a": 2, "b": "x", "c": "4", "e": 0.0, "g": 2}, CTX)
    with pytest.raises(SpaceError, match=r"'bb' \(did you mean 'b'\?\)"):
        small.complete({"a": 2, "bb": "x", "e": 0.0, "g": 2}, CTX)


def test_unknown_keys_are_reported(small: Space) -> None:
    reasons = small.validate({"a": 1, "b": "x", "e": 0.0, "g": 2, "zz": 1}, CTX)
    assert reasons == ["unknown parameter 'zz'"]
    with pytest.raises(SpaceError, match="unknown parameter"):
        small.complete({"a": 1, "b": "x", "e": 0.0, "g": 2, "zz": 1}, CTX)


def test_derived_values_are_computed_and_checked(small: Space) -> None:
    config = small.complete({"a": 2, "b": "y", "c": 2, "d": True, "e": 1.0, "g": 8}, CTX)
    assert (config["s"], config["q"]) == (4, 2)
    assert small.validate(config, CTX) == []
    assert small.validate({**config, "s": 5}, CTX) == [
        "derived 's' is 5, but the parameters give 4"
    ]


def test_constraints_report_their_messages(small: Space) -> None:
    base = {"b": "y", "d": False, "e": 1.0, "g": 5}
    reasons = small.validate({**base, "a": 3, "c": 1}, CTX)
    assert reasons == [
        "a * c must divide n",
        "constraint 'e <= 0.5 or d' is violated",
    ]
    # q = 8 // 8 = 1 < 2 and g != 2
    assert small.validate({**base, "a": 4, "c": 2, "d": True}, CTX) == [
        "constraint 'q >= 2 or g == 2' is violated"
    ]


def test_context_names_are_checked_when_bound(small: Space) -> None:
    with pytest.raises(SpaceError, match=r"unknown name\(s\) 'n'.*derived 'q'"):
        small.validate({"a": 1}, {})
    with pytest.raises(SpaceError, match="'n'"):
        small.sample(np.random.default_rng(0), 1, {"m": 8})


def test_division_by_zero_in_derived_value_makes_config_invalid() -> None:
    space = Space.from_dict(
        {
            "parameters": {"k": {"type": "int", "low": 0, "high": 3}},
            "derived": {"per": "12 // k"},
            "constraints": ["per >= 4"],
        }
    )
    assert space.validate({"k": 0}, {}) == ["derived 'per' could not be computed: division by zero"]
    assert space.validate({"k": 3}, {}) == []
    assert [c["k"] for c in space.enumerate({})] == [1, 2, 3]


# ----------------------------------------------------------------------------- enumeration


def test_size_equals_enumeration_equals_brute_force(small: Space) -> None:
    brute = [c for c in full_grid(small) if not small.validate(c, CTX)]
    enumerated = small.enumerate(CTX)
    assert len(brute) == small.size(CTX) == len(enumerated)
    assert 0 < len(brute) < len(full_grid(small))
    key = lambda c: tuple(c[n] for n in small.names)  # noqa: E731
    assert sorted(map(key, enumerated)) == sorted(map(key, brute))
    assert len(set(map(key, enumerated))) == len(enumerated)
    for config in enumerated:
        assert config == small.complete({n: config[n] for n in small.names}, CTX)


def test_size_counts_inactive_parameters_once() -> None:
    space = Space.from_dict(
        {
            "parameters": {
                "pp": {"type": "categorical", "choices": [1, 2]},
                "vp": {"type": "categorical", "choices": [1, 2, 4], "default": 1, "when": "pp > 1"},
            }
        }
    )
    assert space.size({}) == 1 + 3
    assert space.enumerate({}) == [
        {"pp": 1, "vp": 1},
        {"pp": 2, "vp": 1},
        {"pp": 2, "vp": 2},
        {"pp": 2, "vp": 4},
    ]


def test_context_only_constraint_can_empty_the_space(small: Space) -> None:
    space = Space.from_dict({**SMALL, "constraints": ["n > 100"]})
    assert space.size(CTX) == 0
    assert space.enumerate(CTX) == []


def test_continuous_space_is_not_enumerable() -> None:
    space = Space.from_dict({"parameters": {"lr": {"type": "float", "low": 0.1, "high": 1.0}}})
    assert not space.is_finite
    with pytest.raises(SpaceError, match="parameter 'lr' is a continuous float"):
        space.size({})


# ----------------------------------------------------------------------------- an empty space


def test_removals_count_what_each_constraint_removes_alone(small: Space) -> None:
    r = small.removals(CTX)
    total = Space.from_dict({**SMALL, "constraints": []}).size(CTX)
    alone = [Space.from_dict({**SMALL, "constraints": [c]}).size(CTX) for c in SMALL["constraints"]]
    assert r.exhaustive and r.total == total
    assert r.removed == tuple(total - kept for kept in alone)
    assert all(0 < k < total for k in r.removed)


def test_a_space_with_a_valid_config_has_no_empty_reason(small: Space) -> None:
    assert small.empty_reason(CTX) is None
    assert Space.from_yaml(LLM_FILE).empty_reason(LLM_CONTEXT) is None


def test_an_empty_space_names_the_constraints_that_remove_most(small: Space) -> None:
    space = Space.from_dict(
        {
            **SMALL,
            "constraints": [
                "e >= 0",  # removes nothing
                "g == 2",  # two thirds
                "a > 10",  # everything
                {"expr": "b == 'w'", "message": "b must be w"},  # everything
            ],
        }
    )
    total = Space.from_dict({**SMALL, "constraints": []}).size(CTX)
    reason = space.empty_reason(CTX, top=3)
    assert reason is not None and "\n" not in reason
    assert reason.startswith("no valid configuration for this workload;")
    assert f"of the {total:,} configurations the parameters allow" in reason
    a, b, g = (reason.index(s) for s in ("'a > 10'", "(b must be w)", "'g == 2'"))
    assert a < b < g  # most first; ties in declaration order
    assert f"'a > 10' removes {total:,} (100%)" in reason
    assert f"'g == 2' removes {total * 2 // 3:,} (67%)" in reason
    assert "e >= 0" not in reason
    assert "g == 2" not in space.empty_reason(CTX, top=2)


def test_an_empty_share_says_100_or_0_percent_only_when_it_is() -> None:
    space = Space.from_dict(
        {
            "parameters": {"k": {"type": "int", "low": 1, "high": 1000}},
            "constraints": ["k <= 1", "k > 1"],
        }
    )
    reason = space.empty_reason({})
    assert reason is not None
    assert "'k <= 1' removes 999 (99%)" in reason and "'k > 1' removes 1 (1%)" in reason


def test_a_finite_space_is_enumerated_before_it_is_called_empty() -> None:
    """A single valid config among 100,000 escapes 1,000 random draws, not the enumeration."""
    rare = {"parameters": {"k": {"type": "int", "low": 1, "high": 100_000}}}
    assert (
        Space.from_dict({**rare, "constraints": ["k == 77777"]}).empty_reason({}, draws=1000)
        is None
    )
    reason = Space.from_dict({**rare, "constraints": ["k == 0"]}).empty_reason({}, draws=1000)
    assert reason is not None and "random draws" not in reason
    assert "'k == 0' removes 100,000 (100%)" in reason


def test_a_continuous_space_is_called_empty_after_its_draws() -> None:
    space = Space.from_dict(
        {
            "parameters": {"lr": {"type": "float", "low": 0.1, "high": 1.0}},
            "constraints": ["lr > 2", "lr < 0.55"],
        }
    )
    reason = space.empty_reason({}, draws=5000)
    assert reason is not None
    assert reason.startswith("no valid configuration for this workload in 5,000 random draws;")
    assert "of the 5,000 random draws" in reason and "'lr > 2' removes 5,000 (100%)" in reason
    assert reason.index("'lr > 2'") < reason.index("'lr < 0.55'")
    r = space.removals({}, draws=5000)
    assert not r.exhaustive and 2000 < r.removed[1] < 3000  # about half of the range


def test_an_empty_space_without_computable_configs_says_so() -> None:
    space = Space.from_dict(
        {"parameters": {"k": {"type": "int", "low": 0, "high": 0}}, "derived": {"per": "12 // k"}}
    )
    reason = space.empty_reason({})
    assert reason is not None and "fail to evaluate for every combination" in reason


# ----------------------------------------------------------------------------- sampling


def test_sample_returns_only_valid_configs_covering_every_choice(small: Space) -> None:
    configs = small.sample(np.random.default_rng(1), 2000, CTX)
    assert len(configs) == 2000
    for config in configs:
        assert small.validate(config, CTX) == [], config
    enumerated = small.enumerate(CTX)
    assert 3 not in {c["a"] for c in enumerated}  # a = 3 never divides n = 8
    for name in small.names:
        assert {c[name] for c in configs} == {c[name] for c in enumerated}, name


def test_sample_is_reproducible_and_roughly_uniform(small: Space) -> None:
    a = small.sample(np.random.default_rng(3), 500, CTX)
    b = small.sample(np.random.default_rng(3), 500, CTX)
    assert a == b
    # b is unconstrained by the rest: about a third of draws each.
    counts = {v: sum(c["b"] == v for c in a) for v in "xyz"}
    assert all(100 < n < 240 for n in counts.values()), counts


def test_sample_of_continuous_parameters_respects_scale() -> None:
    space = Space.from_dict(
        {
            "parameters": {
                "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
                "k": {"type": "int", "low": 1, "high": 1000, "log": True},
            }
        }
    )
    configs = space.sample(np.random.default_rng(0), 4000, {})
    lrs = np.array([c["lr"] for c in configs])
    assert lrs.min() >= 1e-4 and lrs.max() <= 1.0
    # Log-uniform: about a quarter of the mass per decade.
    assert 0.2 < np.mean(lrs < 1e-3) < 0.3
    ks = [c["k"] for c in configs]
    assert all(isinstance(k, int) and 1 <= k <= 1000 for k in ks)
    assert 0.25 < np.mean(np.array(ks) < 10) < 0.42


def test_sample_gives_up_on_unsatisfiable_constraints(small: Space) -> None:
    space = Space.from_dict({**SMALL, "constraints": ["a > 10"]})
    with pytest.raises(SpaceError, match="found only 0 of 5 valid configurations"):
        space.sample(np.random.default_rng(0), 5, CTX, max_tries=5000)


# ----------------------------------------------------------------------------- arrays, Optuna


def test_arrays_round_trip(small: Space) -> None:
    configs = small.enumerate(CTX)
    arrays = small.to_arrays(configs)
    assert list(arrays) == [*small.names, *small.derived_names]
    assert arrays["a"].dtype == np.int64
    assert arrays["b"].dtype.kind == "U"
    assert arrays["d"].dtype == bool
    assert arrays["e"].dtype == np.float64
    assert small.from_arrays(arrays) == configs
    assert small.from_arrays(small.enumerate_arrays(CTX)) == configs


def test_from_arrays_returns_plain_python_values() -> None:
    space = Space.from_dict(
        {
            "parameters": {
                "m": {"type": "categorical", "choices": [1, 2.5, 4]},
                "f": {"type": "bool"},
            }
        }
    )
    configs = space.from_arrays(space.enumerate_arrays({}))
    assert [type(c["m"]) for c in configs[::2]] == [int, float, int]
    assert all(type(c["f"]) is bool for c in configs)


def test_to_arrays_needs_complete_configs(small: Space) -> None:
    with pytest.raises(SpaceError, match="lacks parameter 'c'"):
        small.to_arrays([{"a": 1, "b": "x", "e": 0.0, "g": 2}])


def test_optuna_distributions() -> None:
    space = Space.from_dict(
        {
            "parameters": {
                "n": {"type": "int", "low": 1, "high": 64, "log": True},
                "m": {"type": "int", "low": 0, "high": 12, "step": 4},
                "lr": {"type": "float", "low": 1e-5, "high": 1e-2, "log": True},
                "r": {"type": "categorical", "choices": ["none", "full"]},
                "b": {"type": "bool", "default": False, "when": "n > 1"},
            }
        }
    )
    dists = space.optuna_distributions()
    assert list(dists) == ["n", "m", "lr", "r", "b"]
    assert dists["n"] == IntDistribution(1, 64, log=True)
    assert dists["m"] == IntDistribution(0, 12, step=4)
    assert dists["lr"] == FloatDistribution(1e-5, 1e-2, log=True)
    assert dists["r"] == CategoricalDistribution(("none", "full"))
    assert dists["b"] == CategoricalDistribution((False, True))


# ----------------------------------------------------------------------------- shipped spaces


LLM_NAMES = [
    "tp",
    "pp",
    "cp",
    "vp",
    "micro_batch",
    "zero_stage",
    "recompute",
    "sequence_parallel",
    "tp_comm_overlap",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "fp8_qkv",
    "fp8_attn_out",
    "fp8_mlp_in",
    "fp8_mlp_out",
    "fp8_lm_head",
    "qkv_format",
    "attn_out_format",
    "mlp_in_format",
    "mlp_out_format",
    "lm_head_format",
    "mxfp4_error_reduction",
]
DLRM_NAMES = [
    "sharding_large",
    "sharding_medium",
    "sharding_small",
    "placement_large",
    "cache_load_factor",
    "a2a_precision",
    "lossy_error_bound",
    "lossy_adaptive",
    "batch_per_gpu",
    "fp8_bottom_mlp",
    "fp8_top_mlp",
    "fp8_interaction",
    "pipeline_sparse",
]


@pytest.mark.parametrize(
    ("path", "context", "names", "derived"),
    [
        (LLM_FILE, LLM_CONTEXT, LLM_NAMES, ("dp", "num_microbatches", "embedding_loss_in_split")),
        (DLRM_FILE, DLRM_CONTEXT, DLRM_NAMES, ("global_batch",)),
    ],
)
def test_shipped_spaces_are_valid_finite_and_sized(
    path: Path, context: dict[str, int], names: list[str], derived: tuple[str, ...]
) -> None:
    space = validate_file(path, context)
    assert sorted(space.names) == sorted(names)
    assert space.derived_names == derived
    assert space.is_finite
    assert space.context_names <= set(context)
    size = space.size(context)
    assert 10**3 <= size <= 10**6
    configs = space.sample(np.random.default_rng(0), 300, context)
    for config in configs:
        assert space.validate(config, context) == []
    arrays = space.enumerate_arrays(context)
    rows = np.random.default_rng(1).choice(size, 300, replace=False)
    for config in space.from_arrays({k: v[rows] for k, v in arrays.items()}):
        assert space.validate(config, context) == []


def test_llm_space_encodes_megatron_rules() -> None:
    space = Space.from_yaml(LLM_FILE)
    assert space["tp"].choices == (1, 2, 4, 8)
    assert space["pp"].choices == (1, 2, 4, 8, 16)
    assert space["zero_stage"].choices == (0, 1, 2, 3)
    assert space["recompute"].choices == ("none", "selective", "full")
    good = space.complete(
        {
            "tp": 8, "pp": 4, "cp": 2, "vp": 2, "micro_batch": 1, "zero_stage": 1,
            "recompute": "selective", "sequence_parallel": True, "tp_comm_overlap": True,
            "overlap_grad_reduce": True, "overlap_param_gather": True, "fp8_qkv": True,
            "fp8_attn_out": True, "fp8_mlp_in": True, "fp8_mlp_out": False, "fp8_lm_head": False,
        },
        LLM_CONTEXT,
    )  # fmt: skip
    assert (good["dp"], good["num_microbatches"]) == (1, 1024)
    assert space.validate(good, LLM_CONTEXT) == []
    cases = {
        "tp * pp * cp must divide the GPU count": {"tp": 8, "pp": 16, "cp": 4, "vp": 1},
        "pp * vp must divide the number of layers": {"pp": 16, "vp": 2, "cp": 1, "tp": 4},
        "tp must divide the number of attention heads": {"heads": 36},
        "tp and the number of KV heads must divide one another": {"kv_heads": 12, "heads": 96},
        "tensor parallelism must stay within one NVLink domain": {"nvlink_domain": 4},
        "context parallelism splits the sequence": {"seq_len": 8190},
        "micro_batch * dp must divide the global batch": {"global_batch": 1020, "micro_batch": 8},
        "the interleaved schedule (vp > 1) needs": {"global_batch": 2, "micro_batch": 2},
        "ZeRO-2/3": {"zero_stage": 3},
    }
    for message, change in cases.items():
        params = {k: v for k, v in change.items() if k in space.names}
        ctx = {**LLM_CONTEXT, **{k: v for k, v in change.items() if k not in space.names}}
        config = {k: v for k, v in {**good, **params}.items() if k in space.names}
        reasons = space.validate(config, ctx)
        assert any(r.startswith(message) for r in reasons), (message, reasons)
    # Conditional knobs: vp only with pp > 1, SP and TP overlap only with tp > 1.
    plain = space.complete({**good, "tp": 1, "pp": 1}, LLM_CONTEXT)
    assert (plain["vp"], plain["sequence_parallel"], plain["tp_comm_overlap"]) == (1, False, False)


def test_dlrm_space_conditions_and_choices() -> None:
    space = Space.from_yaml(DLRM_FILE)
    assert "data_parallel" not in space["sharding_large"].choices
    assert "data_parallel" in space["sharding_small"].choices
    assert space["batch_per_gpu"].choices == (512, 1024, 2048, 4096, 8192, 16384)
    arrays = space.enumerate_arrays(DLRM_CONTEXT)
    cached = arrays["placement_large"] == "cached"
    assert set(arrays["cache_load_factor"][cached].tolist()) == {0.05, 0.1, 0.2, 0.4}
    assert set(arrays["cache_load_factor"][~cached].tolist()) == {1.0}
    lossy = arrays["a2a_precision"] == "lossy"
    assert set(arrays["lossy_error_bound"][lossy].tolist()) == {0.001, 0.01, 0.05}
    assert set(arrays["lossy_error_bound"][~lossy].tolist()) == {0.0}
    # A fixed or an adaptive bound for each bound; no adaptive flag without a lossy exchange.
    assert set(arrays["lossy_adaptive"][lossy].tolist()) == {False, True}
    assert not arrays["lossy_adaptive"][~lossy].any()
    assert np.array_equal(arrays["global_batch"], 64 * arrays["batch_per_gpu"])
    single_node = space.enumerate_arrays({**DLRM_CONTEXT, "num_gpus": 8, "gpus_per_node": 8})
    assert 0 < len(single_node["pipeline_sparse"]) < len(arrays["pipeline_sparse"])
    for name in ("sharding_large", "sharding_medium", "sharding_small"):
        assert "table_row_wise" in arrays[name]
        assert "table_row_wise" not in single_node[name]


def test_knobs_the_context_rules_out_are_fixed_and_draw_nothing() -> None:
    """A parameter whose condition is false from the context alone (or from the defaults of
    parameters fixed before it) is fixed at its default: adding such parameters leaves the
    random draws of the others as they were."""
    base = {
        "a": {"type": "int", "low": 1, "high": 8},
        "b": {"type": "categorical", "choices": ["x", "y"]},
    }
    extra = {
        "hw": {"type": "bool", "default": False, "when": "has_thing"},
        "fmt": {
            "type": "categorical",
            "choices": ["p", "q"],
            "default": "p",
            "when": "has_thing and not hw",
        },
        "opt": {"type": "bool", "default": False, "when": "fmt == 'q' or b == 'y'"},
    }
    plain = Space.from_dict({"parameters": base})
    grown = Space.from_dict({"parameters": {**base, **extra}})
    ctx = {"has_thing": False}
    assert grown.fixed(ctx) == {"hw": False, "fmt": "p"}  # opt reads b, which varies
    assert grown.fixed({"has_thing": True}) == {}
    a = plain.sample_arrays(np.random.default_rng(3), 500, ctx)
    b = grown.sample_arrays(np.random.default_rng(3), 500, ctx)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert set(b["fmt"].tolist()) == {"p"} and not b["hw"].any()
    assert set(b["opt"].tolist()) == {False, True}


def test_vectorised_sampling_and_enumeration_cover_the_space() -> None:
    space = Space.from_yaml(LLM_FILE)
    configs = space.sample(np.random.default_rng(0), 10_000, LLM_CONTEXT)
    assert len(configs) == 10_000
    arrays = space.enumerate_arrays(LLM_CONTEXT)
    assert len(arrays["tp"]) == space.size(LLM_CONTEXT)
    # Every enumerated point is distinct: encode each row as a row of value codes.
    codes = np.stack(
        [np.unique(arrays[name], return_inverse=True)[1] for name in space.names], axis=1
    ).astype(np.int8)
    assert len(np.unique(codes, axis=0)) == len(codes)


def test_llm_size_matches_a_brute_force_count_of_the_parallel_layout() -> None:
    space = Space.from_yaml(LLM_FILE)
    layout = [
        (tp, pp, cp, vp, mb, z)
        for tp, pp, cp, vp, mb, z in itertools.product(
            [1, 2, 4, 8], [1, 2, 4, 8, 16], [1, 2, 4], [1, 2, 4], [1, 2, 4, 8], [0, 1, 2, 3]
        )
        if (pp > 1 or vp == 1)
        and 64 % (tp * pp * cp) == 0
        and 80 % (pp * vp) == 0
        and 1024 % (mb * 64 // (tp * pp * cp)) == 0
        and (vp == 1 or (1024 // (mb * 64 // (tp * pp * cp))) % pp == 0)
        and (z <= 1 or pp == 1)
    ]
    expected = 0
    for tp, _pp, _cp, _vp, _mb, z in layout:
        sp_choices = 3 if tp > 1 else 1  # (SP off), (SP on, overlap off), (SP on, overlap on)
        param_gather = 2 if z >= 1 else 1
        expected += sp_choices * param_gather * 3 * 2 * 2**5  # recompute, grad overlap, fp8
    assert space.size(LLM_CONTEXT) == expected
    # On a GPU without FP8 the five FP8 sites are not knobs: a 32nd of the configs remain.
    a100 = {**LLM_CONTEXT, **get_gpu("a100_80gb").capabilities(8)}
    assert space.size(a100) == expected // 2**5
    assert not any(c["fp8_qkv"] for c in space.sample(np.random.default_rng(0), 200, a100))


def test_shipped_spaces_name_the_hardware() -> None:
    llm, dlrm = Space.from_yaml(LLM_FILE), Space.from_yaml(DLRM_FILE)
    assert {"has_fp8", "nvlink_domain"} <= llm.context_names
    assert "has_fp8" in dlrm.context_names
    # A domain wider than the node (an NVL72 rack) admits tp=8 on 4-GPU nodes.
    narrow = {**LLM_CONTEXT, "gpus_per_node": 4, "nvlink_domain": 4}
    wide = {**narrow, "nvlink_domain": 72}
    cfg = {**llm.sample(np.random.default_rng(0), 1, LLM_CONTEXT)[0], "tp": 8, "pp": 1, "cp": 1}
    cfg = llm.complete({k: cfg[k] for k in llm.names if k != "vp"}, LLM_CONTEXT)
    assert any("NVLink" in r for r in llm.validate(cfg, narrow))
    assert not any("NVLink" in r for r in llm.validate(cfg, wide))


def test_validate_file_checks_the_context(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match=rf"^{LLM_FILE}: unknown name\(s\) 'heads':"):
        validate_file(LLM_FILE, {k: v for k, v in LLM_CONTEXT.items() if k != "heads"})
    path = tmp_path / "typed.yaml"
    path.write_text(
        "parameters:\n  r: {type: categorical, choices: [a, b]}\nconstraints:\n  - 'r > n'\n"
    )
    assert validate_file(path).names == ("r",)  # without a context only the file is checked
    with pytest.raises(SpaceError, match="constraint 1"):
        validate_file(path, {"n": 1})

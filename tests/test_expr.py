from __future__ import annotations

import numpy as np
import pytest

from cubic.expr import Expression, ExpressionError


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("__import__('os')", "calling '__import__' is not allowed"),
        ("open('/etc/passwd')", "calling 'open' is not allowed"),
        ("eval('1')", "calling 'eval' is not allowed"),
        ("tp.bit_length()", "calling 'tp.bit_length' is not allowed"),
        ("tp.real", "attribute access is not allowed"),
        ("(1).__class__", "attribute access is not allowed"),
        ("lambda: 1", "lambda is not allowed"),
        ("choices[0]", "subscripts are not allowed"),
        ("[x for x in y]", "comprehensions are not allowed"),
        ("(x := 1)", "assignment expressions are not allowed"),
        ("f'{tp}'", "f-strings are not allowed"),
        ("tp is None", "comparison Is is not allowed"),
        ("~tp", "operator Invert is not allowed"),
        ("tp << 1", "operator LShift is not allowed"),
        ("None", "constant None is not allowed"),
        ("__builtins__", "name '__builtins__' is not allowed"),
        ("{'a': 1}", "Dict is not allowed"),
        ("[1, 2]", "list literals are only allowed on the right of 'in'"),
        ("tp in choices", "'in' needs a list or tuple literal"),
        ("max(tp)", "max() takes 2 to any arguments, got 1"),
        ("abs(x=1)", "abs() takes plain positional arguments only"),
        ("tp +", "syntax error"),
        ("", "empty expression"),
    ],
)
def test_refuses_unsafe_or_malformed_expressions(source: str, problem: str) -> None:
    with pytest.raises(ExpressionError) as info:
        Expression(source)
    assert problem in str(info.value)
    assert repr(source.strip()) in str(info.value)


def test_refuses_non_string_source() -> None:
    with pytest.raises(ExpressionError, match="must be a string"):
        Expression(42)  # type: ignore[arg-type]


def test_names_are_the_free_variables_only() -> None:
    expr = Expression("min(tp, pp) * cp if recompute == 'full' else log2(num_gpus)")
    assert expr.names == frozenset({"tp", "pp", "cp", "recompute", "num_gpus"})


def test_unknown_name_is_reported_by_name() -> None:
    with pytest.raises(ExpressionError, match="unknown name 'heads'"):
        Expression("heads % tp == 0").evaluate({"tp": 2})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("7 + 2 * 3 - 1", 12),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("-x + +x * 2", 3),
        ("1 < x < 4", True),
        ("1 < 4 < x", False),
        ("x == 3 != 4", True),
        ("not x > 2", False),
        ("x > 2 and x < 5", True),
        ("x > 5 or x < 2", False),
        ("x in [1, 3]", True),
        ("x not in (1, 3)", False),
        ("'full' in ['none', 'full']", True),
        ("1 in ['1', 2]", False),
        ("'a' + 'b' == 'ab'", True),
        ("10 if x > 2 else 20", 10),
        ("min(5, x, 4)", 3),
        ("max(1, x)", 3),
        ("abs(-x)", 3),
        ("log2(64)", 6.0),
        ("int(3.9)", 3),
        ("float(x)", 3.0),
        ("round(2.6)", 3),
        ("round(2.567, 2)", 2.57),
        ("True + True", 2),
    ],
)
def test_scalar_semantics_match_python(source: str, expected: object) -> None:
    value = Expression(source).evaluate({"x": 3})
    assert value == expected
    assert type(value) is type(expected)


def test_and_or_short_circuit_like_python() -> None:
    # The right-hand side would divide by zero: it must not be evaluated.
    assert Expression("x == 0 or 10 // x > 1").evaluate({"x": 0}) is True
    assert Expression("x != 0 and 10 // x > 1").evaluate({"x": 0}) is False
    assert Expression("0 if x == 0 else 10 // x").evaluate({"x": 0}) == 0
    assert Expression("x > 0 < 10 // x").evaluate({"x": 0}) is False


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("1 // x", "division by zero"),
        ("1 % x", "division by zero"),
        ("1 / x", "division by zero"),
        ("x ** -1", "division by zero"),
        ("log2(x)", "log2() of a non-positive number"),
        ("2 ** 100000", "too large"),
        ("(10 ** 300) ** 300", "too large"),
        ("round(1, -3000000)", "at most 30 digits"),
        ("round(x, 400)", "at most 30 digits"),
        ("'ab' * 1000000", "needs numbers"),
        ("'%s' % x", "needs numbers"),
        ("-'a'", "needs numbers"),
        ("'a' < 1", "TypeError"),
    ],
)
def test_runtime_failures_raise_expression_error(source: str, problem: str) -> None:
    with pytest.raises(ExpressionError) as info:
        Expression(source).evaluate({"x": 0})
    assert problem in str(info.value)
    assert repr(source) in str(info.value)


VECTOR_CASES = [
    "num_gpus % (tp * pp) == 0",
    "num_gpus // (tp * pp)",
    "tp / pp + 1",
    "tp ** 2 - pp",
    "-tp",
    "tp > 1 and pp < 4",
    "tp > 1 and pp < 4 and mode != 'off'",
    "not (tp > 2) or pp == 1",
    "tp == 1 or pp == 1 or mode == 'full'",
    "tp if pp > 2 else pp * 2",
    "1 < tp <= 4",
    "tp < pp < 8",
    "tp in [1, 4]",
    "tp not in [2, 8]",
    "mode in ['none', 'full']",
    "'off' in [mode, 'none']",
    "tp in [pp, 8]",
    "min(tp, pp) + max(tp, 3, pp)",
    "abs(tp - pp)",
    "log2(tp) + float(pp)",
    "int(tp / 3)",
    "round(tp / 3)",
    "round(tp / 3, 1)",
    "mode == 'full' and flag",
    "not flag",
    "flag or tp == 8",
    "mode + '_x' == 'full_x'",
]


@pytest.mark.parametrize("source", VECTOR_CASES)
def test_array_evaluation_matches_elementwise_scalar_evaluation(source: str) -> None:
    rng = np.random.default_rng(7)
    n = 200
    env = {
        "tp": rng.choice([1, 2, 4, 8], n),
        "pp": rng.choice([1, 2, 4, 8, 16], n),
        "mode": rng.choice(["none", "full", "off"], n),
        "flag": rng.random(n) < 0.5,
        "num_gpus": 64,
    }
    expr = Expression(source)
    vector = np.broadcast_to(expr.evaluate(env), (n,))
    for i in range(n):
        row = {k: (v[i].item() if isinstance(v, np.ndarray) else v) for k, v in env.items()}
        expected = expr.evaluate(row)
        assert vector[i] == pytest.approx(expected), (source, row)


def test_array_boolean_operators_give_boolean_arrays() -> None:
    env = {"tp": np.array([1, 2, 4, 8])}
    result = Expression("tp > 1 and tp < 8").evaluate(env)
    assert result.dtype == bool
    assert result.tolist() == [False, True, True, False]
    assert Expression("not tp").evaluate({"tp": np.array([0, 3])}).tolist() == [True, False]


def test_division_by_zero_in_arrays_is_masked_where_python_would_evaluate_it() -> None:
    pp = np.array([0, 2, 3, 0])
    values, bad = Expression("8 % pp == 0").evaluate_masked({"pp": pp})
    assert bad is not None
    assert bad.tolist() == [True, False, False, True]
    assert values[1:3].tolist() == [True, False]

    # Guarded by `or`: where pp == 0 the division is never reached, so nothing is invalid.
    values, bad = Expression("pp == 0 or 8 % pp == 0").evaluate_masked({"pp": pp})
    assert values.tolist() == [True, True, False, True]
    assert bad is None or not bad.any()

    values, bad = Expression("8 // pp if pp > 0 else -1").evaluate_masked({"pp": pp})
    assert values.tolist() == [-1, 4, 2, -1]
    assert bad is None or not bad.any()

    # Partially guarded: only the unguarded zero is invalid.
    _, bad = Expression("pp == 0 and vp == 1 or 8 % pp == 0").evaluate_masked(
        {"pp": pp, "vp": np.array([1, 1, 1, 2])}
    )
    assert bad is not None
    assert bad.tolist() == [False, False, False, True]


def test_plain_evaluate_rejects_array_division_by_zero() -> None:
    with pytest.raises(ExpressionError, match="division by zero"):
        Expression("8 // pp").evaluate({"pp": np.array([1, 0])})


def test_array_huge_exponent_is_refused() -> None:
    with pytest.raises(ExpressionError, match="exponent larger than"):
        Expression("tp ** 1000").evaluate({"tp": np.array([2, 3])})


def test_expressions_compare_and_hash_by_source() -> None:
    assert Expression("tp * pp") == Expression("  tp * pp ")
    assert Expression("tp * pp") != Expression("pp * tp")
    assert len({Expression("a"), Expression("a"), Expression("b")}) == 2
    assert str(Expression("a + 1")) == "a + 1"

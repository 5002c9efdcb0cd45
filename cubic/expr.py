"""A small, safe expression language for search-space conditions, derived values and constraints.

Search spaces are user-supplied YAML, so their expressions must never reach ``eval``: the
source is parsed with :mod:`ast` and only a whitelist of node types is compiled, into a tree
of closures that is built once and evaluated many times.

The language is a subset of Python expressions:

- literals: ints, floats, strings, ``True``/``False``;
- names, looked up in the mapping given to :meth:`Expression.evaluate`;
- arithmetic ``+ - * / // % **`` and unary ``- +`` (on numbers; ``+`` also joins strings);
- comparisons, chained as in Python (``1 <= tp <= 8``), and ``in``/``not in`` against a
  list or tuple literal (``recompute in ['selective', 'full']``);
- ``and``/``or``/``not`` and ``a if cond else b``;
- the functions ``min max abs log2 int float round``.

Every operation also works when names are bound to NumPy arrays, so one evaluation can check
a condition or constraint over thousands of candidate configurations: ``and``/``or``/``not``
become ``np.logical_and/or/not`` and ``if``/``else`` becomes ``np.where``. Python evaluates
the untaken side of ``and``/``or``/``if`` lazily; over arrays both sides are computed, so a
division by zero (or ``log2`` of a non-positive number) is not an error there but marks the
element as invalid, and only where Python would have evaluated it
(see :meth:`Expression.evaluate_masked`).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["FUNCTIONS", "Expression", "ExpressionError"]

MAX_SOURCE_LENGTH = 4000
MAX_POWER_BITS = 4096  # caps scalar `**` so a tiny expression cannot allocate a huge integer
MAX_ARRAY_EXPONENT = 64
MAX_ROUND_DIGITS = 30  # round(x, -3000000) on an int builds a 3-million-digit power of ten

FUNCTIONS = ("abs", "float", "int", "log2", "max", "min", "round")
_ARITY: dict[str, tuple[int, int | None]] = {
    "abs": (1, 1),
    "float": (1, 1),
    "int": (1, 1),
    "log2": (1, 1),
    "max": (2, None),
    "min": (2, None),
    "round": (1, 2),
}

# A compiled node maps an environment to (value, invalid) where `invalid` is None or a
# boolean array marking array elements whose value is meaningless (division by zero...).
_Bad = np.ndarray | None
_Node = Callable[[Mapping[str, Any]], tuple[Any, _Bad]]


class ExpressionError(ValueError):
    """A malformed, disallowed or failing expression; the message quotes the expression."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"expression {source!r}: {problem}")
        self.source = source
        self.problem = problem


class _EvalError(Exception):
    """Raised inside evaluation; wrapped into ExpressionError with the source text."""


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray)


def _union(*bads: _Bad) -> _Bad:
    out: _Bad = None
    for bad in bads:
        if bad is None:
            continue
        out = bad if out is None else np.logical_or(out, bad)
    return out


def _masked(bad: _Bad, where: Any) -> _Bad:
    """Keep `bad` only where `where` holds (Python would have evaluated that operand)."""
    if bad is None:
        return None
    return np.logical_and(bad, where)


def _truth(value: Any) -> Any:
    if _is_array(value):
        return value.astype(bool) if value.dtype != bool else value
    return bool(value)


def _is_number(value: Any) -> bool:
    if _is_array(value):
        return value.dtype.kind in "biuf"
    return isinstance(value, int | float | np.number | np.bool_)


def _is_text(value: Any) -> bool:
    if _is_array(value):
        return value.dtype.kind == "U"
    return isinstance(value, str | np.str_)


def _require_numbers(symbol: str, *values: Any) -> None:
    for value in values:
        if not _is_number(value):
            kind = f"array of {value.dtype}" if _is_array(value) else type(value).__name__
            raise _EvalError(f"'{symbol}' needs numbers, got {kind}")


def _divisor_guard(b: Any) -> tuple[Any, _Bad]:
    """Return a divisor with zeros replaced by one, and the mask of replaced elements."""
    if _is_array(b):
        zero = b == 0
        if zero.any():
            return np.where(zero, 1, b), zero
        return b, None
    if b == 0:
        raise _EvalError("division by zero")
    return b, None


def _power(a: Any, b: Any) -> tuple[Any, _Bad]:
    if _is_array(a) or _is_array(b):
        if np.any(np.abs(b) > MAX_ARRAY_EXPONENT):
            raise _EvalError(f"exponent larger than {MAX_ARRAY_EXPONENT} in '**'")
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        if a_arr.dtype.kind in "biu" and b_arr.dtype.kind in "biu" and np.any(b_arr < 0):
            a = a_arr.astype(np.float64)
        return np.power(a, b), None
    if isinstance(a, int | np.integer) and isinstance(b, int | np.integer):
        base, exp = int(a), int(b)
        if exp < 0:
            if base == 0:
                raise _EvalError("division by zero")
            return float(base) ** exp, None
        if abs(base) > 1 and base.bit_length() * exp > MAX_POWER_BITS:
            raise _EvalError("result of '**' is too large")
        return base**exp, None
    try:
        return a**b, None
    except ZeroDivisionError as exc:
        raise _EvalError("division by zero") from exc


def _binop(symbol: str, a: Any, b: Any) -> tuple[Any, _Bad]:
    if symbol == "+" and _is_text(a) and _is_text(b):
        return (np.char.add(a, b) if _is_array(a) or _is_array(b) else a + b), None
    _require_numbers(symbol, a, b)
    if symbol == "+":
        return a + b, None
    if symbol == "-":
        return a - b, None
    if symbol == "*":
        return a * b, None
    if symbol == "**":
        return _power(a, b)
    b, bad = _divisor_guard(b)
    if symbol == "/":
        return a / b, bad
    if symbol == "//":
        return a // b, bad
    return a % b, bad


_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def _membership(value: Any, options: list[Any]) -> Any:
    if _is_array(value) or any(_is_array(o) for o in options):
        hit: Any = np.zeros((), dtype=bool)
        for option in options:
            hit = np.logical_or(hit, np.asarray(value == option, dtype=bool))
        return hit
    return any(value == option for option in options if _is_text(value) == _is_text(option))


def _call(name: str, args: list[Any]) -> tuple[Any, _Bad]:
    arrays = any(_is_array(a) for a in args)
    if name == "min" or name == "max":
        _require_numbers(f"{name}()", *args)
        if not arrays:
            return (min if name == "min" else max)(args), None
        reduce = np.minimum if name == "min" else np.maximum
        out = args[0]
        for arg in args[1:]:
            out = reduce(out, arg)
        return out, None
    if name == "round":
        _require_numbers("round()", *args)
        if len(args) == 2 and not isinstance(args[1], int | np.integer):
            raise _EvalError("round() needs an integer number of digits")
        if len(args) == 2 and abs(int(args[1])) > MAX_ROUND_DIGITS:
            raise _EvalError(f"round() takes at most {MAX_ROUND_DIGITS} digits either way")
        if not arrays:
            return (round(args[0]) if len(args) == 1 else round(args[0], int(args[1]))), None
        if len(args) == 1:
            return np.round(args[0]).astype(np.int64), None
        return np.round(args[0], int(args[1])), None
    (x,) = args
    _require_numbers(f"{name}()", x)
    if name == "abs":
        return (np.abs(x) if arrays else abs(x)), None
    if name == "float":
        return (x.astype(np.float64) if arrays else float(x)), None
    if name == "int":
        if not arrays:
            return int(x), None
        if x.dtype.kind == "f":
            finite = np.isfinite(x)
            bad = None if finite.all() else ~finite
            return np.trunc(np.where(finite, x, 0)).astype(np.int64), bad
        return x.astype(np.int64), None
    # log2
    if not arrays:
        if x <= 0:
            raise _EvalError("log2() of a non-positive number")
        return math.log2(x), None
    nonpositive = x <= 0
    bad = nonpositive if nonpositive.any() else None
    return np.log2(np.where(nonpositive, 1, x)), bad


class _Compiler:
    """Turns a whitelisted AST into closures, collecting the free names on the way."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.names: set[str] = set()

    def fail(self, problem: str) -> ExpressionError:
        return ExpressionError(self.source, problem)

    def compile(self, node: ast.AST) -> _Node:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            raise self.fail(_describe_refusal(node))
        return method(node)

    def _Constant(self, node: ast.Constant) -> _Node:
        value = node.value
        if value is None or not isinstance(value, bool | int | float | str):
            raise self.fail(f"constant {value!r} is not allowed")
        return lambda env: (value, None)

    def _Name(self, node: ast.Name) -> _Node:
        name = node.id
        if name.startswith("__"):
            raise self.fail(f"name {name!r} is not allowed")
        self.names.add(name)
        source = self.source

        def lookup(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
            try:
                return env[name], None
            except KeyError:
                raise ExpressionError(source, f"unknown name {name!r}") from None

        return lookup

    def _BinOp(self, node: ast.BinOp) -> _Node:
        symbol = _BINOPS.get(type(node.op))
        if symbol is None:
            raise self.fail(f"operator {type(node.op).__name__} is not allowed")
        left, right = self.compile(node.left), self.compile(node.right)

        def binop(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
            a, bad_a = left(env)
            b, bad_b = right(env)
            value, bad = _binop(symbol, a, b)
            return value, _union(bad_a, bad_b, bad)

        return binop

    def _UnaryOp(self, node: ast.UnaryOp) -> _Node:
        operand = self.compile(node.operand)
        if isinstance(node.op, ast.Not):

            def not_(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
                value, bad = operand(env)
                return (np.logical_not(value) if _is_array(value) else not value), bad

            return not_
        if isinstance(node.op, ast.USub | ast.UAdd):
            negate = isinstance(node.op, ast.USub)
            symbol = "-" if negate else "+"

            def sign(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
                value, bad = operand(env)
                _require_numbers(f"unary {symbol}", value)
                return (-value if negate else +value), bad

            return sign
        raise self.fail(f"operator {type(node.op).__name__} is not allowed")

    def _BoolOp(self, node: ast.BoolOp) -> _Node:
        is_and = isinstance(node.op, ast.And)
        operands = [self.compile(v) for v in node.values]

        def boolop(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
            value, bad = operands[0](env)
            for operand in operands[1:]:
                if not _is_array(value):
                    # Python semantics: short-circuit and return the deciding operand.
                    if bool(value) != is_and:
                        return value, bad
                    value, bad_next = operand(env)
                    bad = _union(bad, bad_next)
                    continue
                truth = _truth(value)
                nxt, bad_next = operand(env)
                reached = truth if is_and else np.logical_not(truth)
                bad = _union(bad, _masked(bad_next, reached))
                combine = np.logical_and if is_and else np.logical_or
                value = combine(truth, _truth(nxt))
            return value, bad

        return boolop

    def _Compare(self, node: ast.Compare) -> _Node:
        first = self.compile(node.left)
        steps: list[tuple[str, Any, _Node | list[_Node]]] = []
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            if isinstance(op, ast.In | ast.NotIn):
                if not isinstance(comparator, ast.List | ast.Tuple):
                    raise self.fail("'in' needs a list or tuple literal on its right")
                items = [self.compile(elt) for elt in comparator.elts]
                steps.append(("in" if isinstance(op, ast.In) else "not in", None, items))
            elif type(op) in _COMPARE:
                steps.append(("cmp", _COMPARE[type(op)], self.compile(comparator)))
            else:
                raise self.fail(f"comparison {type(op).__name__} is not allowed")

        def compare(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
            left, bad = first(env)
            result: Any = True
            for kind, fn, right_node in steps:
                if not _is_array(result) and not result:
                    return False, bad
                if isinstance(right_node, list):
                    options = []
                    for item in right_node:
                        option, bad_item = item(env)
                        bad = _union(bad, bad_item)
                        options.append(option)
                    right = None
                    outcome = _membership(left, options)
                    if kind == "not in":
                        outcome = np.logical_not(outcome) if _is_array(outcome) else not outcome
                    bad_right = None
                else:
                    right, bad_right = right_node(env)
                    outcome = fn(left, right)
                    if _is_array(outcome) and outcome.dtype != bool:
                        outcome = outcome.astype(bool)
                if _is_array(result):
                    bad = _union(bad, _masked(bad_right, result))
                    result = np.logical_and(result, outcome)
                else:
                    bad = _union(bad, bad_right)
                    result = outcome
                left = right
            return result, bad

        return compare

    def _IfExp(self, node: ast.IfExp) -> _Node:
        test, body, orelse = (self.compile(n) for n in (node.test, node.body, node.orelse))

        def ifexp(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
            cond, bad = test(env)
            if not _is_array(cond):
                value, bad_branch = body(env) if cond else orelse(env)
                return value, _union(bad, bad_branch)
            cond = _truth(cond)
            yes, bad_yes = body(env)
            no, bad_no = orelse(env)
            bad = _union(bad, _masked(bad_yes, cond), _masked(bad_no, np.logical_not(cond)))
            return np.where(cond, yes, no), bad

        return ifexp

    def _Call(self, node: ast.Call) -> _Node:
        if not isinstance(node.func, ast.Name) or node.func.id not in _ARITY:
            what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise self.fail(
                f"calling {what!r} is not allowed (allowed functions: {', '.join(FUNCTIONS)})"
            )
        name = node.func.id
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.fail(f"{name}() takes plain positional arguments only")
        low, high = _ARITY[name]
        if len(node.args) < low or (high is not None and len(node.args) > high):
            expected = f"{low}" if low == high else f"{low} to {high or 'any'}"
            raise self.fail(f"{name}() takes {expected} arguments, got {len(node.args)}")
        args = [self.compile(a) for a in node.args]

        def call(env: Mapping[str, Any]) -> tuple[Any, _Bad]:
            values, bads = [], []
            for arg in args:
                value, bad = arg(env)
                values.append(value)
                bads.append(bad)
            value, bad = _call(name, values)
            return value, _union(*bads, bad)

        return call

    def _List(self, node: ast.List) -> _Node:
        raise self.fail("list literals are only allowed on the right of 'in'")

    _Tuple = _List


def _describe_refusal(node: ast.AST) -> str:
    kind = type(node).__name__
    messages = {
        "Attribute": "attribute access is not allowed",
        "Subscript": "subscripts are not allowed",
        "Lambda": "lambda is not allowed",
        "NamedExpr": "assignment expressions are not allowed",
        "JoinedStr": "f-strings are not allowed",
        "ListComp": "comprehensions are not allowed",
        "SetComp": "comprehensions are not allowed",
        "DictComp": "comprehensions are not allowed",
        "GeneratorExp": "comprehensions are not allowed",
        "Await": "await is not allowed",
        "Yield": "yield is not allowed",
        "Starred": "starred expressions are not allowed",
    }
    return messages.get(kind, f"{kind} is not allowed")


class Expression:
    """A compiled, side-effect-free expression over named values (scalars or NumPy arrays).

    Compile once, evaluate many times; equality and hashing follow the source text so that
    frozen search spaces holding expressions compare by content.
    """

    __slots__ = ("_root", "names", "source")

    def __init__(self, source: str) -> None:
        if not isinstance(source, str):
            raise ExpressionError(repr(source), "an expression must be a string")
        self.source = source.strip()
        if not self.source:
            raise ExpressionError(source, "empty expression")
        if len(self.source) > MAX_SOURCE_LENGTH:
            raise ExpressionError(
                self.source[:40] + "...", f"longer than {MAX_SOURCE_LENGTH} characters"
            )
        try:
            tree = ast.parse(self.source, mode="eval")
        except SyntaxError as exc:
            raise ExpressionError(self.source, f"syntax error: {exc.msg}") from None
        except (RecursionError, MemoryError, ValueError) as exc:
            raise ExpressionError(self.source, f"cannot be parsed: {exc}") from None
        compiler = _Compiler(self.source)
        try:
            self._root = compiler.compile(tree.body)
        except RecursionError:
            raise ExpressionError(self.source, "nested too deeply") from None
        self.names: frozenset[str] = frozenset(compiler.names)

    def evaluate(self, env: Mapping[str, Any]) -> Any:
        """Evaluate with names bound by `env`; raises ExpressionError on any failure.

        With array values, a division by zero in any element that Python semantics would
        reach is an error too; use :meth:`evaluate_masked` to get those elements marked.
        """
        value, bad = self.evaluate_masked(env)
        if bad is not None and np.any(bad):
            count = int(np.count_nonzero(bad))
            raise ExpressionError(
                self.source, f"division by zero or log2 of a non-positive number ({count} elements)"
            )
        return value

    def evaluate_masked(self, env: Mapping[str, Any]) -> tuple[Any, np.ndarray | None]:
        """Evaluate, returning ``(value, invalid)`` instead of failing on per-element errors.

        ``invalid`` is None or a boolean array (broadcastable to the value) marking elements
        where a division by zero or a bad ``log2`` happened; their values are meaningless.
        Scalar failures and type errors still raise ExpressionError.
        """
        try:
            with np.errstate(all="ignore"):
                return self._root(env)
        except ExpressionError:
            raise
        except _EvalError as exc:
            raise ExpressionError(self.source, str(exc)) from None
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise ExpressionError(self.source, f"{type(exc).__name__}: {exc}") from None

    def __reduce__(self) -> tuple[type[Expression], tuple[str]]:
        # The compiled closures cannot be pickled; recompiling from source is cheap.
        return (Expression, (self.source,))

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"

    def __str__(self) -> str:
        return self.source

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expression) and other.source == self.source

    def __hash__(self) -> int:
        return hash(("Expression", self.source))

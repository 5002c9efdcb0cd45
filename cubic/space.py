"""Search spaces: the knobs of a training job, their ranges, conditions and constraints.

A space is pure data (no I/O beyond loading its YAML file) so that strategies, the tuner and
the simulator can share one definition and check configurations the same way. Every check
exists twice: per configuration (:meth:`Space.validate`) and vectorised over NumPy arrays
(:meth:`Space.sample_arrays`, :meth:`Space.enumerate_arrays`), which is what makes sampling
or enumerating hundreds of thousands of candidates cheap; both give the same answers.

YAML format
-----------
::

    name: llm_pretrain                # optional; defaults to the file name
    description: Megatron-LM knobs    # optional
    parameters:                       # required, ordered; each a mapping with a `type`
      tp: {type: categorical, choices: [1, 2, 4, 8]}
      pp: {type: int, low: 1, high: 16, step: 1, log: false}
      lr: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}   # `step` makes it finite
      recompute: {type: categorical, choices: [none, selective, full]}
      vp: {type: categorical, choices: [1, 2, 4], default: 1, when: "pp > 1"}
      sequence_parallel: {type: bool, default: false, when: "tp > 1"}
    derived:                          # optional, ordered: name -> expression
      dp: "num_gpus // (tp * pp * cp)"
    constraints:                      # optional: expressions, or {expr, message}
      - "heads % tp == 0"
      - expr: "num_gpus % (tp * pp * cp) == 0"
        message: "tp * pp * cp must divide the GPU count"

Parameter keys: ``type`` (``int``, ``float``, ``categorical``, ``bool``); ``int``: ``low``,
``high``, optional ``step`` (default 1) and ``log`` (log-uniform sampling, as Optuna's
``IntDistribution``; exclusive with ``step``); ``float``: ``low``, ``high``, optional ``step``
or ``log``; ``categorical``: ``choices`` (a non-empty list of distinct strings, numbers or
booleans; prefer it for powers of two); every type: optional ``default``, ``when`` and
``description``.

``when`` makes a parameter conditional: it exists only where the expression is true and
otherwise takes its ``default`` (required for conditional parameters, and not necessarily
one of its choices: ``cache_load_factor`` is 1.0 when nothing is cached). A condition may
use only parameters declared before it and workload fields, so the parameters form a DAG in
declaration order. Derived values are computed after all parameters, in order, and appear
in completed configurations. Expressions (see :mod:`cubic.expr`) resolve names to
parameters, then derived values, then the workload *context* passed by the caller
(``num_gpus``, ``heads``, ...); any other name is reported when a context is bound.

A configuration is a plain ``dict``: every parameter (inactive ones at their default) and
every derived value. Optuna's define-by-run samplers see an inactive parameter as absent;
:meth:`Space.complete` fills it in.
"""

from __future__ import annotations

import difflib
import keyword
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import yaml

from cubic.expr import Expression, ExpressionError

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

__all__ = [
    "BoolParameter",
    "CategoricalParameter",
    "Constraint",
    "Derived",
    "FloatParameter",
    "IntParameter",
    "Parameter",
    "Removals",
    "Space",
    "SpaceError",
    "validate_file",
]

MAX_GRID = 10_000_000  # refuse to materialise one parameter's grid beyond this
MAX_PARAMETERS = 64  # the shipped spaces have about 20; each one is a column of every pool
MAX_CONDITION_DEPTH = 8  # `when:` of `when:`...: real spaces nest two or three levels
# Random draws that find no valid configuration before a space too large to enumerate is
# called empty (a study's survey refuses one where under one draw in a thousand is valid
# anyway), and the rows enumerated at most to check or explain an empty space.
EMPTY_DRAWS = 200_000
EMPTY_ROWS = 1_000_000
_TOP_KEYS = ("name", "description", "parameters", "derived", "constraints")
_COMMON_KEYS = ("type", "default", "when", "description")


class SpaceError(ValueError):
    """An invalid search space, or a context that does not fit it; the message says where."""


class _TooMany(SpaceError):
    """An enumeration would grow past its ``max_rows``."""


def _kind(value: Any) -> str:
    """Coarse value kind; bool is kept apart from numbers so that True never equals 1."""
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, int | float | np.integer | np.floating):
        return "number"
    if isinstance(value, str):
        return "str"
    return "other"


def _same(a: Any, b: Any) -> bool:
    return _kind(a) == _kind(b) and bool(a == b)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _number(value: Any, what: str, name: str) -> float:
    """A YAML number; strings like '1e-3' (which YAML 1.1 leaves as text) are accepted."""
    if _kind(value) == "number":
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise SpaceError(f"parameter {name!r}: {what} must be a number, got {value!r}")


# ----------------------------------------------------------------------------- parameters


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One knob. Subclasses define its domain; `when`/`default` make it conditional."""

    type: ClassVar[str] = ""
    name: str
    default: Any = None
    when: Expression | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.when is not None and self.default is None:
            self._fail(
                "has a 'when' condition but no 'default' (the value it takes when the "
                "condition is false)"
            )
        if self.default is not None:
            if not self._default_type_ok(self.default):
                self._fail(f"default {self.default!r} has the wrong type for a {self.type}")
            if self.when is None and not self.contains(self.default):
                self._fail(f"default {self.default!r} is not {self.domain_text()}")

    def _fail(self, problem: str) -> None:
        raise SpaceError(f"parameter {self.name!r}: {problem}")

    def _default_type_ok(self, value: Any) -> bool:
        return True

    @property
    def is_finite(self) -> bool:
        return True

    def contains(self, value: Any) -> bool:
        """Whether `value` is in the domain (the default of an inactive one is not checked)."""
        raise NotImplementedError

    def domain_text(self) -> str:
        raise NotImplementedError

    def grid(self) -> np.ndarray:
        """All values of a finite parameter, in order."""
        raise NotImplementedError

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` independent draws from the declared distribution."""
        raise NotImplementedError

    def array(self, values: Sequence[Any]) -> np.ndarray:
        """Values (including the default) as an array of this parameter's dtype."""
        raise NotImplementedError

    def to_python(self, values: np.ndarray) -> list[Any]:
        """Array elements back to the plain Python values a config holds."""
        return values.tolist()

    def distribution(self) -> BaseDistribution:
        raise NotImplementedError

    def _spec(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, **self._spec()}
        if self.default is not None:
            out["default"] = self.default
        if self.when is not None:
            out["when"] = self.when.source
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True, kw_only=True)
class IntParameter(Parameter):
    """Integers low..high by step; `log` samples log-uniformly (Optuna's IntDistribution)."""

    type: ClassVar[str] = "int"
    low: int
    high: int
    step: int = 1
    log: bool = False

    def __post_init__(self) -> None:
        for key in ("low", "high", "step"):
            if not _is_int(getattr(self, key)):
                self._fail(f"{key} must be an integer, got {getattr(self, key)!r}")
        if not isinstance(self.log, bool):
            self._fail(f"log must be true or false, got {self.log!r}")
        if self.low > self.high:
            self._fail(f"low ({self.low}) is greater than high ({self.high})")
        if self.step < 1:
            self._fail(f"step must be at least 1, got {self.step}")
        if (self.high - self.low) % self.step:
            self._fail(
                f"high ({self.high}) is not low ({self.low}) plus a multiple of step ({self.step})"
            )
        if self.log and self.low <= 0:
            self._fail(f"a log-scale range needs low > 0, got low={self.low}")
        if self.log and self.step != 1:
            self._fail("log and step cannot be combined (Optuna samples log ranges by 1)")
        if (self.high - self.low) // self.step + 1 > MAX_GRID:
            self._fail(f"has more than {MAX_GRID} values")
        super().__post_init__()

    def _default_type_ok(self, value: Any) -> bool:
        return _is_int(value)

    def contains(self, value: Any) -> bool:
        return (
            _is_int(value)
            and self.low <= value <= self.high
            and ((value - self.low) % self.step == 0)
        )

    def domain_text(self) -> str:
        step = f" in steps of {self.step}" if self.step != 1 else ""
        return f"an integer in [{self.low}, {self.high}]{step}"

    def grid(self) -> np.ndarray:
        return np.arange(self.low, self.high + 1, self.step, dtype=np.int64)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.log:
            lo, hi = math.log(self.low - 0.5), math.log(self.high + 0.5)
            values = np.rint(np.exp(rng.uniform(lo, hi, n))).astype(np.int64)
            return np.clip(values, self.low, self.high)
        count = (self.high - self.low) // self.step + 1
        return self.low + self.step * rng.integers(0, count, n, dtype=np.int64)

    def array(self, values: Sequence[Any]) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    def distribution(self) -> BaseDistribution:
        from optuna.distributions import IntDistribution

        return IntDistribution(self.low, self.high, log=self.log, step=self.step)

    def _spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.step != 1:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        return out


@dataclass(frozen=True, kw_only=True)
class FloatParameter(Parameter):
    """Reals in [low, high]; continuous unless `step` makes a grid (Optuna's FloatDistribution)."""

    type: ClassVar[str] = "float"
    low: float
    high: float
    step: float | None = None
    log: bool = False

    def __post_init__(self) -> None:
        for key in ("low", "high") + (("step",) if self.step is not None else ()):
            value = getattr(self, key)
            if _kind(value) != "number" or not math.isfinite(value):
                self._fail(f"{key} must be a finite number, got {value!r}")
        if not isinstance(self.log, bool):
            self._fail(f"log must be true or false, got {self.log!r}")
        if self.low > self.high:
            self._fail(f"low ({self.low}) is greater than high ({self.high})")
        if self.log and self.low <= 0:
            self._fail(f"a log-scale range needs low > 0, got low={self.low}")
        if self.step is not None:
            if self.log:
                self._fail("log and step cannot be combined")
            if self.step <= 0:
                self._fail(f"step must be positive, got {self.step}")
            ratio = (self.high - self.low) / self.step
            if abs(ratio - round(ratio)) > 1e-9 * max(1.0, ratio):
                self._fail(
                    f"high ({self.high}) is not low ({self.low}) plus a multiple of "
                    f"step ({self.step})"
                )
            if round(ratio) + 1 > MAX_GRID:
                self._fail(f"has more than {MAX_GRID} values")
        super().__post_init__()

    def _default_type_ok(self, value: Any) -> bool:
        return _kind(value) == "number"

    @property
    def is_finite(self) -> bool:
        return self.step is not None

    def _count(self) -> int:
        assert self.step is not None
        return round((self.high - self.low) / self.step) + 1

    def contains(self, value: Any) -> bool:
        if _kind(value) != "number" or not self.low <= value <= self.high:
            return False
        if self.step is None:
            return True
        k = (value - self.low) / self.step
        return abs(k - round(k)) <= 1e-9 * max(1.0, abs(k))

    def domain_text(self) -> str:
        step = f" in steps of {self.step}" if self.step is not None else ""
        return f"a number in [{self.low}, {self.high}]{step}"

    def grid(self) -> np.ndarray:
        if self.step is None:
            raise SpaceError(f"parameter {self.name!r}: a continuous float has no grid")
        return self.low + self.step * np.arange(self._count(), dtype=np.float64)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.step is not None:
            return self.low + self.step * rng.integers(0, self._count(), n).astype(np.float64)
        if self.log:
            return np.exp(rng.uniform(math.log(self.low), math.log(self.high), n))
        return rng.uniform(self.low, self.high, n)

    def array(self, values: Sequence[Any]) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def distribution(self) -> BaseDistribution:
        from optuna.distributions import FloatDistribution

        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def _spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"low": self.low, "high": self.high}
        if self.step is not None:
            out["step"] = self.step
        if self.log:
            out["log"] = True
        return out


@dataclass(frozen=True, kw_only=True)
class CategoricalParameter(Parameter):
    """An unordered choice among strings, numbers or booleans."""

    type: ClassVar[str] = "categorical"
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if isinstance(self.choices, str | bytes) or not isinstance(self.choices, Iterable):
            self._fail(f"choices must be a list, got {self.choices!r}")
        object.__setattr__(self, "choices", tuple(self.choices))
        if not self.choices:
            self._fail("choices is empty")
        for i, choice in enumerate(self.choices):
            if _kind(choice) == "other":
                self._fail(f"choice {choice!r} is not a string, number or boolean")
            if any(_same(choice, other) for other in self.choices[:i]):
                self._fail(f"choice {choice!r} is listed twice")
        super().__post_init__()

    def _default_type_ok(self, value: Any) -> bool:
        return _kind(value) in {_kind(c) for c in self.choices}

    def contains(self, value: Any) -> bool:
        return any(_same(value, c) for c in self.choices)

    def domain_text(self) -> str:
        return f"one of {list(self.choices)}"

    def _values(self) -> list[Any]:
        extra = [self.default] if self.default is not None else []
        return list(self.choices) + extra

    def _dtype(self) -> Any:
        kinds = {_kind(v) for v in self._values()}
        if kinds == {"bool"}:
            return bool
        if kinds == {"number"}:
            all_int = all(_is_int(v) for v in self._values())
            return np.int64 if all_int else np.float64
        if kinds == {"str"}:
            return str
        return object

    def grid(self) -> np.ndarray:
        return self.array(self.choices)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.grid()[rng.integers(0, len(self.choices), n)]

    def array(self, values: Sequence[Any]) -> np.ndarray:
        dtype = self._dtype()
        if dtype is object:
            out = np.empty(len(values), dtype=object)
            out[:] = list(values)
            return out
        return np.asarray(values, dtype=dtype)

    def to_python(self, values: np.ndarray) -> list[Any]:
        plain = values.tolist()
        if self._dtype() is np.float64 and any(_is_int(v) for v in self._values()):
            canon = {v: v for v in self._values()}  # 4.0 -> 4 where 4 is the declared choice
            return [canon.get(v, v) for v in plain]
        return plain

    def distribution(self) -> BaseDistribution:
        from optuna.distributions import CategoricalDistribution

        return CategoricalDistribution(self.choices)

    def _spec(self) -> dict[str, Any]:
        return {"choices": list(self.choices)}


@dataclass(frozen=True, kw_only=True)
class BoolParameter(Parameter):
    """A switch; sampled as a fair coin."""

    type: ClassVar[str] = "bool"

    def _default_type_ok(self, value: Any) -> bool:
        return _kind(value) == "bool"

    def contains(self, value: Any) -> bool:
        return _kind(value) == "bool"

    def domain_text(self) -> str:
        return "true or false"

    def grid(self) -> np.ndarray:
        return np.array([False, True])

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(0, 2, n).astype(bool)

    def array(self, values: Sequence[Any]) -> np.ndarray:
        return np.asarray(values, dtype=bool)

    def distribution(self) -> BaseDistribution:
        from optuna.distributions import CategoricalDistribution

        return CategoricalDistribution((False, True))


_PARAMETER_TYPES: dict[str, type[Parameter]] = {
    cls.type: cls for cls in (IntParameter, FloatParameter, CategoricalParameter, BoolParameter)
}
_TYPE_KEYS: dict[str, tuple[str, ...]] = {
    "int": ("low", "high", "step", "log"),
    "float": ("low", "high", "step", "log"),
    "categorical": ("choices",),
    "bool": (),
}
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "int": ("low", "high"),
    "float": ("low", "high"),
    "categorical": ("choices",),
    "bool": (),
}


@dataclass(frozen=True)
class Derived:
    """A value computed from parameters (and workload fields), e.g. the data-parallel size."""

    name: str
    expr: Expression


@dataclass(frozen=True)
class Constraint:
    """A condition every valid configuration meets; `message` explains a violation."""

    expr: Expression
    message: str | None = None

    @property
    def reason(self) -> str:
        return self.message or f"constraint {self.expr.source!r} is violated"


# ----------------------------------------------------------------------------- the space


@dataclass(frozen=True)
class Removals:
    """What each constraint of a space removes on its own (see :meth:`Space.removals`)."""

    total: int
    """Configurations before any constraint (random draws when not ``exhaustive``)."""
    exhaustive: bool
    """Counted over every configuration, not over random draws."""
    removed: tuple[int, ...]
    """Per constraint, in declaration order: how many of ``total`` it alone removes."""


def _share(part: int, whole: int) -> str:
    """A percentage that says 100% only when it is all, and 0% only when it is none."""
    if part in (0, whole):
        return f"{part / whole:.0%}"
    return f"{min(max(part / whole, 0.01), 0.99):.0%}"


@dataclass(frozen=True)
class Space:
    """An immutable search space. Build it with :meth:`from_yaml` or :meth:`from_dict`."""

    name: str
    parameters: tuple[Parameter, ...]
    derived: tuple[Derived, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    description: str = ""
    source: str = field(default="<inline>", compare=False)
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _stages: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", tuple(self.parameters))
        object.__setattr__(self, "derived", tuple(self.derived))
        object.__setattr__(self, "constraints", tuple(self.constraints))
        if not self.parameters:
            raise self._error("a space needs at least one parameter")
        if len(self.parameters) > MAX_PARAMETERS:
            raise self._error(
                f"{len(self.parameters)} parameters: a space may have at most {MAX_PARAMETERS}"
            )
        index: dict[str, int] = {}
        depth: dict[str, int] = {}  # how many conditions deep each parameter sits
        for i, p in enumerate(self.parameters):
            self._check_name(p.name, "parameter")
            if p.name in index:
                raise self._error(f"parameter {p.name!r} is declared twice")
            index[p.name] = i
            depth[p.name] = 0
            if p.when is not None:
                self._check_condition(p, index)
                depth[p.name] = 1 + max((depth.get(n, 0) for n in p.when.names), default=0)
                if depth[p.name] > MAX_CONDITION_DEPTH:
                    raise self._error(
                        f"parameter {p.name!r}: its condition depends on a chain of more than "
                        f"{MAX_CONDITION_DEPTH} conditions"
                    )
        derived_names: set[str] = set()
        for d in self.derived:
            self._check_name(d.name, "derived")
            if d.name in index or d.name in derived_names:
                raise self._error(f"derived {d.name!r}: the name is already taken")
            later = d.expr.names & ({x.name for x in self.derived} - derived_names)
            if later:
                raise self._error(
                    f"derived {d.name!r}: {d.expr.source!r} uses {sorted(later)[0]!r}, which is "
                    "not derived before it (derived values are computed in order)"
                )
            derived_names.add(d.name)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_stages", self._plan_stages())

    # -- construction

    def _error(self, problem: str) -> SpaceError:
        return SpaceError(f"{self.source}: {problem}")

    def _check_name(self, name: Any, what: str) -> None:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise self._error(f"{what} name {name!r} is not a valid identifier")
        if name.startswith("__"):
            raise self._error(f"{what} name {name!r} must not start with '__'")

    def _check_condition(self, p: Parameter, declared: Mapping[str, int]) -> None:
        assert p.when is not None
        derived = {d.name for d in self.derived}
        for name in sorted(p.when.names):
            if name == p.name:
                problem = "uses the parameter itself"
            elif name in derived:
                problem = f"uses derived value {name!r}; derived values are computed after all"
                problem += " parameters"
            elif name not in declared and any(q.name == name for q in self.parameters):
                problem = f"uses parameter {name!r}, which is declared after it"
            else:
                continue
            raise self._error(
                f"parameter {p.name!r}: condition {p.when.source!r} {problem} (conditions may "
                "only use parameters declared before and workload fields)"
            )

    def _param_deps(self, names: Iterable[str]) -> set[str]:
        """Parameters an expression depends on, directly or through derived values."""
        by_name = {d.name: d for d in self.derived}
        out: set[str] = set()
        stack = list(names)
        seen: set[str] = set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self._index:
                out.add(name)
            elif name in by_name:
                stack.extend(by_name[name].expr.names)
        return out

    def _plan_stages(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """For k = 0..len(parameters): the derived values and constraints computable once the
        first k parameters are known, so enumeration can prune as early as possible."""

        def level(names: Iterable[str]) -> int:
            return max((self._index[n] + 1 for n in self._param_deps(names)), default=0)

        stages: list[tuple[list[int], list[int]]] = [
            ([], []) for _ in range(len(self.parameters) + 1)
        ]
        for j, d in enumerate(self.derived):
            # A derived value also waits for the derived values it reads (declared earlier).
            stages[level(d.expr.names)][0].append(j)
        for j, c in enumerate(self.constraints):
            stages[level(c.expr.names)][1].append(j)
        return tuple((tuple(ds), tuple(cs)) for ds, cs in stages)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Space:
        """Load a space from a YAML file; every problem is a SpaceError naming the file."""
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise SpaceError(f"{source}: cannot read the file: {exc.strerror or exc}") from None
        try:
            data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = exc.problem or exc.context or "unreadable"
            raise SpaceError(f"{source}: invalid YAML{where}: {problem}") from None
        except yaml.YAMLError as exc:
            raise SpaceError(f"{source}: invalid YAML: {exc}") from None
        if data is None:
            raise SpaceError(f"{source}: the file is empty")
        if isinstance(data, Mapping) and "name" not in data:
            data = {"name": Path(path).stem, **data}
        return cls.from_dict(data, source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<inline>") -> Space:
        """Build a space from the YAML structure (see the module docstring)."""

        def fail(problem: str) -> SpaceError:
            return SpaceError(f"{source}: {problem}")

        if not isinstance(data, Mapping):
            raise fail(f"a space must be a mapping, got {type(data).__name__}")
        unknown = [k for k in data if k not in _TOP_KEYS]
        if unknown:
            raise fail(f"unknown top-level key {unknown[0]!r} (expected: {', '.join(_TOP_KEYS)})")
        name = data.get("name", "inline")
        description = data.get("description") or ""
        if not isinstance(name, str) or not isinstance(description, str):
            raise fail("'name' and 'description' must be strings")
        specs = data.get("parameters")
        if not isinstance(specs, Mapping) or not specs:
            raise fail("'parameters' must be a non-empty mapping of name -> specification")
        try:
            parameters = tuple(_parse_parameter(k, v) for k, v in specs.items())
        except SpaceError as exc:
            raise fail(str(exc)) from None

        derived_specs = data.get("derived") or {}
        if not isinstance(derived_specs, Mapping):
            raise fail("'derived' must be a mapping of name -> expression")
        derived = []
        for key, text in derived_specs.items():
            if _kind(text) == "number":
                text = str(text)
            if not isinstance(text, str):
                raise fail(f"derived {key!r}: the expression must be a string, got {text!r}")
            try:
                derived.append(Derived(str(key), Expression(text)))
            except ExpressionError as exc:
                raise fail(f"derived {key!r}: {exc}") from None

        constraint_specs = data.get("constraints") or []
        if not isinstance(constraint_specs, list):
            raise fail("'constraints' must be a list")
        constraints = []
        for i, spec in enumerate(constraint_specs, start=1):
            message = None
            if isinstance(spec, Mapping):
                extra = [k for k in spec if k not in ("expr", "message")]
                if extra or "expr" not in spec:
                    raise fail(f"constraint {i}: expected keys 'expr' and optional 'message'")
                message = spec.get("message")
                if message is not None and not isinstance(message, str):
                    raise fail(f"constraint {i}: 'message' must be a string")
                spec = spec["expr"]
            if not isinstance(spec, str):
                raise fail(f"constraint {i}: the expression must be a string, got {spec!r}")
            try:
                constraints.append(Constraint(Expression(spec), message))
            except ExpressionError as exc:
                raise fail(f"constraint {i}: {exc}") from None
        return cls(
            name=name,
            parameters=parameters,
            derived=tuple(derived),
            constraints=tuple(constraints),
            description=description,
            source=source,
        )

    def to_dict(self) -> dict[str, Any]:
        """The YAML structure; ``Space.from_dict(space.to_dict()) == space``."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out["parameters"] = {p.name: p.to_dict() for p in self.parameters}
        if self.derived:
            out["derived"] = {d.name: d.expr.source for d in self.derived}
        if self.constraints:
            out["constraints"] = [
                {"expr": c.expr.source, **({"message": c.message} if c.message else {})}
                for c in self.constraints
            ]
        return out

    # -- introspection

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names in declaration order."""
        return tuple(p.name for p in self.parameters)

    @property
    def derived_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.derived)

    @property
    def context_names(self) -> frozenset[str]:
        """Names the expressions read from the workload context."""
        used: set[str] = set()
        for expr in self._expressions():
            used |= expr.names
        return frozenset(used - set(self._index) - set(self.derived_names))

    def __getitem__(self, name: str) -> Parameter:
        return self.parameters[self._index[name]]

    def __len__(self) -> int:
        return len(self.parameters)

    @property
    def is_finite(self) -> bool:
        return all(p.is_finite for p in self.parameters)

    def _expressions(self) -> list[Expression]:
        exprs = [p.when for p in self.parameters if p.when is not None]
        return exprs + [d.expr for d in self.derived] + [c.expr for c in self.constraints]

    def check_context(self, context: Mapping[str, Any]) -> None:
        """Raise SpaceError unless `context` provides every workload field the space reads."""
        missing = sorted(self.context_names - set(context))
        if missing:
            where = {}
            for p in self.parameters:
                if p.when is not None:
                    where.setdefault(p.when.source, f"the condition of parameter {p.name!r}")
            for d in self.derived:
                where.setdefault(d.expr.source, f"derived {d.name!r}")
            for i, c in enumerate(self.constraints, start=1):
                where.setdefault(c.expr.source, f"constraint {i}")
            first = next(e for e in self._expressions() if missing[0] in e.names)
            raise self._error(
                f"unknown name(s) {', '.join(map(repr, missing))}: not a parameter, a derived "
                f"value or a workload field (first used by {where[first.source]}: "
                f"{first.source!r}; the context has {sorted(context)})"
            )

    def fixed(self, context: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters the workload alone rules out, each with its default: those whose
        condition is false whatever the other parameters hold (a knob for hardware the GPU
        lacks, such as an FP8 site on an A100). Sampling draws nothing for them and a search
        never moves them, so knobs of other hardware leave a study's random stream as it was.

        A condition counts as false here when it evaluates to false from the context and the
        defaults of parameters already fixed, without reading any other parameter (``has_mx
        and not fp8_qkv`` on a GPU without MX formats)."""
        taken = set(self._index) | set(self.derived_names)
        env = {k: v for k, v in context.items() if k not in taken}
        out: dict[str, Any] = {}
        for p in self.parameters:
            if p.when is None:
                continue
            try:
                active = p.when.evaluate(env)
            except ExpressionError:
                continue  # it reads a parameter that varies
            if not isinstance(active, np.ndarray) and not bool(active):
                out[p.name] = env[p.name] = p.default
        return out

    def _draw(
        self, rng: np.random.Generator, size: int, fixed: Mapping[str, Any]
    ) -> dict[str, np.ndarray]:
        """Independent draws of every parameter; a fixed one holds its default."""
        return {
            p.name: np.repeat(p.array([p.default]), size) if p.name in fixed else p.draw(rng, size)
            for p in self.parameters
        }

    # -- one configuration

    def validate(self, config: Mapping[str, Any], context: Mapping[str, Any]) -> list[str]:
        """Reasons why `config` is not a valid point of this space; empty when it is.

        Inactive parameters and derived values may be omitted; when present they must equal
        their default / computed value.
        """
        self.check_context(context)
        reasons = [
            f"unknown parameter {key!r}"
            for key in config
            if key not in self._index and key not in self.derived_names
        ]
        env: dict[str, Any] = dict(context)
        unknown: set[str] = set()  # parameters whose value could not be established
        for p in self.parameters:
            active = True
            if p.when is not None:
                if p.when.names & unknown:
                    unknown.add(p.name)
                    continue
                try:
                    active = bool(p.when.evaluate(env))
                except ExpressionError as exc:
                    reasons.append(
                        f"parameter {p.name!r}: condition could not be evaluated: {exc.problem}"
                    )
                    unknown.add(p.name)
                    continue
            if not active:
                if p.name in config and not _same(config[p.name], p.default):
                    assert p.when is not None
                    reasons.append(
                        f"parameter {p.name!r} must be {p.default!r} (its default) when "
                        f"{p.when.source!r} is false, got {config[p.name]!r}"
                    )
                env[p.name] = p.default
            elif p.name not in config:
                reasons.append(f"parameter {p.name!r} is missing")
                unknown.add(p.name)
            else:
                value = config[p.name]
                if not p.contains(value):
                    reasons.append(f"parameter {p.name!r}: {value!r} is not {p.domain_text()}")
                env[p.name] = value
        if reasons:
            return reasons

        failed: set[str] = set()
        for d in self.derived:
            if d.expr.names & failed:
                failed.add(d.name)
                continue
            try:
                env[d.name] = value = d.expr.evaluate(env)
            except ExpressionError as exc:
                reasons.append(f"derived {d.name!r} could not be computed: {exc.problem}")
                failed.add(d.name)
                continue
            if d.name in config and not bool(config[d.name] == value):
                reasons.append(
                    f"derived {d.name!r} is {config[d.name]!r}, but the parameters give {value!r}"
                )
        for c in self.constraints:
            if c.expr.names & failed:
                continue
            try:
                ok = bool(c.expr.evaluate(env))
            except ExpressionError as exc:
                reasons.append(f"{c.reason} (could not be evaluated: {exc.problem})")
                continue
            if not ok:
                reasons.append(c.reason)
        return reasons

    def is_valid(self, config: Mapping[str, Any], context: Mapping[str, Any]) -> bool:
        return not self.validate(config, context)

    def unknown_keys(self, params: Mapping[str, Any]) -> list[str]:
        """Why each key of ``params`` that is neither a parameter nor a derived value is
        wrong, with the nearest known name."""
        known = [*self.names, *self.derived_names]
        out = []
        for key in params:
            if key in self._index or key in self.derived_names:
                continue
            near = difflib.get_close_matches(str(key), known, n=1)
            out.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        return out

    def complete(self, params: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
        """The full configuration: inactive parameters at their default, plus derived values.

        Each given value is checked against its parameter's domain first; a value given for
        an inactive parameter is replaced by its default, and an active parameter left out
        takes the space's default where it gives one. Every parameter still missing is
        named at once (use :meth:`validate` for the constraints).
        """
        self.check_context(context)
        unknown = self.unknown_keys(params)
        if unknown:
            raise self._error(f"unknown parameter(s) {', '.join(unknown)}")
        env: dict[str, Any] = dict(context)
        out: dict[str, Any] = {}
        missing: list[str] = []
        undetermined: set[str] = set()  # missing, or conditioned on something missing
        for p in self.parameters:
            if p.when is not None and p.when.names & undetermined:
                undetermined.add(p.name)
                continue
            try:
                active = p.when is None or bool(p.when.evaluate(env))
            except ExpressionError as exc:
                raise self._error(f"parameter {p.name!r}: {exc}") from None
            if not active:
                value = p.default
            elif p.name in params:
                value = params[p.name]
                if not p.contains(value):
                    raise self._error(f"parameter {p.name!r}: {value!r} is not {p.domain_text()}")
            elif p.default is not None:
                value = p.default
            else:
                missing.append(p.name)
                undetermined.add(p.name)
                continue
            out[p.name] = env[p.name] = value
        if missing:
            raise self._error(
                f"cannot complete the configuration: missing parameter(s) {', '.join(missing)}"
            )
        for d in self.derived:
            try:
                out[d.name] = env[d.name] = d.expr.evaluate(env)
            except ExpressionError as exc:
                raise self._error(f"derived {d.name!r}: {exc}") from None
        return out

    # -- many configurations at once

    def _eval(
        self, expr: Expression, env: Mapping[str, Any], n: int, what: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Evaluate over `n` rows; returns (values, invalid) both of shape (n,)."""
        try:
            value, bad = expr.evaluate_masked(env)
        except ExpressionError as exc:
            raise self._error(f"{what}: {exc}") from None
        values = np.asarray(value)
        values = np.broadcast_to(values, (n,)) if values.ndim == 0 else values
        invalid = np.zeros(n, dtype=bool) if bad is None else np.broadcast_to(bad, (n,))
        return values, invalid

    def _mask(self, expr: Expression, env: Mapping[str, Any], n: int, what: str) -> np.ndarray:
        """Rows where a condition/constraint holds and could be evaluated."""
        values, invalid = self._eval(expr, env, n, what)
        if values.dtype.kind not in "biuf":
            raise self._error(f"{what}: {expr.source!r} must be true or false, got {values.dtype}")
        return values.astype(bool) & ~invalid

    def _apply_stage(
        self, k: int, arrays: dict[str, np.ndarray], context: Mapping[str, Any], n: int
    ) -> np.ndarray:
        """Compute the derived values of stage k into `arrays`; return the rows still valid."""
        keep = np.ones(n, dtype=bool)
        derived_ids, constraint_ids = self._stages[k]
        env = {**context, **arrays}
        for j in derived_ids:
            d = self.derived[j]
            values, invalid = self._eval(d.expr, env, n, f"derived {d.name!r}")
            arrays[d.name] = env[d.name] = np.array(values)  # own, writable copy
            keep &= ~invalid
        for j in constraint_ids:
            c = self.constraints[j]
            keep &= self._mask(c.expr, env, n, f"constraint {j + 1}")
        return keep

    def _condition(
        self, p: Parameter, arrays: Mapping[str, np.ndarray], context: Mapping[str, Any], n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(active, invalid) rows for a parameter, from the values declared before it."""
        if p.when is None:
            return np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
        values, invalid = self._eval(
            p.when, {**context, **arrays}, n, f"parameter {p.name!r} (when)"
        )
        if values.dtype.kind not in "biuf":
            raise self._error(
                f"parameter {p.name!r}: condition {p.when.source!r} must be true or false"
            )
        return values.astype(bool) & ~invalid, invalid

    def _filter(self, arrays: dict[str, np.ndarray], keep: np.ndarray) -> int:
        if keep.all():
            return len(keep)
        for key in arrays:
            arrays[key] = arrays[key][keep]
        return int(np.count_nonzero(keep))

    def _require_finite(self) -> None:
        for p in self.parameters:
            if not p.is_finite:
                raise self._error(
                    f"the space is not finite: parameter {p.name!r} is a "
                    "continuous float (give it a 'step')"
                )

    def enumerate_arrays(
        self, context: Mapping[str, Any], max_rows: int | None = None
    ) -> dict[str, np.ndarray]:
        """Every valid configuration of a finite space once, as struct-of-arrays.

        Builds the product parameter by parameter (an inactive parameter adds one row, its
        default) and drops rows as soon as a constraint's inputs are known; the order is
        lexicographic in declaration order. With ``max_rows``, a product that would grow
        past it raises :class:`SpaceError` before it is built (bounded memory).
        """
        self._require_finite()
        self.check_context(context)
        arrays: dict[str, np.ndarray] = {}
        n = self._filter(arrays, self._apply_stage(0, arrays, context, 1))
        for i, p in enumerate(self.parameters):
            active, invalid = self._condition(p, arrays, context, n)
            if invalid.any():
                n = self._filter(arrays, ~invalid)
                active = active[~invalid]
            grid = p.grid()
            counts = np.where(active, len(grid), 1)
            if max_rows is not None and int(counts.sum()) > max_rows:
                raise _TooMany(
                    f"{self.name}: more than {max_rows:,} configurations to enumerate "
                    f"(at parameter {p.name!r})"
                )
            rows = np.repeat(np.arange(n), counts)
            starts = np.cumsum(counts) - counts
            within = np.arange(len(rows)) - np.repeat(starts, counts)
            for key in arrays:
                arrays[key] = arrays[key][rows]
            default = p.array([p.default])[0] if p.default is not None else grid[0]
            arrays[p.name] = np.where(active[rows], grid[within % len(grid)], default)
            n = self._filter(arrays, self._apply_stage(i + 1, arrays, context, len(rows)))
        return self._ordered(arrays)

    def _ordered(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keys = [*self.names, *self.derived_names]
        return {k: arrays[k] for k in keys if k in arrays}

    def enumerate(self, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every valid configuration of a finite space, each once (see enumerate_arrays)."""
        return self.from_arrays(self.enumerate_arrays(context))

    def size(self, context: Mapping[str, Any]) -> int:
        """The number of valid configurations of a finite space."""
        arrays = self.enumerate_arrays(context)
        return len(arrays[self.names[0]])

    # -- an empty space

    def removals(
        self,
        context: Mapping[str, Any],
        *,
        max_rows: int = EMPTY_ROWS,
        draws: int = EMPTY_DRAWS,
        seed: int = 0,
    ) -> Removals:
        """How many configurations each constraint removes when applied alone to what the
        parameters and their conditions allow: over that whole product when it is finite and
        has at most ``max_rows`` rows, else over ``draws`` random draws of it."""
        self.check_context(context)
        bare = replace(self, constraints=())
        arrays = bare._enumerated(context, max_rows)
        exhaustive = arrays is not None
        if arrays is None:
            rng = np.random.default_rng(seed)
            raw = self._draw(rng, draws, self.fixed(context))
            resolved, keep = bare._resolve(raw, context, draws)
            arrays = {k: v[keep] for k, v in resolved.items()}
        n = len(arrays[self.names[0]])
        env = {**context, **arrays}
        removed = tuple(
            n - int(np.count_nonzero(self._mask(c.expr, env, n, f"constraint {j + 1}")))
            for j, c in enumerate(self.constraints)
        )
        return Removals(total=n, exhaustive=exhaustive, removed=removed)

    def _any_valid(self, context: Mapping[str, Any], draws: int, max_rows: int) -> bool | None:
        """True when a valid configuration exists, False when none does (enumerated), None
        when ``draws`` random draws found none but the space is too large to enumerate."""
        rng = np.random.default_rng(0)
        fixed = self.fixed(context)
        drawn, batch = 0, 1024  # the first batch settles almost every real space
        while drawn < draws:
            size = min(batch, draws - drawn)
            raw = self._draw(rng, size, fixed)
            if self._resolve(raw, context, size)[1].any():
                return True
            drawn, batch = drawn + size, batch * 4
        arrays = self._enumerated(context, max_rows)
        return None if arrays is None else len(arrays[self.names[0]]) > 0

    def _enumerated(
        self, context: Mapping[str, Any], max_rows: int
    ) -> dict[str, np.ndarray] | None:
        """Every valid configuration, or None when the space is not finite or has more than
        ``max_rows`` rows to enumerate."""
        if not self.is_finite:
            return None
        try:
            return self.enumerate_arrays(context, max_rows=max_rows)
        except _TooMany:
            return None

    def empty_reason(
        self,
        context: Mapping[str, Any],
        *,
        draws: int = EMPTY_DRAWS,
        max_rows: int = EMPTY_ROWS,
        top: int = 3,
    ) -> str | None:
        """None when the space has a valid configuration for ``context``; else one line that
        names the constraints removing the most configurations, each applied alone, so that
        the user sees which rule to loosen instead of a count of zero."""
        self.check_context(context)
        found = self._any_valid(context, draws, max_rows)
        if found:
            return None
        head = "no valid configuration for this workload"
        if found is None:
            head += f" in {draws:,} random draws"
        r = self.removals(context, max_rows=max_rows, draws=draws)
        if r.total == 0:
            return (
                f"{head}: the conditions or derived values fail to evaluate for every "
                "combination of the parameters (a division by zero, say)"
            )
        order = sorted(range(len(r.removed)), key=lambda i: -r.removed[i])  # ties: as declared
        ranked = [i for i in order if r.removed[i] > 0][:top]
        if not ranked:
            return f"{head} (check its constraints)"
        what = "configurations the parameters allow" if r.exhaustive else "random draws"
        parts = []
        for i in ranked:
            c = self.constraints[i]
            label = repr(c.expr.source) + (f" ({c.message})" if c.message else "")
            parts.append(f"{label} removes {r.removed[i]:,} ({_share(r.removed[i], r.total)})")
        return (
            f"{head}; of the {r.total:,} {what}, the constraints that remove the most, "
            f"each applied alone: {', '.join(parts)}"
        )

    def _resolve(
        self, raw: dict[str, np.ndarray], context: Mapping[str, Any], n: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Apply conditions, derived values and constraints to independent draws."""
        arrays: dict[str, np.ndarray] = {}
        keep = np.ones(n, dtype=bool)
        for p in self.parameters:
            active, invalid = self._condition(p, arrays, context, n)
            keep &= ~invalid
            values = raw[p.name]
            if p.when is not None:
                values = np.where(active, values, p.array([p.default])[0])
            arrays[p.name] = values
        for k in range(len(self._stages)):
            keep &= self._apply_stage(k, arrays, context, n)
        return arrays, keep

    def resolve_arrays(
        self, raw: Mapping[str, np.ndarray], context: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Complete raw parameter arrays (inactive parameters take their default, derived
        values are computed) and say which rows are valid: the vectorised
        :meth:`complete` plus :meth:`is_valid`, for candidates made by other means than
        sampling (mutations of good configurations, say)."""
        n = len(next(iter(raw.values()))) if raw else 0
        arrays, keep = self._resolve(dict(raw), context, n)
        return self._ordered(arrays), keep

    def sample_arrays(
        self,
        rng: np.random.Generator,
        n: int,
        context: Mapping[str, Any],
        max_tries: int | None = None,
    ) -> dict[str, np.ndarray]:
        """`n` valid configurations drawn uniformly from the declared distributions (with
        replacement) by vectorised rejection; raises SpaceError after `max_tries` draws
        (default ``max(100_000, 1000 * n)``) without enough valid ones."""
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        self.check_context(context)
        limit = max(100_000, 1000 * n) if max_tries is None else max_tries
        fixed = self.fixed(context)
        parts: list[dict[str, np.ndarray]] = []
        found = drawn = 0
        batch = max(256, 2 * n)
        while found < n:
            if drawn >= limit:
                raise self._error(
                    f"found only {found} of {n} valid configurations in {drawn} random draws; "
                    "the constraints may be unsatisfiable for this context"
                )
            size = min(batch, limit - drawn)
            raw = self._draw(rng, size, fixed)
            arrays, keep = self._resolve(raw, context, size)
            drawn += size
            take = np.flatnonzero(keep)[: n - found]
            if len(take):
                parts.append({k: v[take] for k, v in arrays.items()})
                found += len(take)
            rate = found / drawn
            need = n - found
            batch = int(min(2**20, max(256, 1.2 * need / rate + 64))) if rate else batch * 4
        if not parts:
            empty = {p.name: p.array([]) for p in self.parameters}
            empty.update({d: np.array([]) for d in self.derived_names})
            return self._ordered(empty)
        merged = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        return self._ordered(merged)

    def sample(
        self,
        rng: np.random.Generator,
        n: int,
        context: Mapping[str, Any],
        max_tries: int | None = None,
    ) -> list[dict[str, Any]]:
        """`n` valid configurations as dicts (see sample_arrays)."""
        return self.from_arrays(self.sample_arrays(rng, n, context, max_tries))

    # -- struct-of-arrays conversion

    def to_arrays(self, configs: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """Complete configurations as one array per parameter (and per derived value present
        in every configuration), in the parameter's dtype."""
        out: dict[str, np.ndarray] = {}
        for p in self.parameters:
            try:
                values = [c[p.name] for c in configs]
            except KeyError:
                raise self._error(
                    f"to_arrays: a configuration lacks parameter {p.name!r} (complete it first)"
                ) from None
            try:
                out[p.name] = p.array(values)
            except (TypeError, ValueError) as exc:
                raise self._error(f"to_arrays: parameter {p.name!r}: {exc}") from None
        for name in self.derived_names:
            if configs and all(name in c for c in configs):
                out[name] = np.asarray([c[name] for c in configs])
        return out

    def from_arrays(self, arrays: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        """The inverse of :meth:`to_arrays`: plain-Python configuration dicts."""
        if not arrays:
            return []
        lengths = {len(v) for v in arrays.values()}
        if len(lengths) != 1:
            raise self._error(f"from_arrays: the arrays have different lengths {sorted(lengths)}")
        keys = [k for k in (*self.names, *self.derived_names) if k in arrays]
        keys += [k for k in arrays if k not in keys]
        columns = [
            self[k].to_python(np.asarray(arrays[k]))
            if k in self._index
            else np.asarray(arrays[k]).tolist()
            for k in keys
        ]
        return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]

    # -- Optuna

    def optuna_distributions(self) -> dict[str, BaseDistribution]:
        """One Optuna distribution per parameter, conditional ones included.

        Optuna's define-by-run samplers treat a parameter that was not suggested in a trial
        as absent, so a caller suggests a conditional parameter only when its `when` holds
        and lets :meth:`complete` fill in the default.
        """
        return {p.name: p.distribution() for p in self.parameters}


# ----------------------------------------------------------------------------- YAML


def _parse_parameter(name: Any, spec: Any) -> Parameter:
    if not isinstance(name, str):
        raise SpaceError(f"parameter name {name!r} must be a string")

    def fail(problem: str) -> SpaceError:
        return SpaceError(f"parameter {name!r}: {problem}")

    if not isinstance(spec, Mapping):
        raise fail(f"expected a mapping such as {{type: int, low: 1, high: 8}}, got {spec!r}")
    ptype = spec.get("type")
    if ptype is None:
        raise fail(f"missing 'type' (one of {', '.join(_PARAMETER_TYPES)})")
    if ptype not in _PARAMETER_TYPES:
        raise fail(f"unknown type {ptype!r} (expected one of {', '.join(_PARAMETER_TYPES)})")
    allowed = _COMMON_KEYS + _TYPE_KEYS[ptype]
    for key in spec:
        if key not in allowed:
            raise fail(
                f"unknown key {key!r} for a {ptype} parameter (allowed: {', '.join(allowed)})"
            )
    for key in _REQUIRED_KEYS[ptype]:
        if key not in spec:
            raise fail(f"missing {key!r}")
    when = None
    if spec.get("when") is not None:
        if not isinstance(spec["when"], str):
            raise fail(f"'when' must be an expression string, got {spec['when']!r}")
        try:
            when = Expression(spec["when"])
        except ExpressionError as exc:
            raise fail(f"bad 'when' condition: {exc}") from None
    description = spec.get("description") or ""
    if not isinstance(description, str):
        raise fail("'description' must be a string")
    common: dict[str, Any] = {
        "name": name,
        "default": spec.get("default"),
        "when": when,
        "description": description,
    }
    if ptype == "int":
        return IntParameter(
            low=spec["low"],
            high=spec["high"],
            step=spec.get("step", 1),
            log=spec.get("log", False),
            **common,
        )
    if ptype == "float":
        step = spec.get("step")
        if isinstance(common["default"], str):
            common["default"] = _number(common["default"], "default", name)
        return FloatParameter(
            low=_number(spec["low"], "low", name),
            high=_number(spec["high"], "high", name),
            step=None if step is None else _number(step, "step", name),
            log=spec.get("log", False),
            **common,
        )
    if ptype == "categorical":
        choices = spec["choices"]
        if not isinstance(choices, list):
            raise fail(f"choices must be a list, got {choices!r}")
        return CategoricalParameter(choices=tuple(choices), **common)
    return BoolParameter(**common)


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys, which YAML would silently overwrite."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def validate_file(path: str | Path, context: Mapping[str, Any] | None = None) -> Space:
    """Load and check a space file (for ``cubic spaces validate``); raises SpaceError.

    Without a context only the file itself is checked (syntax, types, ranges, condition
    order). With one, the workload fields the expressions read must be present and every
    expression must evaluate on a batch of random draws (catching e.g. comparing a string
    parameter with a number).
    """
    space = Space.from_yaml(path)
    if context is not None:
        space.check_context(context)
        rng = np.random.default_rng(0)
        raw = {p.name: p.draw(rng, 256) for p in space.parameters}
        space._resolve(raw, context, 256)
    return space

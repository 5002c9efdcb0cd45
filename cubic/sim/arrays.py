"""Turn a batch of configurations into a struct of NumPy arrays.

The simulators price thousands of configurations per call, so they work on one array per
knob rather than on one dict per configuration. Callers may hand over either form (a
mapping of equal-length sequences or scalars, or a list of dicts); this module makes the
arrays and fills the knobs a configuration leaves out with the simulator's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cubic.errors import InvalidInput

Configs = Mapping[str, Any] | Sequence[Mapping[str, Any]]


def _column(values: list[Any]) -> np.ndarray:
    """One knob's values as an array: numeric where every value is a number, else objects."""
    if all(isinstance(v, bool | np.bool_) for v in values):
        return np.asarray(values, dtype=bool)
    if all(
        isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)
        for v in values
    ):
        return np.asarray(values)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def as_arrays(configs: Configs, defaults: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """Return ``(arrays, n)``: one length-``n`` array per knob.

    ``configs`` is a mapping of knob -> sequence (or scalar, broadcast to every
    configuration), or a list of dicts. Every key of ``defaults`` is present in the result:
    a knob no configuration names takes its default everywhere; in a list of dicts, a
    configuration that leaves a knob out takes the default for that entry. A default of
    ``None`` means "no default": the knob is left out of the result when no configuration
    names it, and entries that leave it out hold ``None`` (an object array). Knobs that
    ``defaults`` does not list are passed through unchanged.
    """
    arrays: dict[str, np.ndarray] = {}
    if isinstance(configs, Mapping):
        lengths = {
            k: len(v)
            for k, v in configs.items()
            if not isinstance(v, str | bytes) and np.ndim(v) > 0
        }
        sizes = set(lengths.values())
        if len(sizes) > 1:
            raise InvalidInput(f"configs: knobs have different lengths {lengths}")
        n = sizes.pop() if sizes else 1
        for k, v in configs.items():
            if k in lengths:
                a = v if isinstance(v, np.ndarray) else _column(list(v))
            else:
                a = np.empty(n, dtype=object) if isinstance(v, str | bytes) else None
                if a is not None:
                    a[:] = v
                else:
                    a = np.full(n, v)
            arrays[k] = a
    else:
        rows = list(configs)
        n = len(rows)
        keys: list[str] = []
        for r in rows:
            if not isinstance(r, Mapping):
                raise InvalidInput(f"configs: expected dicts, got {type(r).__name__}")
            keys.extend(k for k in r if k not in keys)
        for k in keys:
            d = defaults.get(k)
            arrays[k] = _column([r.get(k, d) for r in rows])
    for k, d in defaults.items():
        if k in arrays or d is None:
            continue
        if isinstance(d, str):
            a = np.empty(n, dtype=object)
            a[:] = d
        else:
            a = np.full(n, d)
        arrays[k] = a
    return arrays, n

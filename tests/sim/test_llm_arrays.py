"""Configurations in, struct of arrays out: the form every simulator works on."""

from __future__ import annotations

import numpy as np
import pytest

from cubic.errors import InvalidInput
from cubic.sim.arrays import as_arrays

DEFAULTS = {"tp": 1, "recompute": "none", "dp": None, "sp": False}


def test_list_of_dicts_fills_defaults_per_entry():
    arr, n = as_arrays([{"tp": 4}, {"recompute": "full", "dp": 2}], DEFAULTS)
    assert n == 2
    assert arr["tp"].tolist() == [4, 1]
    assert arr["recompute"].tolist() == ["none", "full"]
    assert arr["dp"].tolist() == [None, 2]
    assert arr["sp"].dtype == bool and not arr["sp"].any()


def test_mapping_broadcasts_scalars_and_keeps_arrays():
    tp = np.array([1, 2, 8])
    arr, n = as_arrays({"tp": tp, "recompute": "full", "extra": 3.5}, DEFAULTS)
    assert n == 3
    assert arr["tp"] is tp
    assert arr["recompute"].tolist() == ["full"] * 3
    assert arr["extra"].tolist() == [3.5] * 3
    assert "dp" not in arr  # no default and nobody named it


def test_all_scalars_make_one_configuration():
    arr, n = as_arrays({"tp": 2}, DEFAULTS)
    assert n == 1 and arr["tp"].tolist() == [2]


def test_mismatched_lengths_are_refused():
    with pytest.raises(InvalidInput):
        as_arrays({"tp": [1, 2], "pp": [1, 2, 4]}, DEFAULTS)


def test_non_dict_entries_are_refused():
    with pytest.raises(InvalidInput):
        as_arrays([{"tp": 1}, 3], DEFAULTS)  # type: ignore[list-item]


def test_numeric_and_bool_columns_get_numeric_dtypes():
    arr, _ = as_arrays([{"tp": 2, "sp": True}, {"tp": 4, "sp": False}], DEFAULTS)
    assert arr["tp"].dtype.kind == "i"
    assert arr["sp"].dtype == bool

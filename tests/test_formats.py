"""The GEMM format table: bytes per element from the public specs, error order, knob rules."""

from __future__ import annotations

import numpy as np
import pytest

from cubic import formats as F


def test_stored_bytes_follow_the_specs() -> None:
    """OCP MX v1.0: 32 elements share one 8-bit E8M0 scale; NVFP4: 16 elements share an E4M3
    scale; FP8 per tensor keeps one scale for the whole tensor."""
    by = {f.name: f for f in F.FORMATS}
    assert by["fp8"].stored_bytes == 1.0
    assert by["mxfp8"].stored_bytes == pytest.approx(1.0 + 1.0 / 32)
    assert by["mxfp6"].stored_bytes == pytest.approx(0.75 + 1.0 / 32)
    assert by["mxfp4"].stored_bytes == pytest.approx(0.5 + 1.0 / 32)
    assert by["nvfp4"].stored_bytes == pytest.approx(0.5 + 1.0 / 16)
    assert by["mxfp4"].block == 32 and by["nvfp4"].block == 16
    # Only the formats with a per-tensor scale need the tensor's amax before casting.
    assert [f.name for f in F.FORMATS if f.tensor_scale] == ["fp8", "nvfp4"]


def test_error_scores_order_the_formats_as_the_sources_do() -> None:
    e = dict(zip([f.name for f in F.FORMATS], F.ERROR, strict=True))
    assert e["bf16"] == 0.0 and e["fp8"] == 1.0  # the FP8 sites keep their weights
    assert e["mxfp8"] == pytest.approx(e["fp8"])
    assert e["fp8"] <= e["mxfp8"] < e["mxfp6"] < e["nvfp4"] < e["mxfp4_oas_mbs"] < e["mxfp4"]
    # Overflow-aware and macro-block scaling close most of the MXFP4-to-NVFP4 gap.
    assert e["mxfp4_oas_mbs"] - e["nvfp4"] < 0.25 * (e["mxfp4"] - e["nvfp4"])


def test_a_site_follows_its_fp8_switch_unless_its_format_says_otherwise() -> None:
    fp8 = np.array([False, True, False, True, True, False, True])
    fmt = np.array([None, None, "mxfp4", "bf16", "fp8", "int4", "nvfp4"], dtype=object)
    code, conflict = F.site_codes(fp8, fmt)
    assert code.tolist() == [F.BF16, F.FP8, F.MXFP4, F.FP8, F.FP8, F.UNKNOWN, F.NVFP4]
    assert conflict.tolist() == [False, False, False, False, False, False, True]
    code, _ = F.site_codes(fp8, fmt, error_reduction=np.array([True] * 7))
    assert code[2] == F.MXFP4_ER and code[6] == F.NVFP4  # only MXFP4 has the option
    code, conflict = F.site_codes(fp8, None)
    assert code.tolist() == np.where(fp8, F.FP8, F.BF16).tolist() and not conflict.any()
    assert F.error(np.array([F.UNKNOWN, F.MXFP4])).tolist() == [0.0, 6.0]
    assert F.format_knob("fp8_attn_out") == "attn_out_format"

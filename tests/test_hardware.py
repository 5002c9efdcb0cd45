"""The GPU catalogue and user-added hardware."""

from __future__ import annotations

from pathlib import Path

import pytest

from cubic.hardware import HardwareError, catalogue, get_gpu, load_hardware


def test_builtin_catalogue_has_the_published_figures() -> None:
    names = set(catalogue())
    assert {"a100_40gb", "a100_80gb", "h100_sxm", "h200", "b200"} <= names
    h100, h200, a100 = get_gpu("h100_sxm"), get_gpu("h200"), get_gpu("a100_80gb")
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.peak("fp8") == pytest.approx(2 * h100.peak("bf16"), rel=1e-3)
    assert not a100.has_fp8 and a100.peak("fp8") == a100.peak("bf16")  # no FP8 on A100
    assert h200.hbm_gb == 141 and h200.hbm_gbs == 4800 and h100.hbm_gbs == 3350
    assert h200.peak("bf16") == h100.peak("bf16")
    assert h100.nvlink_gbs == 450 and a100.nvlink_gbs == 300  # per direction


def test_user_hardware_from_yaml_inherits_from_a_base(tmp_path: Path) -> None:
    f = tmp_path / "hw.yaml"
    f.write_text("gpus:\n  h100_nvl_test:\n    base: h100_sxm\n    hbm_gb: 94\n    hbm_gbs: 3900\n")
    (gpu,) = load_hardware(f)
    assert get_gpu("h100_nvl_test") is gpu
    assert gpu.hbm_gb == 94 and gpu.peak("bf16") == get_gpu("h100_sxm").peak("bf16")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus: {x: {peak_tflops: {bf16: 1}, hbm_gb: 1}}", "gpu 'x'"),
        ("gpus: {x: {base: h100_sxm, peak_tflops: {int4: 1, bf16: 2}}}", "int4"),
        ("gpus: {x: {base: nope}}", "unknown gpu 'nope'"),
        ("nothing: here", "'gpus'"),
    ],
)
def test_bad_hardware_file_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "hw.yaml"
    f.write_text(text)
    with pytest.raises(HardwareError, match=needle):
        load_hardware(f)


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(HardwareError, match="h100_sxm"):
        get_gpu("tpu_v9")


def test_blackwell_runs_the_block_scaled_formats_at_the_datasheet_rates() -> None:
    """DGX/HGX B200 datasheets, dense per GPU: BF16 2.25, FP8/FP6 4.5, FP4 9 PFLOPS."""
    b200 = get_gpu("b200")
    assert b200.peak("bf16") == pytest.approx(2.25e15)
    for fmt in ("fp8", "mxfp8", "mxfp6"):
        assert b200.peak(fmt) == pytest.approx(4.5e15)
    for fmt in ("mxfp4", "nvfp4"):
        assert b200.peak(fmt) == pytest.approx(9.0e15)
    assert b200.formats == ("fp8", "mxfp8", "mxfp6", "mxfp4", "nvfp4")
    assert "datasheet" in b200.source and "MXFP4" in b200.source
    caps = b200.capabilities(8)
    assert caps["has_mx"] and caps["has_mxfp8"] and caps["has_mxfp4"] and caps["has_nvfp4"]


@pytest.mark.parametrize("name", ["h100_sxm", "h200", "a100_80gb", "a100_40gb"])
def test_hopper_and_ampere_have_no_block_scaled_formats(name: str) -> None:
    gpu = get_gpu(name)
    caps = gpu.capabilities(8)
    assert not caps["has_mx"]
    assert not any(caps[f"has_{f}"] for f in ("mxfp8", "mxfp6", "mxfp4", "nvfp4"))
    assert gpu.formats == (("fp8",) if gpu.has_fp8 else ())
    # An MX GEMM on such a GPU could only run at BF16 (the simulator refuses it instead).
    assert gpu.peak("mxfp4") == gpu.peak("bf16")


def test_user_hardware_may_declare_some_block_scaled_formats(tmp_path: Path) -> None:
    f = tmp_path / "hw.yaml"
    f.write_text(
        "gpus:\n  mx8_only_test:\n    base: h100_sxm\n"
        "    peak_tflops: {bf16: 1000, fp8: 2000, mxfp8: 2000}\n"
    )
    (gpu,) = load_hardware(f)
    assert gpu.formats == ("fp8", "mxfp8")
    caps = gpu.capabilities()
    assert caps["has_mx"] and caps["has_mxfp8"] and not caps["has_mxfp4"]

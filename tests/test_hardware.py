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

"""GPU and interconnect catalogue.

Figures are the vendors' published dense (non-sparse) peaks, per GPU, from the NVIDIA A100,
H100, H200 and DGX B200 datasheets. Bandwidths are per direction, because that is what a
ring or all-to-all collective moves data with. ``peak_tflops`` names only the precisions
a GPU's tensor cores run natively: Hopper adds FP8 to Ampere's; Blackwell adds the
block-scaled formats of :mod:`cubic.formats` (MXFP8, MXFP6, MXFP4, NVFP4). Users add their
own GPUs in YAML with :func:`load_hardware` (or the ``CUBIC_HARDWARE`` environment
variable), using the same keys as :class:`GPU`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "mxfp6", "mxfp4", "nvfp4")
#: GEMM input formats narrower than 16 bits (see :mod:`cubic.formats`); a GPU without one
#: runs that GEMM at BF16 instead.
LOW_PRECISIONS = ("fp8", "mxfp8", "mxfp6", "mxfp4", "nvfp4")


@dataclass(frozen=True, slots=True)
class GPU:
    """One accelerator model and the node it usually sits in.

    ``peak_tflops`` maps a precision to dense peak TFLOP/s; a precision that the chip lacks
    (FP8 on A100, the MX formats on H100) is absent. Link bandwidths are GB/s per GPU per
    direction; latencies are the per-message start-up cost (the alpha of the alpha-beta
    model) in microseconds.
    """

    name: str
    peak_tflops: dict[str, float]
    hbm_gb: float
    hbm_gbs: float
    nvlink_gbs: float
    nic_gbs: float
    pcie_gbs: float
    gpus_per_node: int = 8
    host_mem_gb_per_node: float = 2048.0
    nvlink_latency_us: float = 3.0
    nic_latency_us: float = 10.0
    price_per_hour: float = 2.0
    nvlink_domain: int | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s (not TFLOP/s) at ``precision``; FP8 and the block-scaled formats
        fall back to BF16 where absent."""
        if precision in LOW_PRECISIONS and precision not in self.peak_tflops:
            precision = "bf16"
        if precision == "fp16" and "fp16" not in self.peak_tflops:
            precision = "bf16"
        return self.peak_tflops[precision] * 1e12

    @property
    def has_fp8(self) -> bool:
        return "fp8" in self.peak_tflops

    @property
    def formats(self) -> tuple[str, ...]:
        """The GEMM formats narrower than 16 bits that the tensor cores run natively."""
        return tuple(p for p in LOW_PRECISIONS if p in self.peak_tflops)

    @property
    def has_mx(self) -> bool:
        """Whether the GPU runs any OCP Microscaling (MX) format natively (Blackwell)."""
        return any(p in self.peak_tflops for p in ("mxfp8", "mxfp6", "mxfp4"))

    def capabilities(self, gpus_per_node: int | None = None) -> dict[str, Any]:
        """What a search space's expressions may ask of the hardware (``when: "has_fp8"``).

        ``has_fp8`` and, per block-scaled format, ``has_mxfp8``, ``has_mxfp6``, ``has_mxfp4``
        and ``has_nvfp4`` (``has_mx``: any MX format) say which GEMM formats exist here.
        ``nvlink_domain`` is the number of GPUs one NVLink fabric joins: the node unless the
        catalogue says otherwise (an NVL72 rack joins 72).
        """
        node = gpus_per_node or self.gpus_per_node
        return {
            "gpu": self.name,
            "hbm_gb": self.hbm_gb,
            "has_fp8": self.has_fp8,
            "has_mx": self.has_mx,
            **{f"has_{p}": p in self.peak_tflops for p in LOW_PRECISIONS[1:]},
            "nvlink_domain": self.nvlink_domain or node,
            "host_mem_gb": self.host_mem_gb_per_node,
            "peak_bf16_tflops": self.peak_tflops["bf16"],
        }

    @property
    def hbm_bytes(self) -> float:
        """Usable HBM in bytes: vendors' "80 GB" is 80 GiB (an H100 80GB reports 81559 MiB)."""
        return self.hbm_gb * 2.0**30

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}
_H100 = {"fp32": 67.0, "tf32": 494.5, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}
#: Blackwell runs MXFP8 and MXFP6 at the FP8 rate and MXFP4 and NVFP4 at twice it: NVIDIA's
#: HGX B200 and DGX B200 datasheets list, per 8 GPUs, 72 PFLOPS FP8/FP6 and 144 PFLOPS FP4
#: with 2:4 sparsity, so 4.5 and 9 PFLOPS dense per GPU (BF16 2.25).
_B200 = {
    "fp32": 80.0,
    "tf32": 1100.0,
    "bf16": 2250.0,
    "fp16": 2250.0,
    "fp8": 4500.0,
    "mxfp8": 4500.0,
    "mxfp6": 4500.0,
    "mxfp4": 9000.0,
    "nvfp4": 9000.0,
}

_BUILTIN: dict[str, GPU] = {
    g.name: g
    for g in (
        GPU(
            "a100_40gb",
            _A100,
            hbm_gb=40,
            hbm_gbs=1555,
            nvlink_gbs=300,
            nic_gbs=25,
            pcie_gbs=25,
            price_per_hour=1.3,
            source="NVIDIA A100 datasheet; DGX A100: 8x 200 Gb/s HDR, NVLink3 600 GB/s",
        ),
        GPU(
            "a100_80gb",
            _A100,
            hbm_gb=80,
            hbm_gbs=2039,
            nvlink_gbs=300,
            nic_gbs=25,
            pcie_gbs=25,
            price_per_hour=1.8,
            source="NVIDIA A100 datasheet (SXM4 80 GB, 2039 GB/s)",
        ),
        GPU(
            "h100_sxm",
            _H100,
            hbm_gb=80,
            hbm_gbs=3350,
            nvlink_gbs=450,
            nic_gbs=50,
            pcie_gbs=55,
            price_per_hour=3.0,
            source="NVIDIA H100 datasheet; DGX H100: 8x 400 Gb/s NDR, NVLink4 900 GB/s",
        ),
        GPU(
            "h200",
            _H100,
            hbm_gb=141,
            hbm_gbs=4800,
            nvlink_gbs=450,
            nic_gbs=50,
            pcie_gbs=55,
            price_per_hour=3.7,
            source="NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s)",
        ),
        GPU(
            "b200",
            _B200,
            hbm_gb=180,
            hbm_gbs=8000,
            nvlink_gbs=900,
            nic_gbs=50,
            pcie_gbs=55,
            price_per_hour=5.5,
            source=(
                "NVIDIA DGX B200 datasheet (NVLink5 1.8 TB/s, 8x 400 Gb/s); dense peaks from "
                "the HGX/DGX B200 datasheets: BF16 2.25, FP8/MXFP8/MXFP6 4.5, MXFP4/NVFP4 9 "
                "PFLOPS per GPU (half the sparse figures)"
            ),
        ),
        GPU(
            "cpu",
            {"fp32": 1.0, "bf16": 1.0},
            hbm_gb=8,
            hbm_gbs=20,
            nvlink_gbs=10,
            nic_gbs=1.25,
            pcie_gbs=10,
            gpus_per_node=2,
            host_mem_gb_per_node=16,
            price_per_hour=0.1,
            source="a CPU host running ranks with gloo (examples and tests); nominal, not measured",
        ),
    )
}

_USER: dict[str, GPU] = {}


class HardwareError(ValueError):
    """A hardware name that is not in the catalogue, or a malformed hardware file."""


def load_hardware(path: str | Path) -> list[GPU]:
    """Add the GPUs described in a YAML file to the catalogue.

    The file holds ``gpus: {name: {peak_tflops: {...}, hbm_gb: ..., ...}}``; a GPU may name
    ``base: h100_sxm`` to inherit every field it does not set.
    """
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise HardwareError(f"{path}: cannot read hardware file: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), dict):
        raise HardwareError(f"{path}: expected a mapping with a 'gpus' key")
    added = []
    for name, spec in doc["gpus"].items():
        if not isinstance(spec, dict):
            raise HardwareError(f"{path}: gpu '{name}': expected a mapping")
        spec = dict(spec)
        base = spec.pop("base", None)
        fields: dict[str, Any] = {}
        if base is not None:
            fields = get_gpu(base).to_dict()
        fields.update(spec)
        fields["name"] = str(name)
        try:
            gpu = GPU(**fields)
        except TypeError as exc:
            raise HardwareError(f"{path}: gpu '{name}': {exc}") from exc
        if "bf16" not in gpu.peak_tflops:
            raise HardwareError(f"{path}: gpu '{name}': peak_tflops needs at least 'bf16'")
        bad = set(gpu.peak_tflops) - set(PRECISIONS)
        if bad:
            raise HardwareError(f"{path}: gpu '{name}': unknown precision(s) {sorted(bad)}")
        _USER[gpu.name] = gpu
        added.append(gpu)
    return added


_ENV_LOADED = False


def _load_env() -> None:
    """The ``CUBIC_HARDWARE`` files, on first use of the catalogue (not at import: a bad file
    is then an error of the command that needs it, with its message, not a crash)."""
    global _ENV_LOADED
    if _ENV_LOADED:
        return
    _ENV_LOADED = True
    paths = os.environ.get("CUBIC_HARDWARE", "")
    try:
        for p in filter(None, paths.split(os.pathsep)):
            load_hardware(p)
    except HardwareError as exc:
        _ENV_LOADED = False  # asked again, it says so again
        raise HardwareError(f"CUBIC_HARDWARE: {exc}") from exc


def catalogue() -> dict[str, GPU]:
    """Every known GPU: the built-in ones, then those loaded from YAML."""
    _load_env()
    return {**_BUILTIN, **_USER}


def get_gpu(name: str) -> GPU:
    gpus = catalogue()
    if name not in gpus:
        raise HardwareError(f"unknown gpu '{name}'; known: {', '.join(sorted(gpus))}")
    return gpus[name]

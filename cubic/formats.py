"""Number formats a GEMM site may run in: what each stores, and what it costs in accuracy.

A training step's GEMM sites (the QKV projection, the MLP, the LM head...) run in BF16 or in a
narrower format that the GPU's tensor cores take natively. The narrower the format, the
faster the GEMM and the larger the rounding error; block-scaled formats keep a scale per
small block of elements, so that one outlier costs its block, not the tensor, its range.
The formats, from the public specifications:

* ``fp8``: E4M3 elements with one FP32 scale per tensor, computed from the tensor's absolute
  maximum (an extra read of the tensor before the cast; Transformer Engine's current-scaling
  recipe). Micikevicius et al., "FP8 Formats for Deep Learning", 2022. Hopper and later.
* ``mxfp8``, ``mxfp6``, ``mxfp4``: the OCP Microscaling Formats (MX) Specification v1.0
  (2023): blocks of 32 elements sharing one E8M0 (power-of-two) scale; elements E4M3,
  E2M3 and E2M1. No per-tensor pass: each block's scale comes from the block itself.
  Blackwell runs MXFP8 and MXFP6 at the FP8 rate and MXFP4 at twice it.
* ``nvfp4``: E2M1 elements in blocks of 16 with an FP8 E4M3 scale, plus one FP32 scale per
  tensor (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference",
  2025): finer blocks and non-power-of-two scales make it more accurate than MXFP4, at the
  cost of the per-tensor amax pass. Blackwell runs it at the FP4 rate.

``mxfp4`` has an option: the MXFP4 error-reduction techniques of Chhugani et al.,
"Unveiling the Potential of Quantization with MXFP4: Strategies for Quantization Error
Reduction" (arXiv:2603.08713, 2026): overflow-aware scaling (more usable range under
power-of-two block scales) and macro-block scaling (a higher-precision scale over coarser
blocks, which keeps outliers).
Together they close the MXFP4-to-NVFP4 accuracy gap from about 10 % to under 1 % at 6.2 %
GEMM overhead on average; :data:`MXFP4_ER_GEMM_OVERHEAD` is that figure.

Error scores (:data:`ERROR`) are relative, per GEMM site, with FP8 per-tensor = 1 (so the
error weights of the FP8 sites keep their meaning). They follow each format's rounding step
(2^-mantissa bits) and how well its scales fit the data; they are an ordering with rough
ratios, not a measured loss:

==================  =====  =================================================================
format              error  why
==================  =====  =================================================================
bf16                0      the reference
fp8 (per tensor)    1.0    E4M3, 3 mantissa bits
mxfp8               1.0    the same elements; 32-element blocks fit the range better but
                           power-of-two scales waste up to a binade: about even
mxfp6               1.5    E2M3 keeps 3 mantissa bits but only 2 exponent bits: a block's
                           small elements fall into subnormals
nvfp4               4.0    E2M1: 2 mantissa bits fewer than E4M3, a rounding step 4x as
                           coarse; 16-element blocks with E4M3 scales stay near that floor
mxfp4 + OAS/MBS     4.4    "near NVFP4" (Chhugani et al.: the gap to NVFP4 under 1 %)
mxfp4               6.0    E2M1 with power-of-two scales on 32-element blocks: the block
                           maximum rounds away from its scale (the ~10 % gap to NVFP4)
==================  =====  =================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Format:
    """One GEMM input format.

    ``element_bits`` per value; ``block`` elements share a scale of ``scale_bits`` (0: one
    scale per tensor); ``tensor_scale`` says the format also needs the tensor's absolute
    maximum before it can cast (a read of the whole tensor); ``rate`` is the key of
    :attr:`cubic.hardware.GPU.peak_tflops` it runs at (None: the training precision's)."""

    name: str
    element_bits: int
    block: int
    scale_bits: int
    tensor_scale: bool
    rate: str | None
    error: float
    source: str

    @property
    def stored_bytes(self) -> float:
        """Bytes per element as stored, its share of the block scale included."""
        scale = self.scale_bits / 8.0 / self.block if self.block else 0.0
        return self.element_bits / 8.0 + scale


_OCP_MX = "OCP Microscaling Formats (MX) Specification v1.0, 2023"
_NVFP4 = "NVIDIA, Introducing NVFP4 for Efficient and Accurate Low-Precision Inference, 2025"
_OAS_MBS = (
    "Chhugani et al., Unveiling the Potential of Quantization with MXFP4: Strategies for "
    "Quantization Error Reduction, arXiv:2603.08713"
)

#: Every format, in order of decreasing precision; a site's format code is its index. The
#: last entry is MXFP4 with the error-reduction techniques: not a name a site asks for, but
#: what an MXFP4 site becomes with ``mxfp4_error_reduction``.
FORMATS: tuple[Format, ...] = (
    Format("bf16", 16, 0, 0, False, None, 0.0, "the training precision"),
    Format("fp8", 8, 0, 32, True, "fp8", 1.0, "Micikevicius et al., FP8 Formats for DL, 2022"),
    Format("mxfp8", 8, 32, 8, False, "mxfp8", 1.0, _OCP_MX),
    Format("mxfp6", 6, 32, 8, False, "mxfp6", 1.5, _OCP_MX),
    Format("nvfp4", 4, 16, 8, True, "nvfp4", 4.0, _NVFP4),
    Format("mxfp4", 4, 32, 8, False, "mxfp4", 6.0, _OCP_MX),
    Format("mxfp4_oas_mbs", 4, 32, 8, False, "mxfp4", 4.4, _OAS_MBS),
)
BF16, FP8, MXFP8, MXFP6, NVFP4, MXFP4, MXFP4_ER = range(len(FORMATS))
#: The names a GEMM site's ``<site>_format`` knob takes.
NAMES: tuple[str, ...] = tuple(f.name for f in FORMATS[:MXFP4_ER])
#: The block-scaled (MX and NVFP4) formats: the ones Hopper and Ampere lack.
BLOCK_SCALED: tuple[str, ...] = NAMES[MXFP8:]
#: Relative error score of one GEMM site per format code (FP8 per tensor = 1).
ERROR = np.array([f.error for f in FORMATS])
#: GEMM time added by overflow-aware and macro-block scaling (Chhugani et al.: 6.2 % on
#: average over their LLM GEMMs).
MXFP4_ER_GEMM_OVERHEAD = 0.062
UNSET = -2
UNKNOWN = -1
#: The knob that turns on the MXFP4 error-reduction techniques for every MXFP4 site.
ERROR_REDUCTION_KNOB = "mxfp4_error_reduction"


def format_knob(fp8_site: str) -> str:
    """A GEMM site's format knob, named after its FP8 switch: ``fp8_qkv`` -> ``qkv_format``."""
    return fp8_site.removeprefix("fp8_") + "_format"


def codes(values: np.ndarray) -> np.ndarray:
    """Format names as codes: :data:`UNSET` for None (or an empty string), :data:`UNKNOWN`
    for a name that is not in :data:`NAMES`."""
    v = np.asarray(values, dtype=object)
    out = np.full(v.shape, UNKNOWN, dtype=np.int8)
    out[np.equal(v, None) | (v == "")] = UNSET
    for i, name in enumerate(NAMES):
        out[v == name] = i
    return out


def site_codes(
    fp8: np.ndarray, fmt: np.ndarray | None, error_reduction: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each config's format code for one GEMM site, and where its two knobs disagree.

    ``fp8`` is the site's FP8 switch (``fp8_qkv``...), ``fmt`` its ``<site>_format`` values
    (None: not given). The switch means FP8 with per-tensor scaling, so a format left unset
    or at ``bf16`` follows it; ``fp8`` with any other format is a conflict. Unknown names
    come back as :data:`UNKNOWN`. Where ``error_reduction`` holds, an MXFP4 site is
    :data:`MXFP4_ER`.
    """
    fp8 = np.asarray(fp8, dtype=bool)
    if fmt is None:
        return np.where(fp8, FP8, BF16).astype(np.int8), np.zeros(fp8.shape, dtype=bool)
    c = codes(fmt)
    follows = (c == UNSET) | (c == BF16)
    conflict = fp8 & ~follows & (c != FP8)
    out = np.where(follows, np.where(fp8, FP8, BF16), c)
    if error_reduction is not None:
        out = np.where(np.asarray(error_reduction, dtype=bool) & (out == MXFP4), MXFP4_ER, out)
    return out.astype(np.int8), conflict


def error(code: np.ndarray) -> np.ndarray:
    """Relative error score per format code (:data:`ERROR`; 0 for an unknown name)."""
    code = np.asarray(code)
    return np.where(code >= 0, ERROR[np.maximum(code, 0)], 0.0)


__all__ = [
    "BF16",
    "BLOCK_SCALED",
    "ERROR",
    "ERROR_REDUCTION_KNOB",
    "FORMATS",
    "FP8",
    "MXFP4",
    "MXFP4_ER",
    "MXFP4_ER_GEMM_OVERHEAD",
    "MXFP6",
    "MXFP8",
    "NAMES",
    "NVFP4",
    "UNKNOWN",
    "UNSET",
    "Format",
    "codes",
    "error",
    "format_knob",
    "site_codes",
]

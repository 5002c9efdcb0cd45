"""``cubic sim bench``: how many configurations per second the simulator scores on one core."""

from __future__ import annotations

from collections.abc import Iterator


def bench(n: int = 200_000, repeat: int = 3) -> Iterator[str]:
    """Yield one line per model kind with the best of ``repeat`` timings."""
    from cubic.sim.dlrm import bench_dlrm
    from cubic.sim.llm import bench_llm

    for name, fn in (
        ("llm (llama3_70b, 64x h100_sxm)", bench_llm),
        ("dlrm (dlrm_criteo_dcnv2, 8x a100_80gb)", bench_dlrm),
    ):
        rate = max(fn(n) for _ in range(repeat))
        yield f"{name}: {rate:,.0f} configurations/s ({n:,} per batch, best of {repeat})"

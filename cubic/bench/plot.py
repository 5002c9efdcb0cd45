"""The convergence plot of a search benchmark: best found / optimum against trials."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from cubic.errors import InvalidInput

if TYPE_CHECKING:
    from cubic.bench.search import BenchResult


def plot_convergence(result: BenchResult, path: str | Path) -> None:
    """Write a PNG: one panel per study, per strategy the median and interquartile band.

    Drawn on a bare ``Figure`` (the Agg canvas), so it needs no display and leaves
    pyplot's global state alone.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise InvalidInput(
            "the convergence plot needs matplotlib: pip install 'cubic[bench]'", field="plot"
        ) from exc
    studies = list(result.studies.values())
    strategies = list(dict.fromkeys(r.strategy for r in result.runs))
    ncols = min(2, max(1, len(studies)))
    nrows = math.ceil(len(studies) / ncols) if studies else 1
    fig = Figure(figsize=(6.0 * ncols, 4.0 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    groups = result.groups()
    for ax, info in zip(axes, studies, strict=False):
        for i, name in enumerate(strategies):
            if (info.name, name) not in groups:
                continue
            b = result.band(info.name, name)
            color = f"C{i}"
            ax.plot(b["trials"], b["median"], color=color, label=name, linewidth=1.8)
            ax.fill_between(b["trials"], b["q25"], b["q75"], color=color, alpha=0.2, linewidth=0)
        if info.baseline_ratio is not None:
            ax.axhline(
                info.baseline_ratio, color="0.5", linestyle=":", linewidth=1, label="baseline"
            )
        ax.axhline(1.0, color="0.2", linestyle="--", linewidth=0.8)
        ax.set_title(
            f"{info.name}\n{info.workload} on {info.cluster}, "
            f"{info.size:,} configs, {info.infeasible_share:.0%} infeasible",
            fontsize=9,
        )
        ax.set_xlabel("trials")
        ax.set_ylabel("best found / optimum (true value)")
        ax.set_xlim(1, result.budget)
        ax.set_ylim(0.0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    for ax in axes[len(studies) :]:
        ax.set_visible(False)
    fig.savefig(Path(path), format="png", dpi=110)

"""``cubic bench pruning``: GPU-hours spent and saved by stopping slow trials early.

Each (study, strategy, seed) is searched twice on the simulated cluster, the same way as
:func:`cubic.bench.search.simulate_search` (the asynchronous loop of ``workers`` workers, jobs
with the default noise, seeded per trial number), once without pruning and once with the
study's ``pruning:`` rule (its defaults when the study has none). With pruning every job runs
step by step: after each step the rule judges it (:func:`cubic.pruning.judge`) against the
complete trials finished by then, and a trial it stops frees its worker at once and costs
only the steps it ran (``simulate_search``'s ``rule``).

What it reports per run: the GPU-hours of every job (the steps each ran, as the jobs report
them) and the best config found (its true value over the space's optimum), without and with
pruning, and the share of GPU-hours pruning saved over the whole budget; and, at equal
best-found, the GPU-hours each run spent until its incumbent first reached the best that the
run without pruning found (in the order trials finished), and the share saved there (none
when the run with pruning never reached it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cubic.bench.search import (
    StudyInfo,
    build_strategy,
    landscape,
    load_study,
    parse_seeds,
    score_run,
    simulate_search,
)
from cubic.objectives import better, number, objective_values
from cubic.shipped import SHIPPED_DIR
from cubic.store.objects import Trial, TrialState
from cubic.study import PruningSpec, ResolvedStudy

DEFAULT_STUDY = SHIPPED_DIR / "llama3_8b_pruning.study.yaml"


def gpu_hours(trials: Sequence[Trial]) -> float:
    """The GPU-hours the jobs of ``trials`` report (every attempt's)."""
    return float(sum(number((t.metrics or {}).get("gpu_hours")) or 0.0 for t in trials))


def hours_to(
    study: ResolvedStudy, trials: Sequence[Trial], ratio: np.ndarray, target: float
) -> float | None:
    """GPU-hours of the trials finished (in finish order) until the incumbent (the best
    measured complete trial) had a true value over the optimum of ``target`` or more; None if
    it never had."""
    spent = 0.0
    best: tuple[float, Trial] | None = None
    done = sorted((t for t in trials if t.is_finished), key=lambda t: (t.finished_at, t.number))
    for t in done:
        spent += number((t.metrics or {}).get("gpu_hours")) or 0.0
        if t.state == TrialState.COMPLETE and t.metrics and not t.error:
            vals = objective_values(study.spec, t.metrics)
            if vals is not None and (best is None or better(study.spec, vals[0], best[0])):
                best = (vals[0], t)
        if best is not None and ratio[best[1].number] >= target - 1e-12:
            return spent
    return None


@dataclass(frozen=True)
class PruningRun:
    """One (study, strategy, seed) searched without and with pruning."""

    study: str
    strategy: str
    seed: int
    trials: int
    pruned: int
    gpu_hours_off: float
    gpu_hours_on: float
    best_ratio_off: float
    best_ratio_on: float
    hours_to_best_off: float
    hours_to_best_on: float | None

    @property
    def saved(self) -> float:
        """Share of the whole budget's GPU-hours that pruning saved."""
        return 1.0 - self.gpu_hours_on / self.gpu_hours_off if self.gpu_hours_off > 0 else 0.0

    @property
    def saved_to_best(self) -> float | None:
        """Share of the GPU-hours to reach the best found without pruning that pruning saved
        (None: with pruning that best was never reached)."""
        if self.hours_to_best_on is None or self.hours_to_best_off <= 0:
            return None
        return 1.0 - self.hours_to_best_on / self.hours_to_best_off

    @property
    def same_best(self) -> bool:
        """Whether the run with pruning found a config as good as the run without."""
        return self.best_ratio_on >= self.best_ratio_off - 1e-9

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "saved": self.saved,
            "saved_to_best": self.saved_to_best,
            "same_best": self.same_best,
        }


def _ratios(study: ResolvedStudy, info: StudyInfo, trials: Sequence[Trial]) -> np.ndarray:
    from cubic.bench.search import _ratio, _true_values
    from cubic.sim import simulate

    values, _ = _true_values(study, simulate(study.workload, [t.params for t in trials]))
    return _ratio(study, values, info.optimum)


def compare(
    study: ResolvedStudy,
    strategy: str,
    seed: int,
    *,
    workers: int = 8,
    budget: int = 64,
    rule: PruningSpec | None = None,
    info: StudyInfo | None = None,
) -> PruningRun:
    """Search ``study`` without and with pruning (``rule``: the study's, else the defaults,
    enabled), same seed, and measure what pruning saved at equal best-found."""
    info = info or landscape(study)
    rule = (rule or study.spec.pruning).model_copy(update={"enabled": True})
    runs = []
    for r in (None, rule):
        strat, _ = build_strategy(strategy, study, seed)
        trials = simulate_search(study, strat, seed=seed, workers=workers, budget=budget, rule=r)
        scored = score_run(study, info, trials, strategy=strategy, seed=seed, with_tau=False)
        runs.append((trials, scored, _ratios(study, info, trials)))
    (off, off_score, off_ratio), (on, on_score, on_ratio) = runs
    target = off_score.best_ratio
    to_off = hours_to(study, off, off_ratio, target)
    return PruningRun(
        study=study.spec.name,
        strategy=strategy,
        seed=seed,
        trials=on_score.n_trials,
        pruned=sum(t.state == TrialState.PRUNED for t in on),
        gpu_hours_off=gpu_hours(off),
        gpu_hours_on=gpu_hours(on),
        best_ratio_off=off_score.best_ratio,
        best_ratio_on=on_score.best_ratio,
        hours_to_best_off=to_off if to_off is not None else gpu_hours(off),
        hours_to_best_on=hours_to(study, on, on_ratio, target),
    )


@dataclass
class PruningBench:
    """Every run of ``cubic bench pruning`` and the settings they ran with."""

    settings: dict[str, Any]
    runs: list[PruningRun] = field(default_factory=list)

    def summary(self) -> list[dict[str, Any]]:
        groups: dict[tuple[str, str], list[PruningRun]] = {}
        for r in self.runs:
            groups.setdefault((r.study, r.strategy), []).append(r)
        rows = []
        for (study, strategy), runs in groups.items():
            rows.append(
                {
                    "study": study,
                    "strategy": strategy,
                    "runs": len(runs),
                    "pruned": float(np.median([r.pruned / max(1, r.trials) for r in runs])),
                    "gpu_hours_off": float(np.median([r.gpu_hours_off for r in runs])),
                    "gpu_hours_on": float(np.median([r.gpu_hours_on for r in runs])),
                    "hours_to_best_off": float(np.median([r.hours_to_best_off for r in runs])),
                    "hours_to_best_on": _median_or_none([r.hours_to_best_on for r in runs]),
                    "reached": sum(r.hours_to_best_on is not None for r in runs),
                    "same_best": sum(r.same_best for r in runs),
                    "saved": float(np.median([r.saved for r in runs])),
                    "saved_to_best": float(np.median([r.saved_to_best or 0.0 for r in runs])),
                    "best_ratio_off": float(np.median([r.best_ratio_off for r in runs])),
                    "best_ratio_on": float(np.median([r.best_ratio_on for r in runs])),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "runs": [r.to_dict() for r in self.runs],
            "summary": self.summary(),
        }

    def table(self) -> Any:
        from rich.table import Table

        t = Table(
            title=f"pruning: without / with, median over {len(self.settings['seeds'])} seeds, "
            f"{self.settings['workers']} workers, {self.settings['budget']} trials",
            caption="GPU-hours: the whole budget's; best: true value / optimum (same: runs "
            "with pruning that found as good a config); to best: GPU-hours until the "
            "incumbent reached the best found without pruning (reached: runs with pruning "
            "that got there, a run that did not saves nothing there)",
        )
        cols = ("study", "strategy", "pruned", "GPU-hours", "saved", "best", "same", "to best")
        for col in (*cols, "saved there"):
            t.add_column(col, justify="left" if col in ("study", "strategy") else "right")
        for row in self.summary():
            on = row["hours_to_best_on"]
            t.add_row(
                row["study"],
                row["strategy"],
                f"{row['pruned']:.0%}",
                f"{row['gpu_hours_off']:,.1f} / {row['gpu_hours_on']:,.1f}",
                f"{row['saved']:.0%}",
                f"{row['best_ratio_off']:.3f} / {row['best_ratio_on']:.3f}",
                f"{row['same_best']}/{row['runs']}",
                f"{row['hours_to_best_off']:,.1f} / "
                + ("-" if on is None else f"{on:,.1f}")
                + f" ({row['reached']}/{row['runs']})",
                f"{row['saved_to_best']:.0%}",
            )
        return t


def _median_or_none(xs: Sequence[float | None]) -> float | None:
    med = float(np.median([math.inf if x is None else x for x in xs]))
    return None if math.isinf(med) else med


def bench_pruning(
    studies: Sequence[str | Path] | None = None,
    strategies: str | Sequence[str] | None = None,
    seeds: str | Sequence[int] | None = None,
    *,
    workers: int = 8,
    budget: int = 64,
    console: Any = None,
) -> PruningBench:
    """``cubic bench pruning``: every study x strategy x seed, without and with pruning."""
    files = [Path(s) for s in studies] if studies else [DEFAULT_STUDY]
    if isinstance(strategies, str):
        names = [s.strip() for s in strategies.split(",") if s.strip()]
    else:
        names = list(strategies or [])
    seed_list = parse_seeds(seeds)
    result = PruningBench(
        {
            "studies": [str(f) for f in files],
            "strategies": names or ["(each study's own)"],
            "seeds": seed_list,
            "workers": workers,
            "budget": budget,
        }
    )
    for f in files:
        study = load_study(f)
        info = landscape(study, f)
        for name in names or [study.spec.strategy.name]:
            for seed in seed_list:
                run = compare(study, name, seed, workers=workers, budget=budget, info=info)
                result.runs.append(run)
                if console is not None:
                    console.print(
                        f"{run.study} {run.strategy} seed {seed}: {run.pruned} of "
                        f"{run.trials} trials pruned, {run.saved:.0%} of the GPU-hours saved, "
                        f"best {run.best_ratio_off:.3f} without, {run.best_ratio_on:.3f} with"
                    )
    return result

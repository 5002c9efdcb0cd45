"""A live Rich display of a study's progress, read from the service."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cubic.client import CubicClient

FINAL = {"completed", "stopped", "archived"}


def _finished(progress: dict[str, Any]) -> int:
    counts = progress.get("counts", {})
    return sum(v for k, v in counts.items() if k not in ("waiting", "running"))


def summary(client: CubicClient, study: dict[str, Any]) -> str:
    """One line: state, trials by state, the best value and its speed-up, GPU-hours."""
    from cubic.errors import NotFound
    from cubic.objectives import number

    counts = {k: v for k, v in study["progress"]["counts"].items() if v}
    parts = [
        f"study {study['id']}: {study['state']}",
        f"{sum(counts.values())} trials ("
        + ", ".join(f"{n} {state}" for state, n in counts.items())
        + ")",
    ]
    try:
        best = client.best(study["id"])
    except NotFound:
        best = None
    if best is not None:
        line = f"best {best['metric']} {best['value']:,.4g}"
        if best.get("speedup") is not None:
            line += f" ({best['speedup']:.2f}x the baseline)"
        parts.append(line)
    trials = client.all_trials(study["id"])
    hours = [number((t.get("metrics") or {}).get("gpu_hours")) for t in trials]
    if any(h is not None for h in hours):
        parts.append(f"{sum(h or 0.0 for h in hours):,.1f} GPU-hours")
    return "; ".join(parts)


def watch_study(
    client: CubicClient,
    study_id: int,
    console: Console,
    *,
    interval: float = 0.5,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Show trials done and the best value so far until the study ends; return the study."""
    study = client.get_study(study_id)
    metric = study["spec"]["objectives"][0]["metric"]
    start = time.monotonic()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("trials", total=study["progress"]["max_trials"])
        while True:
            prog = study["progress"]
            best = prog.get("best_value")
            shown = f"{best:,.0f}" if isinstance(best, int | float) else "-"
            bar.update(
                task,
                completed=min(_finished(prog), prog["max_trials"]),
                description=f"{study['state']}: best {metric} {shown}",
            )
            if study["state"] in FINAL:
                return study
            if timeout is not None and time.monotonic() - start > timeout:
                return study
            time.sleep(interval)
            study = client.get_study(study_id)

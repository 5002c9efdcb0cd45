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

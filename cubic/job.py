"""The job contract, job side: read the trial's config, time steps, report metrics.

A training script started by a cubic runner needs only this module (no service, no
database)::

    from cubic.job import StepTimer, load_config, report

    cfg = load_config()                       # {"micro_batch": 4, ...}
    timer = StepTimer()                       # warm-up steps from CUBIC_WARMUP_STEPS
    for step in range(steps):
        with timer.step(tokens=tokens_per_step):
            train_step()
    report(timer.metrics())                   # tokens_per_s over the timed steps only

While it runs, the timer keeps the job's progress (steps, mean and spread of the step times
after warm-up) in the file ``CUBIC_PROGRESS`` names, for a study that stops slow trials early
(:mod:`cubic.pruning`). Outside a runner (no ``CUBIC_CONFIG``) :func:`load_config` returns
``{}`` and :func:`report` prints the metrics line, so the same script runs by hand.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cubic.errors import InvalidInput
from cubic.pruning import Progress

METRICS_PREFIX = "CUBIC_METRICS"
PROGRESS_ENV = "CUBIC_PROGRESS"
"""The variable naming the file a job's :class:`StepTimer` keeps its progress in."""
PROGRESS_EVERY_S = 0.2
"""Least seconds between two writes of the progress file (a fast loop is not slowed)."""


def load_document() -> dict[str, Any]:
    """The whole config document: ``params``, ``trial``, ``workload``, ``objectives``."""
    path = os.environ.get("CUBIC_CONFIG")
    if path and Path(path).is_file():
        return json.loads(Path(path).read_text())
    inline = os.environ.get("CUBIC_CONFIG_JSON")
    return json.loads(inline) if inline else {}


def load_config() -> dict[str, Any]:
    """The trial's knobs by name ({} when not started by a runner)."""
    return dict(load_document().get("params", {}))


def report(metrics: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    """Report the job's metrics: to the ``CUBIC_METRICS`` file and as a line on stdout.

    Call it once, at the end; the last report wins. Values must be finite numbers.
    """
    doc = {**(metrics or {}), **more}
    for key, value in doc.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"metric {key!r}: must be finite, got {value}")
    text = json.dumps(doc, sort_keys=True)
    path = os.environ.get("CUBIC_METRICS")
    if path:
        tmp = Path(path).with_suffix(".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(path)  # atomic: a runner never reads half a file
    print(f"{METRICS_PREFIX} {text}", flush=True)
    sys.stdout.flush()
    return doc


class StepTimer:
    """Times training steps and leaves the first ``warmup`` out of the throughput.

    The first steps of a job pay for compilation, allocator growth and communicator set-up;
    counting them would rank configs by start-up cost, not by steady-state speed.

    After each step it writes the job's progress (:class:`cubic.pruning.Progress`) to
    ``progress_path`` (default: ``$CUBIC_PROGRESS``), at most every ``PROGRESS_EVERY_S``
    seconds, so that the worker can stop a clearly slow trial early. ``publish`` (default:
    only the process of rank 0, ``$RANK``) says whether this process writes it: the ranks
    of one job would otherwise write the same file.
    """

    def __init__(
        self,
        warmup: int | None = None,
        *,
        progress_path: str | os.PathLike[str] | None = None,
        publish: bool | None = None,
    ) -> None:
        if warmup is None:
            warmup = int(os.environ.get("CUBIC_WARMUP_STEPS", "0") or 0)
        if warmup < 0:
            raise ValueError("warmup must be >= 0")
        self.warmup = warmup
        self.steps = 0
        self.timed_steps = 0
        self.seconds = 0.0
        self.tokens = 0.0
        self.samples = 0.0
        self.elapsed = 0.0  # every step, the warm-up included
        self._m2 = 0.0  # Welford's sum of squared deviations of the timed step times
        if publish is None:
            publish = os.environ.get("RANK", "0") == "0"
        path = progress_path if progress_path is not None else os.environ.get(PROGRESS_ENV)
        self.progress_path = Path(path) if path and publish else None
        self._written = -math.inf

    @contextmanager
    def step(self, *, tokens: float = 0.0, samples: float = 0.0) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(time.perf_counter() - start, tokens=tokens, samples=samples)

    def record(self, seconds: float, *, tokens: float = 0.0, samples: float = 0.0) -> None:
        """Add one step that took ``seconds`` (for loops that time themselves)."""
        self.steps += 1
        self.elapsed += seconds
        if self.steps > self.warmup:
            mean = self.seconds / self.timed_steps if self.timed_steps else 0.0
            self.timed_steps += 1
            self.seconds += seconds
            self._m2 += (seconds - mean) * (seconds - self.seconds / self.timed_steps)
            self.tokens += tokens
            self.samples += samples
        if self.progress_path is not None and time.monotonic() - self._written >= PROGRESS_EVERY_S:
            self._write_progress()

    def progress(self) -> Progress:
        """Where the job stands: steps run, and the step times after warm-up."""
        n = self.timed_steps
        units = self.tokens or self.samples
        return Progress(
            steps=self.steps,
            timed_steps=n,
            step_time_s=self.seconds / n if n and self.seconds > 0 else None,
            step_time_std_s=math.sqrt(max(self._m2, 0.0) / (n - 1)) if n > 1 else 0.0,
            throughput=units / self.seconds if units and self.seconds > 0 else None,
            elapsed_s=self.elapsed,
        )

    def _write_progress(self) -> None:
        assert self.progress_path is not None
        self._written = time.monotonic()
        try:
            tmp = self.progress_path.with_name(f".{self.progress_path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.progress().to_dict()))
            tmp.replace(self.progress_path)  # atomic: a reader never sees half a file
        except (OSError, ValueError, InvalidInput):  # advice only: training goes on without it
            self.progress_path = None

    def metrics(self) -> dict[str, float]:
        """``step_time_s``, and ``tokens_per_s``/``samples_per_s`` (``throughput``: the first)."""
        if self.timed_steps == 0 or self.seconds <= 0:
            raise RuntimeError(
                f"no timed steps: {self.steps} step(s) run, {self.warmup} of them warm-up"
            )
        out = {"step_time_s": self.seconds / self.timed_steps, "timed_steps": self.timed_steps}
        if self.tokens:
            out["tokens_per_s"] = self.tokens / self.seconds
        if self.samples:
            out["samples_per_s"] = self.samples / self.seconds
        rate = out.get("tokens_per_s", out.get("samples_per_s"))
        if rate is not None:
            out["throughput"] = rate
        return out

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

Outside a runner (no ``CUBIC_CONFIG``) :func:`load_config` returns ``{}`` and
:func:`report` prints the metrics line, so the same script runs by hand.
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

METRICS_PREFIX = "CUBIC_METRICS"


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
    """

    def __init__(self, warmup: int | None = None) -> None:
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

    @contextmanager
    def step(self, *, tokens: float = 0.0, samples: float = 0.0) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.record(time.perf_counter() - start, tokens=tokens, samples=samples)

    def record(self, seconds: float, *, tokens: float = 0.0, samples: float = 0.0) -> None:
        """Add one step that took ``seconds`` (for loops that time themselves)."""
        self.steps += 1
        if self.steps <= self.warmup:
            return
        self.timed_steps += 1
        self.seconds += seconds
        self.tokens += tokens
        self.samples += samples

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

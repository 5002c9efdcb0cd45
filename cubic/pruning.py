"""Early stopping of slow trials: what a running job's step times say, and the rules that judge
them.

A job reports its progress while it runs (:class:`Progress`: how many steps it has run, and
the mean and spread of its step times after its warm-up); the worker carries it to the
service on a heartbeat, and :func:`judge` decides there whether the trial can still matter.
Throughput after warm-up does not trend the way a loss curve does: it is one number measured
ever more precisely, so a verdict rests on how precisely it is known by now.

* ``threshold`` (the default): with ``n`` timed steps of mean ``m`` and standard deviation
  ``s``, the step time is at least ``m - t * s / sqrt(n)`` with the stated confidence
  (one-sided Student t, ``n - 1`` degrees of freedom), so the throughput is at most the
  measured one times ``m`` over that bound. A trial whose bound is below ``fraction`` of the
  study's best complete throughput cannot become a useful config: it is stopped.
* ``median`` and ``percentile``: Optuna's :class:`~optuna.pruners.MedianPruner` and
  :class:`~optuna.pruners.PercentilePruner` rule, computed here on the study's own values
  (building an Optuna study at every heartbeat would cost more than the rule): a trial whose
  measured throughput is below the median, or outside the top ``percentile`` per cent, of
  the complete trials' throughputs is stopped. A complete trial's throughput after warm-up is
  its intermediate value at every step, since it is the same quantity, measured to the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cubic.errors import InvalidInput

if TYPE_CHECKING:  # the job SDK imports this module: it stays light
    from cubic.study import PruningSpec

PROGRESS_REPORT_S = 5.0
"""Least seconds between two progress reports a worker sends for one trial: a training step
takes seconds, and a verdict needs several of them."""
MAX_STEPS = 10**9
"""The most steps a progress report may count (a job runs thousands, not billions)."""
MAX_SECONDS = 1e9
"""The longest step time or elapsed time a progress report may give, in seconds."""
MAX_THROUGHPUT = 1e15
"""The largest throughput a progress report may give (units per second)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a running job has got: cumulative, so that a repeated report is harmless.

    ``steps`` counts every step run, the job's warm-up included; ``timed_steps`` those after
    it, which ``step_time_s`` (mean), ``step_time_std_s`` (sample standard deviation) and
    ``throughput`` (tokens or samples per second) cover; ``elapsed_s`` is the seconds of all
    steps.
    """

    steps: int
    timed_steps: int = 0
    step_time_s: float | None = None
    step_time_std_s: float = 0.0
    throughput: float | None = None
    elapsed_s: float | None = None

    def __post_init__(self) -> None:
        _check(self, "progress")

    @classmethod
    def from_dict(cls, data: Any, field: str = "progress") -> Progress:
        """A progress report from JSON; bad input raises :class:`InvalidInput` naming the
        field. Keys it does not know are left out (a job may report more)."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{field}: expected a mapping", field=field)
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "steps" not in known:
            raise InvalidInput(f"{field}.steps: required", field=f"{field}.steps")
        obj = object.__new__(cls)
        for k in cls.__dataclass_fields__:
            default = cls.__dataclass_fields__[k].default
            object.__setattr__(obj, k, known.get(k, default))
        _check(obj, field)
        return obj

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def of_times(
        cls, times: Sequence[float] | np.ndarray, warmup: int, units_per_step: float
    ) -> Progress:
        """The progress of a job whose steps took ``times`` (seconds, in order), the first
        ``warmup`` of them left out of the statistics; each step processes
        ``units_per_step`` tokens or samples."""
        t = np.asarray(times, dtype=float)
        timed = t[warmup:]
        n = len(timed)
        mean = float(timed.mean()) if n else None
        return cls(
            steps=len(t),
            timed_steps=n,
            step_time_s=mean,
            step_time_std_s=float(timed.std(ddof=1)) if n > 1 else 0.0,
            throughput=units_per_step / mean if mean and units_per_step > 0 else None,
            elapsed_s=float(t.sum()),
        )


def _check(p: Progress, field: str) -> None:
    def bad(name: str, why: str) -> InvalidInput:
        return InvalidInput(f"{field}.{name}: {why}", field=f"{field}.{name}")

    for name in ("steps", "timed_steps"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise bad(name, f"expected an integer, got {v!r:.40}")
        if not 0 <= v <= MAX_STEPS:
            raise bad(name, f"must be between 0 and {MAX_STEPS}")
    if p.timed_steps > p.steps:
        raise bad("timed_steps", "cannot exceed steps")
    limits = {
        "step_time_s": MAX_SECONDS,
        "step_time_std_s": MAX_SECONDS,
        "throughput": MAX_THROUGHPUT,
        "elapsed_s": MAX_SECONDS,
    }
    for name, top in limits.items():
        v = getattr(p, name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise bad(name, f"expected a finite number, got {v!r:.40}")
        if not 0 <= v <= top:
            raise bad(name, f"must be between 0 and {top:g}")
    if p.step_time_std_s is None:
        raise bad("step_time_std_s", "expected a finite number, got None")
    if p.timed_steps > 0 and not p.step_time_s:
        raise bad("step_time_s", "a positive mean step time is needed once steps are timed")


@dataclass(frozen=True, slots=True)
class Verdict:
    """A pruner's decision on a running trial, with its evidence.

    ``bound`` is what was compared: the throughput's upper confidence bound (``threshold``)
    or the measured throughput (``median``, ``percentile``); ``limit`` is what it had to
    reach; ``best`` is the study's best complete throughput and ``trials`` the number of
    complete trials it was judged against.
    """

    prune: bool
    method: str
    timed_steps: int
    throughput: float
    bound: float
    limit: float
    best: float
    trials: int
    reason: str

    def metrics(self) -> dict[str, float]:
        """The evidence as metrics of the pruned trial's report."""
        return {
            "pruned_timed_steps": self.timed_steps,
            "pruned_throughput": self.throughput,
            "pruned_bound": self.bound,
            "pruned_limit": self.limit,
            "pruned_best": self.best,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def upper_bound(progress: Progress, confidence: float) -> float:
    """The throughput's one-sided upper confidence bound from the step times (inf when the
    step-time noise leaves the step time's lower bound at zero)."""
    from scipy.stats import t as student_t

    n = progress.timed_steps
    mean = progress.step_time_s
    if progress.throughput is None or not mean or n < 2:
        return math.inf
    q = float(student_t.ppf(confidence, n - 1))
    low = mean - q * progress.step_time_std_s / math.sqrt(n)
    return progress.throughput * mean / low if low > 0 else math.inf


def judge(rule: PruningSpec, progress: Progress, values: Iterable[float]) -> Verdict | None:
    """Judge a running trial against the complete trials' throughputs ``values`` (those of
    the study's objective, within its constraints); None while it is too early to say
    (warm-up, too few timed steps, too few complete trials, no throughput measured)."""
    if progress.steps <= rule.warmup_steps or progress.timed_steps < max(2, rule.min_steps):
        return None
    if progress.throughput is None or progress.step_time_s is None:
        return None
    done = np.array([v for v in values if math.isfinite(v) and v > 0], dtype=float)
    if len(done) < rule.startup_trials or len(done) == 0:
        return None
    best = float(done.max())
    measured = float(progress.throughput)
    n = progress.timed_steps
    if rule.method == "threshold":
        bound = upper_bound(progress, rule.confidence)
        limit = rule.fraction * best
        prune = bound < limit
        what = (
            f"{measured:,.6g}/s measured over {n} timed steps, at most {bound:,.6g}/s with "
            f"{rule.confidence:.0%} confidence given the step-time noise, "
            f"{'below' if prune else 'not below'} {rule.fraction:g} x the best {best:,.6g}/s"
        )
    else:
        keep = 50.0 if rule.method == "median" else rule.percentile
        bound = measured
        limit = float(np.percentile(done, 100.0 - keep))  # Optuna's rule, maximising
        prune = bound < limit
        label = "median" if rule.method == "median" else f"{100.0 - keep:g}th percentile"
        what = (
            f"{measured:,.6g}/s measured over {n} timed steps, "
            f"{'below' if prune else 'not below'} the {label} {limit:,.6g}/s of "
            f"{len(done)} complete trials"
        )
    reason = f"pruned ({rule.method}): {what}" if prune else what
    return Verdict(prune, rule.method, n, measured, bound, limit, best, len(done), reason)

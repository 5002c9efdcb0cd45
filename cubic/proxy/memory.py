"""Will a configuration fit in GPU memory? The arithmetic estimate, corrected per study.

The proxy's features hold the back-of-envelope peak memory per GPU an engineer computes
before launching a job (weights, gradients, optimizer state and activations over the
shards): :func:`estimate_ratio` reads it as a share of HBM. It is right to a few per cent
on average but errs by layout (how a framework keeps buffers, fragmentation, what it
frees early), so :class:`MemoryModel` learns a per-study correction from what the jobs
themselves report:

* a complete job may report its measured peak (``peak_memory_gb`` in 10^9 bytes, or
  ``peak_memory_gib``; PyTorch's ``torch.cuda.max_memory_allocated``): an observation of
  the estimate's error at that config;
* an out-of-memory job says the config needs more than the HBM (or than what it reported
  needing): a lower bound, used where the fit would otherwise call that config a fit.

The correction is a Bayesian linear model of ``log(measured / estimate)`` over the
standardised features, with a prior that keeps it near zero until data say otherwise, so
a handful of trials shift the whole region they stand for (one OOM at ZeRO-1, tp=4 moves
every similar config) and its predictive spread gives each candidate a probability of
fitting. Learned attributes end in ``_``.

A job also holds memory the arithmetic does not scale with its shards: the CUDA context,
communication buffers, the allocator's workspace. A few GB are a rounding error for a
config near the limit but a fifth of a lean one's peak, which a correction proportional to
the estimate cannot follow across the range. With ``overhead=True`` the model first fits
that fixed amount to the reports (:attr:`MemoryModel.overhead_`) and corrects the estimate
plus it: what a study that *minimises* peak memory needs to rank its leanest configs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cubic.objectives import reported_peak_bytes
from cubic.proxy.features import feature_names, memory_columns
from cubic.runners.contract import OOM_RE
from cubic.store.objects import Trial, TrialState
from cubic.workload import Workload


def is_oom(trial: Trial) -> bool:
    """Whether an infeasible trial ran out of memory (rather than being invalid)."""
    if trial.state != TrialState.INFEASIBLE:
        return False
    return bool(OOM_RE.search(trial.error or "") or OOM_RE.search(trial.log_tail or ""))


def estimate_ratio(kind: str, X: np.ndarray) -> np.ndarray:
    """The uncorrected estimate of peak memory per GPU over HBM, from feature rows ``X``."""
    names = feature_names(kind)
    if "memory_ratio" not in names:
        return np.zeros(len(X))
    return np.maximum(X[:, names.index("memory_ratio")], 1e-9)


class MemoryModel:
    """The memory estimate of one study, corrected by its own jobs' reports.

    Before any report the estimate's log error has spread ``offset_sd`` in common to every
    config (a framework that keeps more buffers than the arithmetic counts) and ``shape_sd``
    that varies with the config (shared among the features); ``noise_sd`` is the scatter of
    one measurement around the model and ``limit`` the share of HBM a config may use (one
    minus the study's headroom).
    """

    def __init__(
        self,
        workload: Workload,
        *,
        limit: float = 1.0,
        offset_sd: float = 0.15,
        shape_sd: float = 0.05,
        noise_sd: float = 0.01,
        oom_margin: float = 0.01,
        local_sd: float = 0.03,
        length_scale: float = 2.0,
        local_rows: int = 256,
        overhead: bool = False,
        max_overhead: float = 0.1,
    ) -> None:
        self.workload = workload
        self.limit = limit
        self.offset_sd = offset_sd
        self.shape_sd = shape_sd
        self.noise_sd = noise_sd
        self.oom_margin = oom_margin
        self.local_sd = local_sd
        self.length_scale = length_scale
        self.local_rows = local_rows
        self.overhead = overhead
        self.max_overhead = max_overhead
        self.overhead_ = 0.0
        self.n_measured_ = 0
        self.n_oom_ = 0
        self.center_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None
        self.mean_: np.ndarray | None = None
        self.cov_: np.ndarray | None = None
        self.local_: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._columns = 1 + memory_columns(workload.kind)  # past the design's intercept

    # -- fitting ---------------------------------------------------------------------------
    def estimate(self, X: np.ndarray) -> np.ndarray:
        """The estimate the correction applies to: the arithmetic one plus the fitted fixed
        overhead (a share of HBM; 0 unless ``overhead``)."""
        return estimate_ratio(self.workload.kind, X) + self.overhead_

    def _fit_overhead(self, est: np.ndarray, measured: np.ndarray) -> float:
        """The fixed overhead (share of HBM, 0 to ``max_overhead``) that makes the reports
        most nearly proportional to the estimate plus it: the least scatter of
        log(measured / (estimate + overhead)). Three reports at least, else 0."""
        if len(measured) < 3:
            return 0.0
        grid = np.linspace(0.0, self.max_overhead, 101)
        r = np.log(measured[None, :]) - np.log(est[None, :] + grid[:, None])
        return float(grid[int(np.argmin(r.var(axis=1)))])

    def _design(self, X: np.ndarray) -> np.ndarray:
        assert self.center_ is not None and self.scale_ is not None
        Z = (X - self.center_) / self.scale_
        return np.concatenate([np.ones((len(X), 1)), np.clip(Z, -5.0, 5.0)], axis=1)

    def _posterior(self, A: np.ndarray, r: np.ndarray) -> None:
        d = A.shape[1]
        prior_var = np.full(d, self.shape_sd**2 / max(1, d - 1))
        prior_var[0] = self.offset_sd**2
        precision = np.diag(1.0 / prior_var) + A.T @ A / self.noise_sd**2
        self.cov_ = np.linalg.inv(precision)
        self.mean_ = self.cov_ @ (A.T @ r) / self.noise_sd**2

    def fit(
        self, X: np.ndarray, trials: Sequence[Trial], reference: np.ndarray | None = None
    ) -> MemoryModel:
        """Learn the correction from ``trials`` (finished trials of this study) whose feature
        rows are ``X``; trials with nothing to say are ignored. ``reference`` (feature rows
        of candidates, say) sets the scale the features are standardised on; by default the
        trials' own. Returns self."""
        if len(X) != len(trials):
            raise ValueError(f"X has {len(X)} rows for {len(trials)} trials")
        hbm = self.workload.gpu.hbm_bytes
        est = estimate_ratio(self.workload.kind, X) if len(X) else np.zeros(0)
        self.overhead_ = 0.0
        if self.overhead:
            ran = [
                (i, peak / hbm)
                for i, t in enumerate(trials)
                if t.state in TrialState.MEASURED
                and (peak := reported_peak_bytes(t.metrics)) is not None
            ]
            self.overhead_ = self._fit_overhead(
                est[[i for i, _ in ran]], np.array([v for _, v in ran], dtype=float)
            )
            est = est + self.overhead_
        rows, targets, bounds = [], [], []
        for i, t in enumerate(trials):
            peak = reported_peak_bytes(t.metrics)
            if t.state in TrialState.MEASURED and peak is not None:  # it ran: pruned too
                rows.append(i)
                targets.append(math.log(peak / hbm / est[i]))
            elif is_oom(t):
                need = max(hbm, peak or 0.0) * (1.0 + self.oom_margin)
                bounds.append((i, math.log(need / hbm / est[i])))
        self.n_measured_, self.n_oom_ = len(rows), len(bounds)
        d = X.shape[1] if X.ndim == 2 else 0
        ref = X[[*rows, *(i for i, _ in bounds)]] if reference is None else reference
        if len(ref):
            self.center_ = ref.mean(axis=0)
            spread = ref.std(axis=0)
            self.scale_ = np.where(spread > 1e-9, spread, np.inf)  # constant columns drop out
        else:
            self.center_, self.scale_ = np.zeros(d), np.ones(d)
        if not rows and not bounds:
            self.mean_ = self.cov_ = None
            self.local_ = None
            return self
        A_all = self._design(X)
        A = A_all[rows]
        r = np.asarray(targets, dtype=float)
        self._posterior(A, r)
        # An OOM whose config the fit still calls a fit is a lower bound it must respect:
        # add it as an observation at the bound, and refit (twice is enough in practice).
        for _ in range(3):
            low = [(i, b) for i, b in bounds if float(A_all[i] @ self.mean_) < b]
            if not low:
                break
            A = np.concatenate([A, A_all[[i for i, _ in low]]])
            r = np.concatenate([r, [b for _, b in low]])
            bounds = [(i, b) for i, b in bounds if (i, b) not in low]
            self._posterior(A, r)
        self._fit_local(A, r)
        return self

    def _kernel(self, Z1: np.ndarray, Z2: np.ndarray) -> np.ndarray:
        # In place, in the order of the plain expression (the same values): with a study's
        # whole candidate pool as Z1 each temporary is tens of megabytes.
        out = (Z1**2).sum(axis=1)[:, None] + (Z2**2).sum(axis=1)[None, :]
        cross = Z1 @ Z2.T
        cross *= 2.0
        out -= cross
        np.maximum(out, 0.0, out=out)
        out *= -0.5
        out /= self.length_scale**2
        np.exp(out, out=out)
        out *= self.local_sd**2
        return out

    def correlation(self, X: np.ndarray, Q: np.ndarray) -> np.ndarray:
        """How much of what a job at each row of ``Q`` will report about its memory carries
        to each row of ``X`` (0 to 1): the correlation of the local part of the correction."""
        if len(X) == 0 or len(Q) == 0:
            return np.zeros((len(X), len(Q)))
        c = self._columns
        return self._kernel(self._design(X)[:, c], self._design(Q)[:, c]) / self.local_sd**2

    def _fit_local(self, A: np.ndarray, r: np.ndarray) -> None:
        """What the linear correction leaves unexplained at each observation, as a Gaussian
        process over the standardised memory columns: a config next to a measured one (another
        overlap flag, say) gets that measurement, not the average error of the study."""
        assert self.mean_ is not None
        # A GP costs cubic time in its rows: the newest reports (rows are in the order the
        # trials finished; OOM bounds come last) keep each round's work bounded.
        A, r = A[-int(self.local_rows) :], r[-int(self.local_rows) :]
        Z = A[:, self._columns]
        K = self._kernel(Z, Z) + self.noise_sd**2 * np.eye(len(Z))
        from scipy.linalg import cho_factor, cho_solve, solve_triangular

        c, low = cho_factor(K, lower=True)
        alpha = cho_solve((c, low), r - A @ self.mean_)
        # The inverse factor, once: each prediction's variance is then one matrix product.
        L_inv = solve_triangular(np.tril(c), np.eye(len(Z)), lower=True)
        self.local_ = (Z, L_inv, alpha)

    # -- prediction ------------------------------------------------------------------------
    def log_error(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) of log(true / estimate) at each row of ``X``."""
        if self.mean_ is None or self.cov_ is None:
            return np.zeros(len(X)), np.full(len(X), math.hypot(self.offset_sd, self.shape_sd))
        A, mean, k = self._mean(X)
        var = np.sum((A @ self.cov_) * A, axis=1) + self.noise_sd**2
        if self.local_ is not None and k is not None:
            v = self.local_[1] @ k.T
            var = var + np.maximum(self.local_sd**2 - (v**2).sum(axis=0), 0.0)
        return mean, np.sqrt(var)

    def _mean(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The design rows of ``X``, the mean of the log error there, and the local part's
        kernel against its observations (None without one): the mean alone is what
        :meth:`fits` needs, for every candidate of a study each time the model is refitted,
        without the variances' products."""
        assert self.mean_ is not None
        A = self._design(X)
        mean = A @ self.mean_
        k = None
        if self.local_ is not None:
            Z, _, alpha = self.local_
            k = self._kernel(A[:, self._columns], Z)
            mean = mean + k @ alpha
        return A, mean, k

    def log_ratio(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) of the log of each config's peak memory per GPU over HBM."""
        mean, sd = self.log_error(X)
        return np.log(self.estimate(X)) + mean, sd

    def ratio(self, X: np.ndarray) -> np.ndarray:
        """Corrected peak memory per GPU over HBM."""
        est = self.estimate(X)
        if self.mean_ is None:
            return est
        return est * np.exp(self._mean(X)[1])

    def p_fit(self, X: np.ndarray) -> np.ndarray:
        """Probability that each config's peak stays within ``limit`` of HBM."""
        from scipy.special import ndtr

        mean, sd = self.log_error(X)
        z = (math.log(self.limit) - np.log(self.estimate(X)) - mean) / sd
        return ndtr(z)

    def fits(self, X: np.ndarray) -> np.ndarray:
        """Whether the corrected estimate keeps each config within ``limit`` of HBM."""
        return self.ratio(X) <= self.limit

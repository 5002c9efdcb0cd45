"""A Gaussian process over the proxy's features: the smooth half of the proxy model.

Boosted trees cut the feature space into boxes; with the few dozen trials of a young study
the boxes are coarse, and configurations that fall in one box tie. A Gaussian process with
one length scale per feature (automatic relevance determination, Matern 5/2 plus a noise
term) interpolates between measured configurations instead, and learns from the data which
features matter. On the benchmark studies, after 64 trials, it ranks held-out trials better
than the trees (see the README); the proxy blends the two.

A GP costs cubic time in its rows, so the proxy fits it on a study's newest trials only
(``ProxyModel.gp_rows``), and the kernel's hyperparameters get at most ``max_iter`` L-BFGS
iterations (25: on the benchmark studies the cross-validated ranking was the same as with
50, at half the fit time). It is saved as plain JSON: the kernel's fitted hyperparameters
and its standardised training rows, from which :meth:`KernelModel.load` rebuilds the same
predictor without re-optimising.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import minimize
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import (
    ConstantKernel,
    Kernel,
    Matern,
    WhiteKernel,
)


class _Linear(Kernel):
    """``1 + x_d . y_d`` over the columns ``dims`` of the standardised rows: scaled by a
    constant kernel, Bayesian linear regression on those columns."""

    def __init__(self, dims: tuple[int, ...] = ()) -> None:
        self.dims = dims

    def __call__(self, X: np.ndarray, Y: np.ndarray | None = None, eval_gradient: bool = False):
        cols = list(self.dims)
        A = np.asarray(X)[:, cols]
        B = A if Y is None else np.asarray(Y)[:, cols]
        K = A @ B.T + 1.0
        if eval_gradient:
            return K, np.empty((len(A), len(A), 0))
        return K

    def diag(self, X: np.ndarray) -> np.ndarray:
        return (np.asarray(X)[:, list(self.dims)] ** 2).sum(axis=1) + 1.0

    def is_stationary(self) -> bool:
        return False


def _kernel(dims: int, linear: tuple[int, ...] = ()) -> Kernel:
    kernel = ConstantKernel(0.1, (1e-4, 1e2)) * Matern(
        length_scale=np.full(dims, 3.0), length_scale_bounds=(0.1, 100.0), nu=2.5
    ) + WhiteKernel(1e-3, (1e-6, 1e-1))
    if linear:
        # An additive trend in the knobs, its weights' prior scale fitted with the rest:
        # what a knob did in the layouts measured with it carries over to the others, where
        # the Matern part alone reverts to the mean.
        kernel = kernel + ConstantKernel(0.01, (1e-5, 1e1)) * _Linear(linear)
    return kernel


def _optimizer(max_iter: int) -> Any:
    """L-BFGS-B on the log marginal likelihood, stopped after ``max_iter`` iterations: the
    ranking the proxy is judged by settles before the length scales do."""

    def run(obj_func: Any, initial_theta: np.ndarray, bounds: np.ndarray) -> tuple[Any, Any]:
        res = minimize(
            obj_func,
            initial_theta,
            method="L-BFGS-B",
            jac=True,
            bounds=bounds,
            options={"maxiter": max_iter},
        )
        return res.x, res.fun

    return run


def _informative(X: np.ndarray) -> np.ndarray:
    """Columns that vary, less those that move in lockstep with an earlier one (within one
    study, bytes and their share of HBM, say): a copy adds a length scale to fit and no
    information."""
    varying = np.flatnonzero(np.ptp(X, axis=0) > 0)
    if len(varying) < 2:
        return varying
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.abs(np.corrcoef(X[:, varying], rowvar=False))
    keep: list[int] = []
    for j in range(len(varying)):
        if not any(corr[j, i] > 0.999 for i in keep):
            keep.append(j)
    return varying[keep]


def _find_matern(kernel: Kernel) -> Matern | None:
    if isinstance(kernel, Matern):
        return kernel
    for part in ("k1", "k2"):
        sub = getattr(kernel, part, None)
        if sub is not None:
            found = _find_matern(sub)
            if found is not None:
                return found
    return None


class KernelModel:
    """GP regression of a target (the proxy's log-throughput residual) on feature rows.

    Columns that do not vary over the training rows, or copy another, are dropped; the rest
    are standardised.
    """

    def __init__(
        self, seed: int = 0, max_iter: int = 25, linear: Sequence[int] | None = None
    ) -> None:
        self.seed = seed
        self.max_iter = max_iter
        self.linear = None if linear is None else [int(c) for c in linear]

    def fit(self, X: np.ndarray, target: np.ndarray) -> KernelModel:
        X = np.asarray(X, dtype=float)
        target = np.asarray(target, dtype=float)
        self.keep_ = _informative(X)
        Z = X[:, self.keep_]
        self.mu_ = Z.mean(axis=0)
        self.sd_ = Z.std(axis=0)
        self.t_mean_ = float(target.mean())
        gp = GaussianProcessRegressor(
            _kernel(max(len(self.keep_), 1), self._linear_dims()),
            optimizer=_optimizer(self.max_iter),
            random_state=self.seed,
        )
        with warnings.catch_warnings():  # a length scale at its bound is expected, not wrong
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.gp_ = gp.fit(self._z(X), target - self.t_mean_)
        return self

    def _linear_dims(self) -> tuple[int, ...]:
        """Positions among the kept columns of those the linear part reads."""
        if not self.linear:
            return ()
        wanted = set(self.linear)
        return tuple(i for i, c in enumerate(self.keep_.tolist()) if c in wanted)

    def _z(self, X: np.ndarray) -> np.ndarray:
        Z = (np.asarray(X, dtype=float)[:, self.keep_] - self.mu_) / self.sd_
        return Z if Z.shape[1] else np.zeros((len(Z), 1))

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the target at each row."""
        mean, std = self.gp_.predict(self._z(X), return_std=True)
        return mean + self.t_mean_, std

    def familiarity(self, X: np.ndarray) -> np.ndarray:
        """Per row, the largest correlation the fitted Matern kernel (its learned length
        scales) gives it with any training row: 1 for a row the GP has measured, near 0 for
        one unlike every measured row in the features that matter."""
        matern = _find_matern(self.gp_.kernel_)
        if matern is None or not len(X):
            return np.zeros(len(X))
        k = matern(self._z(X), self.gp_.X_train_)
        return k.max(axis=1) if k.shape[1] else np.zeros(len(X))

    def save(self) -> dict[str, Any]:
        return {
            "keep": self.keep_.tolist(),
            "mu": self.mu_.tolist(),
            "sd": self.sd_.tolist(),
            "t_mean": self.t_mean_,
            "linear": self.linear,
            "theta": self.gp_.kernel_.theta.tolist(),
            "Z": self.gp_.X_train_.tolist(),
            "y": self.gp_.y_train_.tolist(),
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> KernelModel:
        model = cls(linear=data.get("linear"))
        model.keep_ = np.asarray(data["keep"], dtype=np.int64)
        model.mu_ = np.asarray(data["mu"], dtype=float)
        model.sd_ = np.asarray(data["sd"], dtype=float)
        model.t_mean_ = float(data["t_mean"])
        Z = np.asarray(data["Z"], dtype=float)
        kernel = _kernel(max(len(model.keep_), 1), model._linear_dims()).clone_with_theta(
            np.asarray(data["theta"])
        )
        model.gp_ = GaussianProcessRegressor(kernel, optimizer=None).fit(
            Z, np.asarray(data["y"], dtype=float)
        )
        return model

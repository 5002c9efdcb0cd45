"""The memory estimate and its per-study correction from what jobs report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cubic.objectives import reported_peak_bytes
from cubic.proxy.features import featurize
from cubic.proxy.memory import MemoryModel, estimate_ratio, is_oom
from cubic.sim import simulate
from cubic.store.objects import Trial, TrialState
from cubic.study import parse_spec

OOM_ERROR = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _study(preset: str = "llama3_70b", gpu: str = "h100_sxm", n: int = 64):
    spec = {
        "name": "m",
        "workload": {"preset": preset, "cluster": {"gpu": gpu, "num_gpus": n}},
        "space": "search_spaces/llm_pretrain.yaml",
        "allow_unfit": True,
    }
    return parse_spec(spec).resolve()


def _near_the_line(study, n: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    """``n`` valid configs whose estimated peak is 0.7-1.3 of HBM, with their features."""
    arrays = study.space.sample_arrays(np.random.default_rng(seed), 20_000, study.context)
    X = featurize(study.workload, arrays)
    est = estimate_ratio("llm", X)
    rows = np.flatnonzero((est > 0.7) & (est < 1.3))[:n]
    configs = study.space.from_arrays({k: v[rows] for k, v in arrays.items()})
    return configs, X[rows]


def _complete(i: int, params: dict, peak_gb: float) -> Trial:
    return Trial.detached(i + 1, params, TrialState.COMPLETE, {"peak_memory_gb": peak_gb})


def test_reported_peak_reads_either_unit_and_ignores_junk() -> None:
    assert reported_peak_bytes({"peak_memory_gib": 2.0}) == 2 * 2**30
    assert reported_peak_bytes({"peak_memory_gb": 2.0}) == 2e9
    for junk in ({}, None, {"peak_memory_gb": True}, {"peak_memory_gb": float("nan")},
                 {"peak_memory_gb": -1.0}, {"peak_memory_gb": "80"}):  # fmt: skip
        assert reported_peak_bytes(junk) is None
    oom = Trial.detached(1, {}, TrialState.INFEASIBLE, error=OOM_ERROR)
    invalid = Trial.detached(2, {}, TrialState.INFEASIBLE, error="invalid: no FP8 tensor cores")
    assert is_oom(oom) and not is_oom(invalid)


def test_without_reports_the_model_is_the_estimate() -> None:
    study = _study()
    _, X = _near_the_line(study, 200)
    model = MemoryModel(study.workload, limit=0.95).fit(np.zeros((0, X.shape[1])), [])
    est = estimate_ratio("llm", X)
    assert np.allclose(model.ratio(X), est)
    assert np.array_equal(model.fits(X), est <= 0.95)
    p = model.p_fit(X)
    assert np.all((p > 0.5) == (est < 0.95))


@pytest.mark.parametrize("error", [1.10, 0.90])
def test_a_systematic_error_is_learned_from_a_handful_of_reports(error: float) -> None:
    """Jobs report 10 % more (or less) than the estimate: six reports move the line for
    every config, so the error neither wastes trials nor excludes the configs that fit."""
    study = _study()
    configs, X = _near_the_line(study, 400)
    hbm_gb = study.workload.gpu.hbm_bytes / 1e9
    est = estimate_ratio("llm", X)
    trials = [_complete(i, configs[i], est[i] * error * hbm_gb) for i in range(6)]
    model = MemoryModel(study.workload, limit=0.95).fit(X[:6], trials, reference=X)
    held = slice(6, None)
    assert np.allclose(model.ratio(X[held]) / est[held], error, rtol=0.02)
    truth = est[held] * error <= 0.95
    assert np.mean(model.fits(X[held]) == truth) >= 0.97
    assert np.mean((est[held] <= 0.95) == truth) < 0.9  # the plain estimate was wrong


def test_an_oom_bounds_the_estimate_from_below_across_its_region() -> None:
    study = _study()
    configs, X = _near_the_line(study, 400)
    est = estimate_ratio("llm", X)
    fits = np.flatnonzero(est < 0.9)
    victim = int(fits[0])
    trial = Trial.detached(1, configs[victim], TrialState.INFEASIBLE, error=OOM_ERROR)
    model = MemoryModel(study.workload, limit=0.95).fit(X[[victim]], [trial], reference=X)
    assert model.n_oom_ == 1
    assert not model.fits(X[[victim]])[0]  # the config that ran out of memory
    # ...and the correction is not confined to that one config.
    assert np.mean(model.ratio(X) / est) > 1.0 / est[victim] * 0.9


def test_reports_from_the_simulated_cluster_cut_the_configs_that_do_not_fit() -> None:
    """Against the simulator's memory model (a different calculation from the estimate),
    16 reports make fewer mistakes on held-out configs than the estimate alone."""
    study = _study("gpt3_175b", "a100_40gb", 256)
    configs, X = _near_the_line(study, 1500, seed=1)
    true = simulate(study.workload, configs).peak_memory / study.workload.gpu.hbm_bytes
    limit = 0.95
    rng = np.random.default_rng(0)
    seen = rng.choice(len(configs), 16, replace=False)
    trials = []
    for i in seen:
        if true[i] > 1.0:
            trials.append(
                Trial.detached(len(trials) + 1, configs[i], "infeasible", error=OOM_ERROR)
            )
        else:
            hbm_gb = study.workload.gpu.hbm_bytes / 1e9
            trials.append(_complete(len(trials), configs[i], float(true[i]) * hbm_gb))
    model = MemoryModel(study.workload, limit=limit).fit(X[seen], trials, reference=X)
    rest = np.setdiff1d(np.arange(len(configs)), seen)
    truth = true[rest] <= limit
    plain = np.mean((estimate_ratio("llm", X[rest]) <= limit) != truth)
    corrected = np.mean(model.fits(X[rest]) != truth)
    assert corrected < plain
    assert math.isfinite(corrected)


def test_a_measured_config_teaches_its_close_neighbours_exactly() -> None:
    """The linear correction averages over the study; a config one flag away from a measured
    one (an overlap flag, which moves no memory) gets that measurement, not the average."""
    study = _study()
    configs, X = _near_the_line(study, 400)
    hbm_gb = study.workload.gpu.hbm_bytes / 1e9
    est = estimate_ratio("llm", X)
    rng = np.random.default_rng(3)
    # Most configs are 5 % under the estimate; one is 3 % over it.
    error = np.full(len(X), 0.95)
    odd = int(np.flatnonzero((est > 0.9) & (est < 1.0))[0])
    error[odd] = 1.03
    seen = [odd, *rng.choice(np.setdiff1d(np.arange(len(X)), [odd]), 24, replace=False)]
    trials = [_complete(i, configs[j], est[j] * error[j] * hbm_gb) for i, j in enumerate(seen)]
    model = MemoryModel(study.workload, limit=0.95).fit(X[seen], trials, reference=X)
    flag = "overlap_grad_reduce" if "overlap_grad_reduce" in configs[odd] else None
    assert flag is not None
    twin = dict(configs[odd], **{flag: not configs[odd][flag]})
    Xt = featurize(study.workload, [twin])
    assert estimate_ratio("llm", Xt)[0] == pytest.approx(est[odd])
    assert model.ratio(Xt)[0] == pytest.approx(est[odd] * 1.03, rel=0.01)
    assert model.ratio(X[[odd]])[0] == pytest.approx(est[odd] * 1.03, rel=0.005)
    # Far from it the study's average holds.
    far = np.setdiff1d(np.arange(len(X)), seen)
    assert np.median(model.ratio(X[far]) / est[far]) == pytest.approx(0.95, abs=0.01)
    # The neighbour's outcome is what the scout will tell: strongly correlated.
    assert model.correlation(Xt, X[[odd]])[0, 0] > 0.5


def test_a_fixed_overhead_is_fitted_so_that_lean_configs_are_ranked_right() -> None:
    """Every job holds 3 GB the arithmetic leaves out: fitted from reports of configs near
    the limit, the overhead carries to the leanest configs, where a correction proportional
    to the estimate misses it by a fifth; without ``overhead`` the model stays as it was."""
    study = _study("llama3_8b", n=16)
    arrays = study.space.sample_arrays(np.random.default_rng(1), 20_000, study.context)
    X = featurize(study.workload, arrays)
    hbm_gb = study.workload.gpu.hbm_bytes / 1e9
    est = estimate_ratio("llm", X)
    heavy = np.flatnonzero((est > 0.4) & (est < 0.9))[:12]
    lean = np.flatnonzero(est < 0.2)[:200]
    assert len(heavy) == 12 and len(lean) >= 50
    configs = study.space.from_arrays({k: v[heavy] for k, v in arrays.items()})
    trials = [
        _complete(i, c, est[r] * hbm_gb + 3.0)
        for i, (c, r) in enumerate(zip(configs, heavy, strict=True))
    ]
    plain = MemoryModel(study.workload).fit(X[heavy], trials, reference=X)
    fitted = MemoryModel(study.workload, overhead=True).fit(X[heavy], trials, reference=X)
    assert plain.overhead_ == 0.0
    assert fitted.overhead_ * hbm_gb == pytest.approx(3.0, abs=0.3)
    truth = est[lean] * hbm_gb + 3.0
    err_plain = np.abs(np.log(plain.ratio(X[lean]) * hbm_gb / truth))
    err_fitted = np.abs(np.log(fitted.ratio(X[lean]) * hbm_gb / truth))
    assert np.median(err_fitted) < 0.03 < np.median(err_plain)
    mean, _ = fitted.log_ratio(X[lean])
    assert np.allclose(np.exp(mean), fitted.ratio(X[lean]))


def test_whether_configs_fit_is_read_from_the_mean_alone_as_the_full_prediction_gives() -> None:
    """``ratio`` (what ``fits`` reads for every candidate) computes the correction's mean
    without the variances: the same values as :meth:`MemoryModel.log_error`'s mean."""
    study = _study()
    configs, X = _near_the_line(study, 300)
    hbm_gb = study.workload.gpu.hbm_bytes / 1e9
    est = estimate_ratio("llm", X)
    error = np.random.default_rng(5).uniform(0.9, 1.1, len(X))
    trials = [_complete(i, configs[i], est[i] * error[i] * hbm_gb) for i in range(40)]
    model = MemoryModel(study.workload, limit=0.95).fit(X[:40], trials, reference=X)
    assert model.local_ is not None  # the local part is on
    mean, _ = model.log_error(X)
    assert np.array_equal(model.ratio(X), model.estimate(X) * np.exp(mean))
    assert np.array_equal(model.fits(X), model.estimate(X) * np.exp(mean) <= 0.95)


def test_the_local_kernel_computed_in_place_equals_the_plain_expression() -> None:
    study = _study()
    model = MemoryModel(study.workload, limit=0.95)
    rng = np.random.default_rng(0)
    Z1, Z2 = rng.normal(size=(3000, 7)), rng.normal(size=(200, 7))
    Z2[0] = Z1[0]  # a distance of zero, which rounding may push below it
    d2 = (Z1**2).sum(axis=1)[:, None] + (Z2**2).sum(axis=1)[None, :] - 2.0 * Z1 @ Z2.T
    plain = model.local_sd**2 * np.exp(-0.5 * np.maximum(d2, 0.0) / model.length_scale**2)
    assert np.array_equal(model._kernel(Z1, Z2), plain)

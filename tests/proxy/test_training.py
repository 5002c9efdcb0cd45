"""From stored trials to stored, measured model versions, and keeping them current."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

import cubic.sim
import cubic.sim.dlrm
import cubic.sim.llm
from cubic.proxy.features import feature_names, featurize
from cubic.proxy.model import ProxyModel
from cubic.proxy.training import Retrainer, fit_and_store, load_latest, training_set
from cubic.store import Store, TrialState
from tests.proxy.simdata import measured, workload

SPEC = {"name": "s", "workload": {"preset": "llama3_70b"}, "space": "llm_pretrain.yaml"}


def _add(store: Store, study_id: int, n: int, seed: int, failed: int = 0) -> None:
    """Store ``n`` simulated trials of llama3_70b (and ``failed`` broken ones)."""
    configs, _, y, feasible = measured(workload("llama3_70b"), n, seed)
    records: list[Any] = [
        (c, "complete", {"throughput": float(t), "mfu": 0.4}) if ok else (c, "infeasible", None)
        for c, t, ok in zip(configs, y, feasible, strict=True)
    ]
    records += [(configs[0], "failed", None)] * failed
    store.add_finished_trials(study_id, records)


def _study(store: Store, name: str = "s") -> int:
    return store.create_study(name, {**SPEC, "name": name}, "llm").id


def test_training_set_from_trials(store: Store) -> None:
    sid = _study(store)
    _add(store, sid, 40, 0, failed=3)
    trials = store.list_trials(sid)
    wl = workload("llama3_70b")
    X, y, feasible, groups = training_set(trials, {sid: wl})
    assert X.shape == (40, len(feature_names("llm")))
    configs, _, y_sim, f_sim = measured(wl, 40, 0)
    np.testing.assert_array_equal(X, featurize(wl, configs))
    np.testing.assert_array_equal(feasible, f_sim)
    np.testing.assert_allclose(y[feasible], y_sim[f_sim])
    assert np.all(np.isnan(y[~feasible]))
    assert set(groups.tolist()) == {sid}
    # A function works as well as a mapping; unknown studies are left out.
    X2, *_ = training_set(trials, lambda i: wl if i == sid else None)
    np.testing.assert_array_equal(X2, X)
    assert len(training_set(trials, {})[0]) == 0
    with pytest.raises(ValueError, match="not 'dlrm'"):
        training_set(trials, {sid: wl}, kind="dlrm")


def test_trials_without_a_throughput_are_left_out(store: Store) -> None:
    sid = _study(store)
    cfg = {"tp": 8, "pp": 4}
    store.add_finished_trials(
        sid,
        [
            (cfg, "complete", {"mfu": 0.4}),
            (cfg, "complete", {"throughput": 0.0}),
            (cfg, "pruned", None),
            (cfg, "complete", {"throughput": 5e4}),
        ],
    )
    X, y, feasible, _ = training_set(store.list_trials(sid), {sid: workload("llama3_70b")})
    assert len(X) == 1 and y[0] == 5e4 and feasible[0]


def test_fit_and_store_round_trip(store: Store) -> None:
    wl = workload("llama3_70b")
    sid = _study(store)
    _add(store, sid, 120, 1)
    trials = store.list_trials(sid)
    version = fit_and_store(store, "llm", trials, {sid: wl})
    assert version.version == 1 and version.workload_kind == "llm"
    assert version.features == feature_names("llm")
    assert version.n_train == 120
    m = version.metrics
    assert m["objective"] in ("regression", "rank")
    assert set(m["kendall_tau_by_objective"]) == {"regression", "rank"}
    assert m["cv"]["kendall_tau"] is not None and m["cv"]["folds"] == 5
    assert m["holdout"]["n"] == 24
    json.dumps(m, allow_nan=False)
    model = load_latest(store, "llm")
    assert isinstance(model, ProxyModel) and model.objective == m["objective"]
    # The stored model is the one a direct fit gives: same data, same seed.
    X, y, feasible, groups = training_set(trials, {sid: wl})
    direct = ProxyModel(kind="llm", objective=m["objective"]).fit(X, y, feasible, groups)
    _, Xt, _, _ = measured(wl, 200, 9)
    np.testing.assert_array_equal(model.predict(Xt)[0], direct.predict(Xt)[0])
    np.testing.assert_array_equal(model.feasible(Xt), direct.feasible(Xt))


def test_fit_and_store_needs_complete_trials(store: Store) -> None:
    sid = _study(store)
    store.add_finished_trials(sid, [({"tp": 8}, "infeasible", None)] * 3)
    with pytest.raises(ValueError, match="two complete"):
        fit_and_store(store, "llm", store.list_trials(sid), {sid: workload("llama3_70b")})


def test_load_latest_ignores_missing_and_stale_models(store: Store) -> None:
    assert load_latest(store, "llm") is None
    store.save_proxy_model("llm", {"format": "old"}, ["x"], {}, n_train=1)
    assert load_latest(store, "llm") is None


def test_training_never_runs_the_simulator(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = _study(store)
    _add(store, sid, 60, 2)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the proxy called the simulator")

    for module, name in (
        (cubic.sim, "simulate"),
        (cubic.sim.llm, "simulate_llm"),
        (cubic.sim.dlrm, "simulate_dlrm"),
    ):
        monkeypatch.setattr(module, name, refuse)
    version = Retrainer(store, every=8).maybe_retrain("llm")
    assert version is not None
    model = load_latest(store, "llm")
    assert model is not None
    model.predict(featurize(workload("llama3_70b"), [{"tp": 8, "pp": 4}]))


def test_retrainer_refits_after_every_n_new_trials(store: Store) -> None:
    sid = _study(store)
    retrainer = Retrainer(store, every=8, objective="regression")
    assert retrainer.maybe_retrain("llm") is None  # nothing stored yet
    _add(store, sid, 30, 3)
    first = retrainer.maybe_retrain("llm")
    assert first is not None and first.n_train == 30  # workload read from the study spec
    assert retrainer.maybe_retrain("llm") is None
    _add(store, _study(store, "s2"), 7, 4)
    assert retrainer.maybe_retrain("llm") is None  # 7 < 8 new trials
    _add(store, sid, 1, 5)
    second = retrainer.maybe_retrain("llm")
    assert second is not None and second.version == 2 and second.n_train == 38
    assert second.metrics["n_studies"] == 2
    assert retrainer.maybe_retrain("dlrm") is None


def test_retrainer_refits_as_the_history_grows_by_a_share_and_reads_the_newest(
    store: Store,
) -> None:
    """Past ``every`` new trials a refit waits for the history to grow by ``growth`` of what
    the last fit saw, and a fit reads only the newest ``max_rows`` trials: what fitting a
    growing history costs stays bounded per trial."""
    sid = _study(store)
    retrainer = Retrainer(store, every=8, growth=0.5, max_rows=20, objective="regression")
    _add(store, sid, 30, 3)
    first = retrainer.maybe_retrain("llm")
    assert first is not None and first.n_train == 20  # the newest 20 of 30
    assert first.metrics["n_history"] == 30
    _add(store, sid, 14, 4)
    assert retrainer.maybe_retrain("llm") is None  # 14 < 0.5 * 30 new trials
    _add(store, sid, 1, 5)
    second = retrainer.maybe_retrain("llm")
    assert second is not None and second.n_train == 20 and second.metrics["n_history"] == 45
    assert retrainer.maybe_retrain("llm") is None
    with pytest.raises(ValueError, match="growth"):
        Retrainer(store, growth=-0.1)
    with pytest.raises(ValueError, match="max_rows"):
        Retrainer(store, max_rows=1)


def test_retrainer_takes_at_most_its_share_of_a_core(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``max_share``, a refit that is due waits until the last fit's time divided by
    the share has passed since it began, in this process and in any other on the store:
    trials finishing faster than fits run cannot keep a core busy fitting, nor a service's
    processes spend the share each in turn."""
    import cubic.proxy.training as training

    sid = _study(store)
    retrainer = Retrainer(store, every=8, objective="regression", max_share=0.01)
    other = Retrainer(store, every=8, objective="regression", max_share=0.01)
    unbounded = Retrainer(store, every=8, objective="regression")
    _add(store, sid, 30, 3)
    t0, wall0 = time.monotonic(), training._utcnow()
    first = retrainer.maybe_retrain("llm")
    took = time.monotonic() - t0
    assert first is not None and first.metrics["seconds"] > 0
    _add(store, sid, 10, 4)
    assert unbounded.due("llm", 40)  # due by count ...
    assert not retrainer.due("llm", 40) and not other.due("llm", 40)
    assert retrainer.maybe_retrain("llm") is None  # ... but 100 fits' time has not passed
    assert other.maybe_retrain("llm") is None  # ... in the other process either

    class Later:
        """The clock of the training module only, 100 fits' time later."""

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def monotonic(self) -> float:
            return t0 + 100 * took + 1.0

    monkeypatch.setattr(training, "time", Later())
    monkeypatch.setattr(training, "_utcnow", lambda: wall0 + timedelta(seconds=100 * took + 1))
    second = other.maybe_retrain("llm")
    assert second is not None and second.version == 2
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="max_share"):
            Retrainer(store, max_share=share)


def test_of_two_retrainers_one_fits_a_due_version(store: Store) -> None:
    """Each API process has a retrainer: while one fits a kind, another skips it, and then
    finds the version it would have fitted already stored."""
    _add(store, _study(store), 30, 3)
    first, second = (Retrainer(store, every=8, objective="regression") for _ in range(2))
    with store.try_proxy_fit_lock("llm") as held:  # as the first process does while fitting
        assert held
        assert second.maybe_retrain("llm") is None
    fitted = first.maybe_retrain("llm")
    assert fitted is not None and fitted.n_train == 30
    assert second.maybe_retrain("llm") is None
    assert [v.version for v in store.list_proxy_models("llm")] == [1]


def test_retrainer_runs_in_a_thread(store: Store) -> None:
    sid = _study(store)
    _add(store, sid, 30, 6)
    stop = threading.Event()
    retrainer = Retrainer(store, every=8, objective="regression")
    thread = threading.Thread(
        target=retrainer.run, args=(stop,), kwargs={"interval_s": 0.05}, daemon=True
    )
    thread.start()
    try:
        for _ in range(200):
            if store.latest_proxy_model("llm") is not None:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    latest = store.latest_proxy_model("llm")
    assert latest is not None and latest.n_train == 30
    assert [t.state for t in store.list_trials(sid)].count(TrialState.COMPLETE) >= 2


def test_a_pruned_trial_with_its_partial_throughput_is_training_data() -> None:
    from cubic.proxy.training import usable
    from cubic.store.objects import Trial

    wl = workload("llama3_70b")
    configs, _, _, ok = measured(wl, 12, 3)
    cfg = [c for c, f in zip(configs, ok, strict=True) if f]
    trials = [
        Trial.detached(1, cfg[0], TrialState.COMPLETE, {"throughput": 900.0}),
        Trial.detached(2, cfg[1], TrialState.PRUNED, {"throughput": 150.0, "gpu_hours": 0.2}),
        Trial.detached(3, cfg[2], TrialState.PRUNED, {"gpu_hours": 0.1}),  # nothing measured
    ]
    assert [usable(t) for t in trials] == [True, True, False]
    _, y, feasible, _ = training_set(trials, {1: wl})
    assert y.tolist() == [900.0, 150.0] and feasible.tolist() == [True, True]

"""``cubic bench dashboard``: how long the study page of a large finished study takes to draw.

A SQLite store gets one finished study of ``trials`` simulated trials, written straight
through the store in a few transactions (random valid configurations measured on the
simulated cluster, with a proxy prediction per model-guided trial and the simulator's reason
for each infeasible one), and a proxy model version fitted on the first ``FIT_ROWS`` of them
(the service's retrainer is told not to refit while the page is timed). A real API
process serves it; headless Chromium (through Playwright) opens ``/ui/study.html?id=N``
``loads`` times in fresh browser contexts (cold: nothing cached) and ``loads`` times more
in one context (warm: plotly.js and its compiled code cached). The time of a load is
``performance.now()`` when the page marks every panel drawn (``body[data-rendered]``, set
after all its plots and tables), i.e. milliseconds since navigation start; of it, the part
after plotly.js has run (``body[data-plotly-ready]``): what showing the study costs once the
page has loaded (cold, most of the rest is compiling plotly.js's 4 MB). Beside it, the
CPU time of the page's renderer process (Chromium's ``ProcessTime`` metric): on a machine
that other work keeps busy the wall time stretches, the CPU time much less.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_STUDY = (
    Path(__file__).resolve().parents[2] / "search_spaces" / "bench" / "llama3_8b_h100x16.study.yaml"
)
CHROMIUM = os.environ.get("CUBIC_CHROMIUM", "/usr/bin/chromium")
#: Share of the trials proposed by the warm-up (no prediction), as the cubic strategy would.
WARMUP = 16
#: Spread (natural log) of the fake proxy predictions around the measured value.
PREDICTION_SD = 0.15
#: Trials lost to the infrastructure, as the simulated runner's noise model loses them.
FAILED_SHARE = 0.01
#: Rows the stored proxy model is fitted on: enough to rank, quick on a loaded machine.
FIT_ROWS = 2_000
#: Every wait of a page load is bounded by this (the machine may be busy).
PAGE_TIMEOUT_MS = 120_000


def _records(
    study: Any, n: int, seed: int
) -> tuple[list[tuple[dict[str, Any], str, dict[str, Any] | None]], list[Any], list[Any]]:
    """``n`` finished trials of ``study`` (records, predictions, errors), vectorised."""
    from cubic.sim import simulate

    rng = np.random.default_rng(seed)
    arrays = study.space.sample_arrays(rng, n, study.context)
    configs = study.space.from_arrays(arrays)
    res = simulate(study.workload, arrays)
    metric = study.spec.objectives[0].metric
    n_gpus = study.workload.cluster.num_gpus
    steps = 20
    jitter = rng.lognormal(0.0, 0.02, n)
    noise = rng.lognormal(0.0, PREDICTION_SD, n)
    lost = rng.random(n) < FAILED_SHARE
    records: list[tuple[dict[str, Any], str, dict[str, Any] | None]] = []
    predicted: list[Any] = []
    errors: list[Any] = []
    for i, cfg in enumerate(configs):
        feasible = bool(res.feasible[i])
        guess = None
        if feasible and i >= WARMUP:
            value = float(res.throughput[i]) * noise[i]
            guess = {"value": value, "std": PREDICTION_SD, "phase": "model"}
        predicted.append(guess)
        if lost[i]:
            records.append((cfg, "failed", None))
            errors.append("node lost (simulated)")
        elif not feasible:
            records.append((cfg, "infeasible", {"peak_memory_gb": float(res.peak_memory[i]) / 1e9}))
            errors.append(str(res.reason[i]) or "invalid configuration")
        else:
            step_s = float(res.step_time[i]) * jitter[i]
            tput = float(res.throughput[i]) / jitter[i]
            records.append(
                (
                    cfg,
                    "complete",
                    {
                        "throughput": tput,
                        metric: tput,
                        "step_time_s": step_s,
                        "peak_memory_gb": float(res.peak_memory[i]) / 1e9,
                        "error_score": float(res.error_score[i]),
                        "gpu_hours": step_s * steps * n_gpus / 3600.0,
                    },
                )
            )
            errors.append(None)
    return records, predicted, errors


def fill_store(
    db_url: str, trials: int = 10_000, study_file: Path | None = None, seed: int = 0
) -> int:
    """Create the schema at ``db_url`` and one completed study of ``trials`` simulated
    trials plus a stored proxy model version; returns the study's id."""
    from cubic.proxy.model import ProxyModel
    from cubic.proxy.training import training_set
    from cubic.store import Store
    from cubic.store.schema import upgrade
    from cubic.study import load_spec
    from cubic.tuner import Tuner

    spec, base = load_spec(study_file or DEFAULT_STUDY)
    spec = spec.model_copy(
        update={
            "baseline": None,
            "budget": spec.budget.model_copy(update={"max_trials": trials}),
        }
    )
    upgrade(db_url)
    store = Store.create(db_url)
    try:
        study = Tuner(store).create_study(spec, base)
        resolved = spec.resolve(base)
        records, predicted, errors = _records(resolved, trials, seed)
        chunk = 2_000
        for start in range(0, trials, chunk):
            stop = start + chunk
            store.add_finished_trials(
                study.id,
                records[start:stop],
                source="strategy",
                predicted=predicted[start:stop],
                errors=errors[start:stop],
            )
        store.set_study_state(study.id, "completed")
        finished = store.list_trials(study.id, states=["complete", "infeasible"], limit=FIT_ROWS)
        kind = resolved.workload.kind
        X, y, feasible, _ = training_set(finished, lambda _: resolved.workload, kind)
        model = ProxyModel(kind=kind, seed=seed).fit(X, y, feasible)
        store.save_proxy_model(
            kind, model.save(), model.feature_names_, {"objective": "regression"}, len(y)
        )
        return study.id
    finally:
        store.close()


def _process_s(cdp: Any) -> float:
    metrics = cdp.send("Performance.getMetrics")["metrics"]
    return float(next((m["value"] for m in metrics if m["name"] == "ProcessTime"), math.nan))


def _load(page: Any, cdp: Any, url: str) -> tuple[float, float, float]:
    """One load: milliseconds to every panel drawn, of them those after plotly.js has run
    (fetched and compiled: what the study costs to show once the page is loaded), and the CPU
    milliseconds the page's renderer process spent meanwhile (what the load costs whatever
    else the machine runs)."""
    before = _process_s(cdp)
    page.goto(url, timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(
        "document.body.dataset.rendered || !document.getElementById('error').hidden",
        timeout=PAGE_TIMEOUT_MS,
    )
    if not page.locator("#error").is_hidden():
        raise RuntimeError(f"the page failed: {page.locator('#error').text_content()}")
    rendered = float(page.locator("body").get_attribute("data-rendered") or "nan")
    plotly = float(page.locator("body").get_attribute("data-plotly-ready") or "nan")
    return rendered, rendered - plotly, 1000 * (_process_s(cdp) - before)


def _page(context: Any) -> tuple[Any, Any]:
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    return page, cdp


def _keep(out: dict[str, list[float]], kind: str, load: tuple[float, float, float]) -> None:
    for part, value in zip(("", "_after_plotly", "_cpu"), load, strict=True):
        out[f"{kind}{part}"].append(value)


def page_load_ms(
    base_url: str, study_id: int, chromium: str = CHROMIUM, loads: int = 5
) -> dict[str, list[float]]:
    """Milliseconds from navigation start to every panel drawn, of them after plotly.js has
    run, and the renderer's CPU milliseconds: ``loads`` cold loads (each in a fresh browser
    context: nothing cached, plotly.js fetched and compiled again) and ``loads`` warm ones
    (reloads in one context, whose cache holds plotly.js and its compiled code, as for
    someone who has opened the dashboard before)."""
    from playwright.sync_api import sync_playwright

    url = f"{base_url}/ui/study.html?id={study_id}"
    out: dict[str, list[float]] = {
        f"{kind}{part}": [] for kind in ("cold", "warm") for part in ("", "_after_plotly", "_cpu")
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True)
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                try:
                    _keep(out, "cold", _load(*_page(context), url))
                finally:
                    context.close()
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            try:
                page, cdp = _page(context)
                _load(page, cdp, url)  # fills the cache
                for _ in range(loads):
                    _keep(out, "warm", _load(page, cdp, url))
            finally:
                context.close()
        finally:
            browser.close()
    return out


def bench_dashboard(
    trials: int = 10_000,
    loads: int = 5,
    study_file: Path | None = None,
    chromium: str = CHROMIUM,
    workdir: Path | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fill a store, serve it, time the study page; returns the figures."""
    import tempfile

    import httpx

    from cubic.bench.service import api_server

    if shutil.which(chromium) is None and not Path(chromium).is_file():
        raise FileNotFoundError(f"{chromium} is missing (apt-get install chromium)")
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        db = f"sqlite:///{Path(tmp) / 'dashboard.db'}"
        t0 = time.perf_counter()
        sid = fill_store(db, trials, study_file)
        fill_s = time.perf_counter() - t0
        say(f"stored a finished study of {trials:,} trials and a proxy model in {fill_s:.1f} s")
        with api_server(db, 1, {"CUBIC_RETRAIN_EVERY": "100000"}) as base:
            sizes = {
                path: len(httpx.get(f"{base}/v1/studies/{sid}/{path}", timeout=120).content)
                for path in ("history", "importance")
            }
            times = page_load_ms(base, sid, chromium, loads)
    return {
        "trials": trials,
        "loads": loads,
        **{f"{k}_ms": v for k, v in times.items()},
        **{f"{k}_median_ms": statistics.median(v) for k, v in times.items()},
        "fill_s": fill_s,
        "bytes": sizes,
        "load_avg_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }

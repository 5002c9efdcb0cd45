"""The dashboard in a real browser: a real service over a finished simulated study, each
page loaded by Debian's Chromium (through Playwright), its figures checked against the API.

Screenshots of every page land in the test's ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.requirements import need

# one worker builds the study and starts the browser for the whole module
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dashboard")]

CHROMIUM = Path(os.environ.get("CUBIC_CHROMIUM", "/usr/bin/chromium"))
WAIT_MS = 120_000
"""How long a page may take to show its data (generous: the machine may be busy)."""
STUDY_TRIALS = 200


def _need_browser() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        need("browser", False, "the playwright package is not installed (pip install playwright)")
    need(
        "browser",
        CHROMIUM.is_file() or shutil.which(str(CHROMIUM)) is not None,
        f"{CHROMIUM} is missing (apt-get install chromium)",
    )


def _run(tuner: Any, path: Path, trials: int, strategy: str | None = None) -> int:
    """Run a study to its end in this process against the simulated cluster."""
    from cubic.demo import demo_spec, run_worker

    spec, base = demo_spec(path, trials, 0)
    if strategy is not None:
        spec = spec.model_copy(
            update={"strategy": spec.strategy.model_copy(update={"name": strategy})}
        )
    study = tuner.create_study(spec, base)
    stop = threading.Event()
    workers = [
        threading.Thread(target=run_worker, args=(tuner, study.id, f"sim-{i}", 0, stop))
        for i in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(600)
    assert not any(w.is_alive() for w in workers), "the simulated study did not finish"
    return study.id


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, int]]:
    """A SQLite file holding a finished proxy-guided study of 200 trials, a finished random
    one (it meets out-of-memory configurations) and a stored proxy model version."""
    _need_browser()
    from cubic.proxy.training import Retrainer
    from cubic.shipped import SHIPPED_DIR
    from cubic.store import Store
    from cubic.store.schema import upgrade
    from cubic.tuner import Tuner

    db = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'cubic.db'}"
    upgrade(db)
    store = Store.create(db)
    try:
        tuner = Tuner(store)
        bench = SHIPPED_DIR / "bench" / "llama3_8b_h100x16.study.yaml"
        ids = {
            "cubic": _run(tuner, bench, STUDY_TRIALS),
            "random": _run(tuner, bench, 60, strategy="random"),
        }
        assert Retrainer(store, every=1).maybe_retrain("llm") is not None
    finally:
        store.close()
    return db, ids


@pytest.fixture(scope="module")
def server(studies: tuple[str, dict[str, int]]) -> Iterator[str]:
    from cubic.bench.service import api_server

    with api_server(studies[0], 1) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("requestfailed", lambda r: errors.append(f"{r.url}: {r.failure}"))
    # nothing may come from outside this service
    pg.route(
        "**/*",
        lambda route: (
            route.continue_() if route.request.url.startswith("http://127.0.0.1") else route.abort()
        ),
    )
    yield pg
    context.close()
    assert not errors, errors


def get(base: str, path: str, **params: Any) -> Any:
    r = httpx.get(f"{base}/v1/{path}", params=params, timeout=60)
    r.raise_for_status()
    return r.json()


def loaded(page: Any) -> None:
    page.wait_for_function("Number(document.body.dataset.loaded || 0) >= 1", timeout=WAIT_MS)
    assert page.locator("#error").is_hidden(), page.locator("#error").text_content()


def done(counts: dict[str, int]) -> int:
    return sum(counts[s] for s in ("complete", "infeasible", "failed", "pruned"))


def number(text: str) -> float:
    return float(text.replace(",", "").rstrip("×"))


def figure(page: Any, plot: str) -> list[dict[str, Any]]:
    """The traces plotly drew in ``#plot`` (x, y, type of each)."""
    return page.evaluate(
        f"""() => document.getElementById({plot!r}).data.map(
            (t) => ({{ type: t.type, x: Array.from(t.x || []), y: Array.from(t.y || []) }}))"""
    )


def rows(history: dict[str, Any]) -> list[dict[str, Any]]:
    """The history's trials (one list per field) as one dict per trial."""
    cols = history["trials"]
    return [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


def figures_match_the_api(page: Any, history: dict[str, Any], best: dict[str, Any]) -> None:
    """Every plot of the study page drew what the history says."""
    (by_trial,) = figure(page, "best-by-trial")
    trials = rows(history)
    valued = [t for t in trials if t["value"] is not None]
    assert by_trial["y"][-1] == best["value"] == max(t["value"] for t in valued)
    assert by_trial["x"][-1] == trials[-1]["number"]
    assert by_trial["y"] == sorted(by_trial["y"])  # best so far never gets worse
    (by_hours,) = figure(page, "best-by-hours")
    hours = sum(t["gpu_hours"] or 0 for t in trials)
    assert by_hours["x"][-1] == pytest.approx(hours) and by_hours["y"] == by_trial["y"]
    (scatter,) = figure(page, "predicted-scatter")
    assert len(scatter["x"]) == history["n_predicted"]
    pairs = [(t["predicted"], t["value"]) for t in valued if t["predicted"] is not None]
    assert list(zip(scatter["x"], scatter["y"], strict=True)) == pairs
    assert scatter["type"] == ("histogram2d" if len(pairs) > 1000 else "scatter")
    lines = page.evaluate(
        "() => document.getElementById('parallel').data.filter((t) => t.mode === 'lines')"
    )
    assert len(lines) == len(history["top"])  # one line per top configuration
    if history["infeasible_by_value"]:
        (bars,) = figure(page, "infeasible-knobs")
        shown = history["infeasible_by_value"][:25]
        assert bars["x"] == [c["infeasible"] for c in reversed(shown)]
        assert bars["y"][-1].startswith(f"{shown[0]['knob']}=")
    errors = page.locator("#errors tbody tr td:first-child").all_text_contents()
    assert [int(n) for n in errors] == [g["trials"] for g in history["errors"]]


def importance_matches_the_api(page: Any, importance: dict[str, Any]) -> None:
    (bars,) = figure(page, "importance")
    knobs = importance["knobs"]
    assert bars["y"] == [k["knob"] for k in reversed(knobs)]
    assert bars["x"] == pytest.approx([k["share"] for k in reversed(knobs)])
    assert sum(bars["x"]) == pytest.approx(1.0)
    box = page.locator("#importance")
    assert box.get_attribute("data-version") == str(importance["model_version"])
    assert f"v{importance['model_version']}" in page.locator("#importance-note").text_content()


def test_studies_page(server: str, page: Any, tmp_path: Path) -> None:
    listing = get(server, "studies")
    page.goto(f"{server}/ui/")
    loaded(page)
    rows = page.locator("#studies tbody tr")
    assert rows.count() == listing["total"] == 2
    for s in listing["items"]:
        row = page.locator(f'#studies tbody tr[data-study-id="{s["id"]}"]')
        p = get(server, f"studies/{s['id']}")["progress"]
        assert row.locator(".progress").text_content() == f"{done(p['counts'])} / {p['max_trials']}"
        assert number(row.locator(".best").text_content()) == pytest.approx(
            p["best_value"], rel=1e-3
        )
        best = get(server, f"studies/{s['id']}/best")
        assert number(row.locator(".speedup").text_content()) == pytest.approx(
            best["speedup"], abs=1e-3
        )
    page.screenshot(path=tmp_path / "studies.png", full_page=True)


def test_study_page(
    server: str, studies: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    sid = studies[1]["cubic"]
    study = get(server, f"studies/{sid}")
    best = get(server, f"studies/{sid}/best")
    history = get(server, f"studies/{sid}/history")
    counts = study["progress"]["counts"]
    total = sum(counts.values())
    assert study["state"] == "completed" and done(counts) >= STUDY_TRIALS

    page.goto(f"{server}/ui/study.html?id={sid}")
    loaded(page)
    summary = page.locator("#summary")
    assert int(summary.get_attribute("data-done")) == done(counts)
    assert int(summary.get_attribute("data-max")) == study["progress"]["max_trials"]
    assert float(page.locator("#best-line").get_attribute("data-value")) == best["value"]

    # the trials table: one page of 50 through the API, its total the API's
    assert page.locator("#trials tbody tr").count() == 50
    assert int(page.locator("#trials-range").get_attribute("data-total")) == total
    assert page.locator("#trials tbody tr").first.get_attribute("data-number") == "0"
    page.screenshot(path=tmp_path / "study.png", full_page=True)

    # predicted against measured: the API's tau, and every plot drawn by plotly
    kendall = page.locator("#kendall")
    assert int(kendall.get_attribute("data-n")) == history["n_predicted"] > 0
    assert float(kendall.get_attribute("data-tau")) == pytest.approx(history["kendall_tau"])
    for plot in ("best-by-trial", "best-by-hours", "predicted-scatter", "parallel"):
        assert page.locator(f"#{plot} .main-svg").count() > 0, plot
    figures_match_the_api(page, history, best)

    # knob importance: the chart is the API's, largest share at the top
    importance = get(server, f"studies/{sid}/importance")
    assert importance["knobs"] and importance["model_version"] is not None
    importance_matches_the_api(page, importance)
    page.locator("#importance").screenshot(path=tmp_path / "study-importance.png")

    # the best configuration, as YAML and JSON, is the API's
    params = best["trial"]["params"]
    assert yaml.safe_load(page.locator("#best-yaml").text_content()) == params
    assert json.loads(page.locator("#best-json").text_content()) == params

    # next page, then a state filter, then all trials in reverse number order
    page.click("#next")
    page.wait_for_selector('#trials tbody tr[data-number="50"]', timeout=WAIT_MS)
    page.select_option("#state-filter", "failed")
    page.wait_for_function(
        f"document.querySelector('#trials-range').dataset.total === '{counts['failed']}'",
        timeout=WAIT_MS,
    )
    assert page.locator("#trials tbody tr").count() == min(counts["failed"], 50)
    assert all(
        s == "failed"
        for s in page.locator("#trials tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.state)"
        )
    )
    page.select_option("#state-filter", "")
    page.click('#trials th[data-order="number"]')  # number ascending already: now descending
    last = max(t["number"] for t in rows(history))
    page.wait_for_selector(f'#trials tbody tr:first-child[data-number="{last}"]', timeout=WAIT_MS)
    page.screenshot(path=tmp_path / "study-sorted.png", full_page=True)


def test_infeasible_reasons(
    server: str, studies: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    sid = studies[1]["random"]
    infeasible = get(server, f"studies/{sid}")["progress"]["counts"]["infeasible"]
    assert infeasible > 0
    page.goto(f"{server}/ui/study.html?id={sid}")
    loaded(page)
    shown = page.locator("#errors tbody tr td:first-child").all_text_contents()
    assert sum(int(n) for n in shown) == infeasible
    assert len(shown) < infeasible  # messages differing only by numbers are grouped
    assert page.locator("#infeasible-knobs .main-svg").count() > 0
    page.screenshot(path=tmp_path / "infeasible.png", full_page=True)


def test_proxy_page(server: str, page: Any, tmp_path: Path) -> None:
    models = get(server, "proxy-models")["models"]
    assert models
    page.goto(f"{server}/ui/proxy.html")
    loaded(page)
    assert page.locator("#models tbody tr").count() == len(models)
    assert page.locator("#tau-plot .main-svg").count() > 0
    page.screenshot(path=tmp_path / "proxy.png", full_page=True)


def test_plotly_is_served_locally(server: str) -> None:
    r = httpx.get(f"{server}/ui/assets/plotly.min.js", timeout=60)
    assert r.status_code == 200 and len(r.content) > 1_000_000
    assert httpx.get(f"{server}/ui", timeout=60, follow_redirects=True).status_code == 200


def test_the_api_docs_render_offline(server: str, page: Any, tmp_path: Path) -> None:
    """Swagger UI at /docs shows every route, with nothing fetched from outside."""
    doc = httpx.get(f"{server}/openapi.json", timeout=60).json()
    routes = sum(len(methods) for methods in doc["paths"].values())
    page.goto(f"{server}/docs")
    page.wait_for_selector(".opblock", timeout=WAIT_MS)
    assert page.locator(".opblock").count() == routes
    page.screenshot(path=tmp_path / "docs.png", full_page=True)


def test_token_form_when_auth_is_on(
    studies: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    from cubic.bench.service import api_server
    from cubic.store import Store

    db = studies[0]
    with Store.create(db) as store:
        _, secret = store.create_token("dashboard", "reader")
    with api_server(db, 1, {"CUBIC_AUTH": "true"}) as base:
        page.goto(f"{base}/ui/")
        page.wait_for_selector("#auth:not([hidden])", timeout=WAIT_MS)
        page.screenshot(path=tmp_path / "token.png")
        page.fill("#token-input", secret)
        page.click("#token-form button")
        page.wait_for_function(
            "document.querySelectorAll('#studies tbody tr').length === 2", timeout=WAIT_MS
        )
        assert page.evaluate("sessionStorage.getItem('cubic-token')") == secret
        page.goto(f"{base}/ui/study.html?id={studies[1]['cubic']}")  # the same tab: kept
        loaded(page)
        assert page.locator("#auth").is_hidden()
        assert page.locator("#trials tbody tr").count() == 50


PARETO_OBJECTIVES = [
    {"metric": "tokens_per_s", "direction": "maximize"},
    {"metric": "peak_memory_gb", "direction": "minimize"},
]


@pytest.fixture(scope="module")
def pareto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, int]]]:
    """A real service with a study of tokens/s against peak memory, one that adds the cost
    as a third objective and one of tokens/s alone, their trials leased and reported
    through the API with simulated results."""
    _need_browser()
    from cubic.bench.service import api_server
    from cubic.store.schema import upgrade
    from tests.service.conftest import SPACES, first_batch, run_study, spec

    db = f"sqlite:///{tmp_path_factory.mktemp('dashboard-pareto') / 'cubic.db'}"
    upgrade(db)
    with (
        api_server(db, 1, {"CUBIC_SPACES_DIR": str(SPACES)}) as base,
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        ids = {}
        three = [*PARETO_OBJECTIVES, {"metric": "cost", "direction": "minimize"}]
        for name, objectives, trials in (
            ("two", PARETO_OBJECTIVES, 24),
            ("three", three, 12),
            ("one", PARETO_OBJECTIVES[:1], 12),
        ):
            body = spec(name=f"pareto-{name}", budget={"max_trials": trials, "max_parallel": 4})
            del body["objective"]
            resp = client.post("/v1/studies", json={**body, "objectives": objectives})
            assert resp.status_code == 201, resp.text
            study = resp.json()
            first_batch(client, study["id"])
            assert run_study(client, study, count=4) == trials
            ids[name] = study["id"]
        yield base, ids


def pareto_traces(page: Any) -> list[dict[str, Any]]:
    """The traces of the Pareto panel: name, type, mode, x, y, trial ids, line shape."""
    return page.evaluate(
        """() => document.getElementById('pareto').data.map((t) => ({
            name: t.name, type: t.type, mode: t.mode, x: Array.from(t.x || []),
            y: Array.from(t.y || []), ids: Array.from(t.customdata || []),
            shape: t.line ? t.line.shape : null }))"""
    )


def front_matches_the_api(page: Any, front: dict[str, Any], history: dict[str, Any]) -> None:
    """The panel draws every measured trial in the plane of the first two objectives and,
    highlighted, exactly the trials of ``GET /pareto``, joined as a staircase."""
    x, y = (o["metric"] for o in front["objectives"][:2])
    measured, on = pareto_traces(page)
    assert on["name"] == "Pareto front" and on["ids"] == [p["trial"]["id"] for p in front["points"]]
    assert on["x"] == [p["values"][x] for p in front["points"]]
    assert on["y"] == [p["values"][y] for p in front["points"]]
    assert on["mode"] == "lines+markers" and on["shape"] == "hv"
    plane = [
        (v, w)
        for v, w in zip(history["trials"]["value"], history["value2"], strict=True)
        if v is not None and w is not None
    ]
    assert list(zip(measured["x"], measured["y"], strict=True)) == plane
    assert measured["type"] == ("histogram2d" if len(plane) > 1000 else "scatter")
    titles = page.evaluate(
        "() => { const l = document.getElementById('pareto').layout;"
        " return [l.xaxis.title.text, l.yaxis.title.text]; }"
    )
    assert titles == [f"{x} (higher is better)", f"{y} (lower is better)"]


def test_pareto_front_panel(
    pareto_server: tuple[str, dict[str, int]], page: Any, tmp_path: Path
) -> None:
    base, ids = pareto_server
    sid = ids["two"]
    front = get(base, f"studies/{sid}/pareto")
    history = get(base, f"studies/{sid}/history")
    assert len(front["points"]) >= 2 and history["value2"] is not None

    page.goto(f"{base}/ui/study.html?id={sid}")
    page.wait_for_function("document.body.dataset.rendered", timeout=WAIT_MS)
    loaded(page)
    assert page.locator("#pareto-panel").is_visible()
    assert page.locator("#pareto .main-svg").count() > 0
    front_matches_the_api(page, front, history)
    note = page.locator("#pareto-note")
    assert note.get_attribute("data-objectives") == "2"
    assert f"{len(front['points'])} trials on the front" in note.text_content()

    # a click on a front point shows that trial's configuration
    assert page.locator("#pareto-config").is_hidden()
    picked = front["points"][-1]
    point = page.locator("#pareto .scatterlayer .trace").nth(1).locator("path.point")
    assert point.count() == len(front["points"])
    box = point.nth(len(front["points"]) - 1).bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector(
        f'#pareto-line[data-trial-id="{picked["trial"]["id"]}"]', timeout=WAIT_MS
    )
    assert f"#{picked['trial']['number']}" in page.locator("#pareto-line").text_content()
    params = picked["trial"]["params"]
    assert yaml.safe_load(page.locator("#pareto-yaml").text_content()) == params
    assert json.loads(page.locator("#pareto-json").text_content()) == params
    page.locator("#pareto-panel").screenshot(path=tmp_path / "pareto.png")


def test_pareto_front_of_three_objectives_in_the_plane_of_two(
    pareto_server: tuple[str, dict[str, int]], page: Any
) -> None:
    """The front over all three objectives, drawn in the first two's plane as markers (no
    staircase: there it need not be one), and the page says so."""
    base, ids = pareto_server
    front = get(base, f"studies/{ids['three']}/pareto")
    assert len(front["objectives"]) == 3 and front["points"]
    page.goto(f"{base}/ui/study.html?id={ids['three']}")
    page.wait_for_function("document.body.dataset.rendered", timeout=WAIT_MS)
    loaded(page)
    _, on = pareto_traces(page)
    assert on["ids"] == [p["trial"]["id"] for p in front["points"]]
    assert on["x"] == [p["values"]["tokens_per_s"] for p in front["points"]]
    assert on["y"] == [p["values"]["peak_memory_gb"] for p in front["points"]]
    assert on["mode"] == "markers"
    note = page.locator("#pareto-note")
    assert note.get_attribute("data-objectives") == "3"
    assert "all 3 objectives" in note.text_content() and "first two" in note.text_content()


def test_no_pareto_panel_for_one_objective(
    pareto_server: tuple[str, dict[str, int]], page: Any
) -> None:
    base, ids = pareto_server
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    page.goto(f"{base}/ui/study.html?id={ids['one']}")
    page.wait_for_function("document.body.dataset.rendered", timeout=WAIT_MS)
    loaded(page)
    assert page.locator("#best-by-trial .main-svg").count() > 0  # the page drew its plots
    assert page.locator("#pareto-panel").is_hidden()
    assert page.locator("#pareto .main-svg").count() == 0
    assert not any("/pareto" in url for url in asked)


BIG_STUDY_TRIALS = 10_000


@pytest.fixture(scope="module")
def big_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A real service over a finished simulated study of 10,000 trials of tokens/s against
    peak memory (written straight through the store, as ``cubic bench dashboard`` does) and
    a stored proxy model."""
    _need_browser()
    from cubic.bench.dashboard import fill_store
    from cubic.bench.service import api_server
    from tests.service.conftest import SPACES

    db = f"sqlite:///{tmp_path_factory.mktemp('dashboard-10k') / 'cubic.db'}"
    study = SPACES / "bench_mo" / "llama3_8b_h100x16_memory.study.yaml"
    sid = fill_store(db, BIG_STUDY_TRIALS, study)
    with api_server(db, 1, {"CUBIC_RETRAIN_EVERY": "100000"}) as base:
        yield base, sid


def test_a_ten_thousand_trial_study_page_draws_every_panel(
    big_server: tuple[str, int], page: Any, tmp_path: Path
) -> None:
    """Every panel of the page of a 10,000-trial study is drawn and shows the API's figures
    (how long it takes is ``cubic bench dashboard``'s to measure, not a test's)."""
    base, sid = big_server
    history = get(base, f"studies/{sid}/history")
    best = get(base, f"studies/{sid}/best")
    importance = get(base, f"studies/{sid}/importance")
    assert len(history["trials"]["number"]) == BIG_STUDY_TRIALS and history["n_predicted"] > 1000
    assert len(history["top"]) == 50 and history["errors"]

    page.goto(f"{base}/ui/study.html?id={sid}")
    page.wait_for_function("document.body.dataset.rendered", timeout=WAIT_MS)
    loaded(page)
    assert float(page.locator("body").get_attribute("data-rendered")) > 0
    for plot in (
        "best-by-trial",
        "best-by-hours",
        "predicted-scatter",
        "importance",
        "infeasible-knobs",
        "parallel",
    ):
        assert page.locator(f"#{plot} .main-svg").count() > 0, plot
    # a density drawn as one image, not 10,000 marker nodes
    assert page.locator("#predicted-scatter .hm image").count() == 1
    assert page.locator("#predicted-scatter path.point").count() == 0
    figures_match_the_api(page, history, best)
    # the Pareto front: every trial as a density, the front's few trials as markers on top
    front = get(base, f"studies/{sid}/pareto")
    assert 2 <= len(front["points"]) < 200
    assert page.locator("#pareto .hm image").count() == 1
    assert page.locator("#pareto path.point").count() == len(front["points"])
    front_matches_the_api(page, front, history)
    importance_matches_the_api(page, importance)
    assert page.locator("#trials tbody tr").count() == 50
    assert int(page.locator("#trials-range").get_attribute("data-total")) == BIG_STUDY_TRIALS
    assert int(page.locator("#summary").get_attribute("data-done")) == BIG_STUDY_TRIALS
    page.screenshot(path=tmp_path / "study-10k.png", full_page=True)

"""Probes, metrics, settings and the API description."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from cubic.errors import InvalidInput
from cubic.store.schema import downgrade
from service.app import create_app
from service.metrics import exposition, gauge, observe_proxy_fit
from service.settings import ServiceSettings
from tests.service.conftest import REPO, assert_error, create, run_study, service_settings

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})?'
    r" (?P<value>[-+]?(?:[0-9.]+(?:e[-+]?[0-9]+)?|Inf|NaN))$"
)


def parse_exposition(text: str) -> dict[str, float]:
    """Check every line of a Prometheus text page; samples keyed by ``name{labels}``."""
    assert text.endswith("\n")
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            assert name not in types, f"{name} declared twice"
            types[name] = kind
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a valid sample line: {line!r}"
        family = re.sub(r"_(bucket|sum|count)$", "", m["name"])
        assert m["name"] in types or family in types, f"{line!r} has no TYPE"
        key = m["name"] + ("{" + m["labels"] + "}" if m["labels"] else "")
        samples[key] = float(m["value"].replace("Inf", "inf"))
    return samples


def test_metrics_after_leases_and_reports(client: TestClient) -> None:
    study = create(client)
    before = parse_exposition(client.get("/metrics").text)
    run_study(client, study)
    observe_proxy_fit(0.3)
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = parse_exposition(resp.text)

    for name in ("cubic_lease_latency_seconds", "cubic_report_latency_seconds"):
        grown = after[f"{name}_count"] - before[f"{name}_count"]
        assert grown >= 3, name
        assert after[f'{name}_bucket{{le="+Inf"}}'] == after[f"{name}_count"]
        assert after[f"{name}_sum"] > 0
    assert after["cubic_proxy_fit_seconds_count"] >= 1
    assert after['cubic_proxy_fit_seconds_bucket{le="0.5"}'] >= 1
    assert after['cubic_studies{state="completed"}'] == 1
    # Trial gauges cover live studies only; a new running study shows all its states.
    sid = create(client)["id"]
    client.post(f"/v1/studies/{sid}/trials:lease", json={"worker_id": "w", "count": 2})
    live = parse_exposition(client.get("/metrics").text)
    # (prometheus_client writes the label names in alphabetical order)
    assert live[f'cubic_trials{{state="running",study="{sid}"}}'] == 2
    assert live[f'cubic_trials{{state="complete",study="{sid}"}}'] == 0
    assert not any(f'study="{study["id"]}"' in k for k in live)


def test_gauges_read_at_scrape_time_escape_their_labels() -> None:
    page = exposition([gauge("x_things", "help", [((("kind", 'a"b\\c\nd'),), 2)])])
    samples = parse_exposition(page)
    assert samples['x_things{kind="a\\"b\\\\c\\nd"}'] == 2
    assert samples["cubic_reaped_trials_total"] >= 0  # the process's own families come first


def test_readyz_is_503_when_the_schema_goes_away(migrated_url: str) -> None:
    with TestClient(create_app(service_settings(migrated_url))) as client:
        assert client.get("/readyz").json() == {"status": "ready"}
        downgrade(migrated_url, "base")
        body = assert_error(client.get("/readyz"), 503, "SchemaOutOfDate")
        assert "cubic db upgrade" in body["detail"]
        assert client.get("/readyz").headers["retry-after"] == "1"
        assert client.get("/healthz").json() == {"status": "ok"}  # the process is still up


def test_the_app_refuses_to_start_on_an_unmigrated_database(db_url: str) -> None:
    with (
        pytest.raises(Exception, match="cubic db upgrade"),
        TestClient(create_app(service_settings(db_url))),
    ):
        pass


def test_settings_come_from_the_environment_and_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBIC_DATABASE_URL", "sqlite:///elsewhere.db")
    monkeypatch.setenv("CUBIC_REAP_INTERVAL_S", "2.5")
    s = ServiceSettings.from_env()
    assert (s.database_url, s.reap_interval_s, s.default_lease_s, s.max_page_size) == (
        "sqlite:///elsewhere.db",
        2.5,
        300.0,
        500,
    )
    monkeypatch.setenv("CUBIC_REAP_INTERVAL_S", "0")
    monkeypatch.setenv("CUBIC_MAX_PAGE_SIZE", "lots")
    with pytest.raises(InvalidInput, match="CUBIC_REAP_INTERVAL_S") as info:
        create_app()
    assert "CUBIC_MAX_PAGE_SIZE" in str(info.value)
    monkeypatch.delenv("CUBIC_REAP_INTERVAL_S")
    monkeypatch.delenv("CUBIC_MAX_PAGE_SIZE")
    monkeypatch.setenv("CUBIC_DATABASE_URL", "mysql://x")
    with pytest.raises(InvalidInput, match="CUBIC_DATABASE_URL"):
        ServiceSettings.from_env()


def test_openapi_documents_every_route_with_examples(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = set(doc["paths"])
    for p in (
        "/v1/studies",
        "/v1/studies/{study_id}",
        "/v1/studies/{study_id}:pause",
        "/v1/studies/{study_id}:resume",
        "/v1/studies/{study_id}:stop",
        "/v1/studies/{study_id}:archive",
        "/v1/studies/{study_id}/best",
        "/v1/studies/{study_id}/trials",
        "/v1/trials/{trial_id}",
        "/v1/studies/{study_id}/trials:lease",
        "/v1/trials/{trial_id}:heartbeat",
        "/v1/trials/{trial_id}:report",
        "/v1/trials/{trial_id}:release",
        "/v1/studies/{study_id}/trials:enqueue",
        "/v1/studies/{study_id}/trials:import",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert p in paths, p
    create_body = doc["paths"]["/v1/studies"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/yaml"} <= set(create_body)
    schemas = doc["components"]["schemas"]
    for name in ("LeaseRequest", "ReportRequest", "LeaseOut", "StudyOut", "BestOut"):
        assert schemas[name].get("examples"), name


def test_every_setting_is_in_the_readmes_table() -> None:
    """Each ``CUBIC_*`` setting of the service is a row of the README's Configuration table,
    and every ``CUBIC_*`` variable the code reads is described somewhere in the README."""
    import ast

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Configuration") :].split("\n## ", 1)[0]
    rows = {m for line in table.splitlines() for m in re.findall(r"`([A-Z_]+)`", line)}
    settings = {"CUBIC_" + name.upper() for name in ServiceSettings.model_fields}
    assert not settings - rows, f"settings missing from the table: {sorted(settings - rows)}"
    read = set()
    for folder in ("cubic", "service"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    read |= set(re.findall(r"\bCUBIC_[A-Z_]*[A-Z]_?\b", node.value))
    undocumented = {name for name in read if name not in readme}
    assert not undocumented, f"variables the README never names: {sorted(undocumented)}"


def test_the_api_docs_load_nothing_from_outside(client: TestClient) -> None:
    """Swagger UI comes from this process (a CDN leaves /docs blank offline)."""
    html = client.get("/docs")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
    assert urls and not [u for u in urls if "//" in u], urls
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200, url
        if url.endswith(".js"):
            assert len(asset.content) > 100_000, url

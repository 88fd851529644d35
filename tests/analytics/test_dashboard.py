"""The dashboard as one file: plotly.js draws every panel, offline, from the aggregates."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapter.analytics import names
from adapter.analytics.dashboard import build_dashboard
from adapter.analytics.panels import dashboard_data
from tests.analytics.conftest import AnalysedExport
from tests.support.browser import CHROMIUM_ARGS

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"
)


@pytest.fixture(scope="module")
def dashboard(analysed: AnalysedExport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dashboard(
        analysed.output, tmp_path_factory.mktemp("dash") / "dashboard.html", "alpha.example"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (Python)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def _open(browser: Any, page_file: Path) -> tuple[list[dict[str, Any]], list[str], list[str], Any]:
    """Panels as drawn, console errors, and every URL the page asked for."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    requested: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requested.append(r.url))
    page.goto(page_file.as_uri())
    page.wait_for_selector("#dashboard[data-state=drawn]", timeout=30_000)
    panels = page.evaluate(
        """() => [...document.querySelectorAll('figure.panel')].map(f => {
            const plot = f.querySelector('.js-plotly-plot .main-svg');
            const box = plot ? plot.getBoundingClientRect() : {width: 0, height: 0};
            return {
                id: f.id.replace('panel-', ''), state: f.dataset.state,
                points: Number(f.dataset.points),
                width: box.width, height: box.height,
                marks: f.querySelectorAll('.point, path.js-line, .hm, image').length,
                tableRows: f.querySelectorAll('table.numbers tbody tr').length,
            };
        })"""
    )
    return panels, errors, requested, page


def test_the_data_carries_the_headline_figures(analysed: AnalysedExport) -> None:
    data = dashboard_data(analysed.output)
    known = analysed.known.summary
    assert data["messages"] == known["rows_read"]["messages"]
    assert data["latency_ms"]["p50"] == known["delivery_latency"]["p50_ms"]
    assert data["latency_ms"]["p99"] == known["delivery_latency"]["p99_ms"]
    assert data["latency_ms"]["deliveries"] == known["delivery_latency"]["pairs"] > 0
    assert {p["id"] for p in data["panels"]} >= {"messages", "latency-by-route", "lanes"}
    json.dumps(data)  # what the node serves as data.json


def test_the_file_loads_nothing_from_elsewhere(dashboard: Path) -> None:
    html = dashboard.read_text()
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert re.findall(r"<link[^>]*>", html) == ['<link rel="icon" href="data:,">']


@needs_chromium
def test_every_panel_is_drawn_offline_without_errors(
    dashboard: Path, analysed: AnalysedExport, browser: Any
) -> None:
    panels, errors, requested, page = _open(browser, dashboard)
    page.screenshot(path=str(dashboard.with_suffix(".png")), full_page=True)
    codes = page.evaluate(
        """() => [...document.querySelectorAll('#panel-codes tbody tr td:first-child')]
            .map(td => td.textContent)"""
    )
    tiles = page.inner_text("#tiles")
    page.close()

    assert errors == []
    assert requested == [dashboard.as_uri()], "the page must load nothing else"
    assert [p["id"] for p in panels] == [
        *("messages", "errors", "codes"),
        *("latency-over-time", "latency-by-route", "request-latency"),
        *("domains", "federation", "top-runtimes", "top-hypertys"),
        *("lanes", "fanout", "churn"),
    ]
    for panel in panels:
        assert panel["width"] > 300 and panel["height"] > 150, panel
        if panel["id"] == "federation":  # the synthetic world has no peer of alpha.example
            continue
        assert panel["state"] == "drawn" and panel["points"] > 0, panel
        assert panel["tableRows"] > 0, panel
    known_codes = analysed.known.aggregates[names.RESPONSE_CODES].column("response_code")
    assert sorted(codes) == sorted(str(c) for c in known_codes.to_pylist())
    p50 = analysed.known.summary["delivery_latency"]["p50_ms"]
    assert f"{p50:,} /" in tiles


@needs_chromium
def test_missing_or_broken_aggregates_are_reported_not_fatal(
    analysed: AnalysedExport, tmp_path: Path, browser: Any
) -> None:
    partial = tmp_path / "aggregates"
    shutil.copytree(analysed.output, partial)
    shutil.rmtree(partial / names.BATCHING)
    for part in (partial / names.TOP_TALKERS).glob("*.parquet"):
        part.write_text("broken")
    (partial / names.SUMMARY_FILE).write_text("{not json")

    panels, errors, _, page = _open(browser, build_dashboard(partial, tmp_path / "d.html"))
    notes = page.inner_text("#notes")
    page.close()

    states = {p["id"]: p["state"] for p in panels}
    assert errors == []
    assert states["lanes"] == "missing"
    assert states["top-runtimes"] == states["top-hypertys"] == "missing"
    assert states["messages"] == states["domains"] == "drawn"
    assert "no summary.json" in notes


@needs_chromium
def test_addresses_from_the_traffic_are_text_not_markup(tmp_path: Path, browser: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    hostile = "hyperty://evil/</script><img src=x onerror=alert(1)>"
    (tmp_path / names.TOP_TALKERS).mkdir()
    pq.write_table(
        pa.table(
            {
                "talker": ["hyperty"],
                "rank": [1],
                "address": [hostile],
                "messages": [3],
                "bytes": [9],
            }
        ),
        tmp_path / names.TOP_TALKERS / "part-00000.parquet",
    )
    _, errors, requested, page = _open(browser, build_dashboard(tmp_path, tmp_path / "d.html"))
    cell = page.text_content("#panel-top-hypertys tbody tr td:nth-child(2)")
    injected = page.evaluate("() => document.querySelectorAll('img[src=x]').length")
    page.close()

    assert errors == []
    assert cell == hostile
    assert injected == 0
    assert all(url.startswith("file://") for url in requested)


@needs_chromium
def test_an_address_spelled_as_a_link_is_drawn_as_text_in_the_chart(
    tmp_path: Path, browser: Any
) -> None:
    """plotly.js reads a few tags in the text it draws: an address spelled like a link (which a
    runtime chooses) is drawn as the characters it is, never as a link in the operator's page."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    forged = '<a href="https://evil.example/">runtime://d/click-me</a>'
    (tmp_path / names.TOP_TALKERS).mkdir()
    pq.write_table(
        pa.table(
            {
                "talker": ["runtime"],
                "rank": [1],
                "address": [forged],
                "messages": [3],
                "bytes": [9],
            }
        ),
        tmp_path / names.TOP_TALKERS / "part-00000.parquet",
    )
    _, errors, _requested, page = _open(browser, build_dashboard(tmp_path, tmp_path / "d.html"))
    links = page.evaluate(
        "() => [...document.querySelectorAll('#panel-top-runtimes .main-svg a')].length"
    )
    drawn = page.evaluate(
        "() => document.querySelector('#panel-top-runtimes .main-svg').textContent"
    )
    page.close()

    assert errors == []
    assert links == 0
    assert forged in drawn

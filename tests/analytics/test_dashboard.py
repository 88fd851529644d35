"""The dashboard: one offline HTML file whose charts are drawn and whose numbers are there."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from adapter.analytics import names
from adapter.analytics.dashboard import build_dashboard
from tests.analytics.conftest import AnalysedExport
from tests.support.browser import CHROMIUM_ARGS

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def dashboard(analysed: AnalysedExport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_dashboard(analysed.output, tmp_path_factory.mktemp("dash") / "dashboard.html")


def test_the_page_needs_nothing_from_the_network(dashboard: Path) -> None:
    html = dashboard.read_text()
    assert "<script" not in html
    assert "<link" not in html
    # The only URL is the SVG namespace, which browsers never fetch.
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}


def test_every_aggregate_has_a_figure_and_a_numbers_table(dashboard: Path) -> None:
    html = dashboard.read_text()
    for name in names.AGGREGATE_NAMES:
        if name == names.LATENCY_OVERALL:  # drawn as the "(all)" row of the latency chart
            continue
        assert f'<figure data-aggregate="{name}">' in html, name
        assert f'<table class="numbers" data-aggregate="{name}">' in html, name
    assert "No data" not in html


def test_missing_or_broken_aggregates_are_reported_not_fatal(
    analysed: AnalysedExport, tmp_path: Path
) -> None:
    partial = tmp_path / "aggregates"
    shutil.copytree(analysed.output, partial)
    shutil.rmtree(partial / names.BATCHING)
    for part in (partial / names.TOP_TALKERS).glob("*.parquet"):
        part.write_text("broken")
    (partial / "summary.json").write_text("{not json")

    html = build_dashboard(partial, tmp_path / "d.html").read_text()

    assert f'class="empty" data-aggregate="{names.BATCHING}"' in html
    assert f'class="empty" data-aggregate="{names.TOP_TALKERS}"' in html
    assert "No summary.json" in html
    assert f'<figure data-aggregate="{names.DOMAIN_TRAFFIC}">' in html


def test_addresses_from_the_traffic_are_escaped(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    hostile = "hyperty://evil/<script>alert(1)</script>"
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
    html = build_dashboard(tmp_path, tmp_path / "d.html").read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_charts_are_drawn_in_a_browser_offline(dashboard: Path, analysed: AnalysedExport) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (Python)")
    requested: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("request", lambda request: requested.append(request.url))
            page.goto(dashboard.as_uri())
            figures = page.evaluate(
                """() => [...document.querySelectorAll('figure')].map(f => {
                    const svg = f.querySelector('svg');
                    const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
                    const points = [...f.querySelectorAll('polyline')]
                        .map(p => p.points.numberOfItems);
                    return {
                        name: f.dataset.aggregate,
                        width: box.width, height: box.height,
                        marks: f.querySelectorAll('rect.bar, rect.cell, circle.point').length,
                        points: points.reduce((a, b) => a + b, 0),
                        tableRows: f.querySelectorAll('table.numbers tbody tr').length,
                    };
                })"""
            )
            codes_in_table = page.evaluate(
                """() => [...document.querySelectorAll(
                    'table[data-aggregate="response_codes"] tbody tr td:first-child')]
                    .map(td => td.textContent)"""
            )
        finally:
            browser.close()

    assert requested == [dashboard.as_uri()], "the page must load nothing else"
    drawn = {f["name"] for f in figures}
    assert drawn == set(names.AGGREGATE_NAMES) - {names.LATENCY_OVERALL}
    for figure in figures:
        assert figure["width"] > 100 and figure["height"] > 50, figure
        assert figure["marks"] + figure["points"] > 0, figure
        assert figure["tableRows"] > 0, figure
    known_codes = analysed.known.aggregates[names.RESPONSE_CODES].column("response_code")
    assert sorted(codes_in_table) == sorted(str(c) for c in known_codes.to_pylist())

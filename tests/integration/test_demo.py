"""The demo page in headless Chromium: two runtimes, each with the bundled stub, ping each other
through the node and Synapse."""

from __future__ import annotations

import pytest

from adapter.storage import migrate

from ..conftest import Databases, NodeFactory
from ..support.browser import chromium_browser

pytestmark = [pytest.mark.integration]


async def test_demo_page_exchanges_ping_and_pong(
    chromium: str, start_node: NodeFactory, databases: Databases
) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url)
    async with chromium_browser(chromium) as browser:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"http://127.0.0.1:{node.stub_port}/demo")
        await page.wait_for_selector("#result[data-pongs='1']", timeout=30_000)
        # A second exchange, started from the page's button.
        await page.click("#ping")
        await page.wait_for_selector("#result[data-pongs='2']", timeout=30_000)
        # Bob leaves: Alice, who follows his registration, is told at once.
        await page.click("#disconnect")
        gone = "#bob-registration[data-status='disconnected']"
        await page.wait_for_selector(gone, timeout=15_000)
        alice_log = await page.locator("#alice .log li").all_inner_texts()
        bob_log = await page.locator("#bob .log li").all_inner_texts()
        statuses = await page.locator(".status").all_inner_texts()
    assert errors == []
    assert statuses == ["live", "disconnected"]
    assert any("found Bob by user" in line for line in alice_log)
    assert sum("← ping" in line for line in bob_log) == 2
    assert sum("→ response" in line for line in bob_log) == 2
    assert sum('"pong"' in line for line in alice_log) == 2
    # The pings went through Matrix: events the homeserver persisted carried them (the node
    # delivers a lane event once the homeserver answered its send).
    sent = sum(node.metrics.matrix_events_out.labels(c)._value.get() for c in ("inline", "media"))
    delivered = node.metrics.matrix_events_in.labels("delivered")._value.get()
    assert sent >= 4 and delivered >= 4

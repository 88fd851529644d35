"""reTHINK runtimes deploy the domain's stub from the node, talk through it, and survive a reload.

In headless Chromium, each runtime is a page that deploys the stub the way one of reTHINK's
runtimes does (tests/support/rethink_deploy/core.js names the lines of reTHINK's code each step
mirrors):

- ``systemjs``: runtime-core since 2019: SystemJS imports ``https://<domain>/.well-known/
  protocolstub/default.ps.js``, ``new result.default()``, the descriptor ``default.ps.json``
  beside it, and ``_start(url, bus, config, factory)`` in an in-page sandbox;
- ``worker``: dev-runtime-browser: the descriptor from the domain's catalogue
  (``hyperty-catalogue://catalogue.<domain>/.well-known/protocolstub/default``), its
  ``sourcePackage`` evaluated in a Web Worker sandbox, which calls the global ``activate``.

Requests to ``https://<domain>`` and ``https://catalogue.<domain>`` are answered by the node under
test: that is all a domain's web server has to do. Two runtimes exchange numbered messages through
the node and Synapse; one reloads (its page, and with it its Worker, is gone; a new page with the
same runtimeURL deploys the stub again) and must get every message exactly once.

The first test's runtimes take their hyperty's address back before their stub connects again.
reTHINK's runtimes connect first (the hyperty's registration again goes through the node) and
add the hyperty's listener only once it is deployed, handing what comes for it meanwhile back to
the stub: the second test does that, and scripts/rethink_runtime_check.py runs reTHINK's own.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import BrowserContext, Page, Route

from adapter.storage import migrate

from ..conftest import Databases, NodeFactory
from ..support.browser import chromium_browser

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "support" / "rethink_deploy"
SYSTEMJS = ROOT / "stub_js" / "node_modules" / "systemjs" / "dist" / "system.js"
DOMAIN = "mn.test"  # the test node's domain
BEFORE, WHILE_AWAY = 20, 20  # messages to the reloading runtime before and during its absence


async def _until(page: Page, expression: str, what: str, timeout: float = 30) -> Any:
    """Polls an (async) expression in the page until it is truthy; fails with `what`."""
    try:
        async with asyncio.timeout(timeout):
            while not (value := await page.evaluate(f"async () => {expression}")):
                await asyncio.sleep(0.05)
            return value
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@asynccontextmanager
async def harness_site() -> AsyncIterator[str]:
    """Serves the runtime pages from loopback, as a runtime's own site (a page Playwright made up
    would count as a public address, and Chromium keeps those away from loopback sockets)."""
    app = web.Application()

    async def systemjs(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(SYSTEMJS)

    app.router.add_get("/harness/system.js", systemjs)
    app.router.add_static("/harness/", HARNESS)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class Browser:
    def __init__(self, context: BrowserContext, site: str, node: str, flavor: str) -> None:
        self._context = context
        self._site = site
        self._node = node
        self._flavor = flavor
        self.errors: list[str] = []

    async def route(self) -> None:
        async def domain(route: Route) -> None:
            # The domain's web server and its catalogue pass /.well-known/protocolstub/ on to
            # the node.
            path = route.request.url.split("/", 3)[3]
            response = await route.fetch(url=f"{self._node}/{path}")
            await route.fulfill(response=response)

        await self._context.route(f"https://{DOMAIN}/**", domain)
        await self._context.route(f"https://catalogue.{DOMAIN}/**", domain)

    async def runtime(self, runtime_url: str) -> Page:
        """A page that deploys the domain's stub for `runtime_url` as the flavor's runtime does."""
        page = await self._context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        await page.goto(f"{self._site}/harness/runtime.html")
        await page.evaluate(
            "([domain, runtimeURL]) => { self.rt = new Runtime(domain, runtimeURL); }",
            [DOMAIN, runtime_url],
        )
        deploy = (
            "rt.deploySystemJS()"
            if self._flavor == "systemjs"
            else "rt.deployInWorker('context_service.js')"
        )
        async with asyncio.timeout(30):
            assert await page.evaluate(f"async () => await {deploy}") == "deployed"
        return page


@asynccontextmanager
async def _alice_and_bob(
    flavor: str, chromium: str, start_node: NodeFactory, databases: Databases
) -> AsyncIterator[tuple[Any, Browser, Page, Page, str]]:
    """A node, two pages that each deploy its stub as the flavor's runtime does, and Bob's
    runtimeURL (a reload deploys it again)."""
    if not SYSTEMJS.exists():
        pytest.fail("stub_js dev dependencies missing: run `npm ci` in stub_js")
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url)
    run = uuid.uuid4().hex[:8]
    bob_url = f"runtime://{DOMAIN}/bob-{run}"
    async with harness_site() as site, chromium_browser(chromium) as chromium_app:
        context = await chromium_app.new_context()
        browser = Browser(context, site, f"http://127.0.0.1:{node.stub_port}", flavor)
        await browser.route()
        alice = await browser.runtime(f"runtime://{DOMAIN}/alice-{run}")
        bob = await browser.runtime(bob_url)
        try:
            yield node, browser, alice, bob, bob_url
        finally:
            await context.close()


@pytest.mark.parametrize("flavor", ["systemjs", "worker"])
async def test_runtimes_deploy_the_stub_talk_and_one_reloads_losing_nothing(
    flavor: str, chromium: str, start_node: NodeFactory, databases: Databases
) -> None:
    async with _alice_and_bob(flavor, chromium, start_node, databases) as (
        node,
        browser,
        alice,
        bob,
        bob_url,
    ):
        alice_hyperty = await alice.evaluate("rt.allocate()")
        bob_hyperty = await bob.evaluate("rt.allocate()")

        await alice.evaluate("([to, n]) => rt.ping(to, 1, n)", [bob_hyperty, BEFORE])
        await _until(bob, f"rt.received.length === {BEFORE}", "Bob's first messages")
        # Bob's stub acknowledged them and its session store holds that, with the token.
        await _until(bob, "(await rt.stats()).unrecorded === 0", "Bob's session recorded")
        first_life = await bob.evaluate("rt.received")
        await bob.close()  # the reload: page and sandbox gone without a word

        await alice.evaluate(
            "([to, first, n]) => rt.ping(to, first, n)", [bob_hyperty, BEFORE + 1, WHILE_AWAY]
        )
        await _until(alice, "(await rt.stats()).unacknowledged === 0", "the node to have them")

        bob = await browser.runtime(bob_url)
        await bob.evaluate("h => rt.adopt(h)", bob_hyperty)
        await bob.evaluate("([to]) => rt.ping(to, 1000, 1)", [alice_hyperty])  # Bob is back
        await _until(alice, "rt.received.includes(1000)", "Bob's message after the reload")
        last = BEFORE + WHILE_AWAY + 1
        await alice.evaluate("([to, n]) => rt.ping(to, n, 1)", [bob_hyperty, last])
        # Per-sender order: once the last arrived, everything before it has.
        await _until(bob, f"rt.received.includes({last})", "Alice's last message")
        second_life = await bob.evaluate("rt.received")
        bob_statuses = await bob.evaluate("rt.statuses")
        alice_received = await alice.evaluate("rt.received")

    got = first_life + second_life
    lost = sorted(set(range(1, last + 1)) - set(got))
    duplicated = len(got) - len(set(got))
    assert (lost, duplicated) == ([], 0), (first_life, second_life)
    assert first_life == list(range(1, BEFORE + 1))
    assert second_life == list(range(BEFORE + 1, last + 1))
    assert alice_received == [1000]
    assert {"value": "live", "desc": "session resumed"} in bob_statuses
    assert browser.errors == []
    # Through Synapse: events the homeserver persisted carried the messages.
    delivered = node.metrics.matrix_events_in.labels("delivered")._value.get()
    assert delivered >= 1


@pytest.mark.parametrize("flavor", ["systemjs", "worker"])
async def test_a_reloaded_runtime_that_deploys_its_hyperty_late_loses_nothing(
    flavor: str, chromium: str, start_node: NodeFactory, databases: Databases
) -> None:
    """As reTHINK's runtimes reload: the stub connects for the hyperty's registration again and
    the session resumes, but the hyperty's listener comes only after the registry's answer; what
    arrives for it before is handed back to the stub. The stub holds it, then offers it again:
    the hyperty gets every message once, in order."""
    async with _alice_and_bob(flavor, chromium, start_node, databases) as (
        _node,
        browser,
        alice,
        bob,
        bob_url,
    ):
        await alice.evaluate("rt.allocate()")
        bob_hyperty = await bob.evaluate("rt.allocate()")
        await bob.evaluate("rt.register(false)")  # what tells the stub the hyperty is Bob's

        await alice.evaluate("([to, n]) => rt.ping(to, 1, n)", [bob_hyperty, BEFORE])
        await _until(bob, f"rt.received.length === {BEFORE}", "Bob's first messages")
        await _until(bob, "(await rt.stats()).unrecorded === 0", "Bob's session recorded")
        first_life = await bob.evaluate("rt.received")
        await bob.close()

        await alice.evaluate(
            "([to, first, n]) => rt.ping(to, first, n)", [bob_hyperty, BEFORE + 1, WHILE_AWAY]
        )
        await _until(alice, "(await rt.stats()).unacknowledged === 0", "the node to have them")

        bob = await browser.runtime(bob_url)
        # Resolves with the registry's answer.
        await bob.evaluate("h => rt.redeploy(h)", bob_hyperty)
        # The listener is not there yet: what the stub hands on comes back to it.
        await _until(bob, "rt.returned > 0", "Bob's runtime handing messages back")
        await bob.evaluate("rt.listen()")
        last = BEFORE + WHILE_AWAY + 1
        await alice.evaluate("([to, n]) => rt.ping(to, n, 1)", [bob_hyperty, last])
        await _until(bob, f"rt.received.includes({last})", "Alice's last message")
        second_life = await bob.evaluate("rt.received")
        stats = await bob.evaluate("rt.stats()")

    assert first_life == list(range(1, BEFORE + 1))
    assert second_life == list(range(BEFORE + 1, last + 1)), second_life
    assert stats["held"] == 0 and stats["returned"] > 0, stats
    assert browser.errors == []

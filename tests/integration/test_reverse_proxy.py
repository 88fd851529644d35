"""Browsers on https pages reach the node through the reverse proxy config contrib/ ships.

An https page may open only wss:// sockets and load only https:// scripts. The proxy (nginx from
Debian's packages, with contrib/nginx/rethink-mn.conf rendered as an operator fills it in) takes
TLS with a certificate from a CA the test makes, serves the domain's own pages, and passes the
stub's WebSocket, the served stub, the registry's REST API and the dashboard on to the node.

Chromium reaches ``https://mn.test`` at the proxy's loopback port (--host-resolver-rules) and
accepts the test certificate's key, and only it, besides its own roots
(--ignore-certificate-errors-spki-list): the page is a secure context as on a real domain.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import Page, async_playwright

from adapter.storage import migrate

from ..conftest import Databases, NodeFactory
from ..support.browser import CHROMIUM_ARGS
from ..support.reverse_proxy import PROXIES, ProxyCertificate, make_certificate, proxy

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "support" / "rethink_deploy"
SYSTEMJS = ROOT / "stub_js" / "node_modules" / "systemjs" / "dist" / "system.js"
DOMAIN = "mn.test"  # the test node's domain, and the name the proxy's certificate is for
DASHBOARD_TOKEN = "dashboard-token-" + "x" * 16
MESSAGES = 20
FORGED = "203.0.113.9"  # an address a client claims for itself


@pytest.fixture
def certificate(tmp_path: Path) -> ProxyCertificate:
    return make_certificate(tmp_path / "tls", DOMAIN)


async def _until(page: Page, expression: str, what: str, timeout: float = 30) -> Any:
    try:
        async with asyncio.timeout(timeout):
            while not (value := await page.evaluate(f"async () => {expression}")):
                await asyncio.sleep(0.05)
            return value
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def _web_root(tmp_path: Path) -> Path:
    """The domain's own site: the page that hosts a runtime, and its scripts."""
    root = tmp_path / "www"
    shutil.copytree(HARNESS, root)
    shutil.copy(SYSTEMJS, root / "system.js")
    root.chmod(0o755)
    return root


@asynccontextmanager
async def _echo_backend() -> AsyncIterator[tuple[int, list[dict[str, str]]]]:
    """A stand-in for the node that records the headers of what reaches it."""
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append({"path": request.path, **dict(request.headers)})
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for message in ws:
                await ws.send_str(message.data)
            return ws
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("kind", PROXIES)
async def test_the_proxy_tells_the_node_who_asked_and_over_what(
    kind: str, tmp_path: Path, certificate: ProxyCertificate
) -> None:
    """Every location passes Host, X-Forwarded-For and X-Forwarded-Proto; the stub location
    passes the WebSocket upgrade, and frames go both ways over wss."""
    async with (
        _echo_backend() as (port, seen),
        proxy(kind)(
            tmp_path / kind,
            server_name=DOMAIN,
            cert=certificate.server,
            stub=f"127.0.0.1:{port}",
            appservice=f"127.0.0.1:{port}",
            web_root=_web_root(tmp_path),
        ) as running,
    ):
        base = f"https://127.0.0.1:{running.port}"
        tls = certificate.client_context()
        # A client may send an X-Forwarded-For of its own: the proxy's entry comes last.
        kwargs: dict[str, Any] = {
            "ssl": tls,
            "server_hostname": DOMAIN,
            "headers": {"Host": DOMAIN, "X-Forwarded-For": FORGED},
        }
        async with aiohttp.ClientSession() as session:
            for path in (
                "/.well-known/protocolstub/default.ps.json",
                "/registry/hyperty/user/x",
                "/dashboard/data.json",
                "/stub/protostub.js",
            ):
                async with session.get(base + path, **kwargs) as resp:
                    assert resp.status == 200, (path, running.log())
            async with session.ws_connect(
                f"wss://127.0.0.1:{running.port}/stub/connect", **kwargs
            ) as ws:
                await ws.send_str("over wss")
                assert (await ws.receive(timeout=10)).data == "over wss"
            # Nothing else is passed on: a path of the node's that the proxy does not name.
            async with session.get(base + "/_matrix/app/v1/ping", **kwargs) as resp:
                assert resp.status == 404
    assert [entry["path"] for entry in seen] == [
        "/.well-known/protocolstub/default.ps.json",
        "/registry/hyperty/user/x",
        "/dashboard/data.json",
        "/stub/protostub.js",
        "/stub/connect",
    ]
    for entry in seen:
        assert entry["Host"] == DOMAIN, entry
        # nginx appends the client's address to what the client sent, Caddy replaces it.
        forwarded_for = [hop.strip() for hop in entry["X-Forwarded-For"].split(",")]
        assert forwarded_for[-1] == "127.0.0.1", entry
        assert forwarded_for in (["127.0.0.1"], [FORGED, "127.0.0.1"]), entry
        assert entry["X-Forwarded-Proto"] == "https", entry
    upgrade = seen[-1]
    assert upgrade["Upgrade"].lower() == "websocket"
    assert upgrade["Connection"].lower() == "upgrade"


@pytest.mark.parametrize("kind", PROXIES)
async def test_an_https_page_deploys_the_stub_and_two_runtimes_talk_over_wss(
    kind: str,
    tmp_path: Path,
    certificate: ProxyCertificate,
    chromium: str,
    start_node: NodeFactory,
    databases: Databases,
) -> None:
    if not SYSTEMJS.exists():
        pytest.fail("stub_js dev dependencies missing: run `npm ci` in stub_js")
    url = databases.sqlite()
    await migrate.upgrade(url)
    # What contrib/nginx/rethink-mn.conf tells the operator to set.
    node = await start_node(
        url,
        **{
            "stub.public_url": f"https://{DOMAIN}",
            "stub.allowed_origins": [f"https://{DOMAIN}"],
            "stub.tokenless_sessions": "refuse",
            "appservice.public_hosts": [DOMAIN],
            "dashboard.trust_loopback": False,
            "dashboard.token": DASHBOARD_TOKEN,
        },
    )
    as_port = node.config.appservice.listen.port
    async with proxy(kind)(
        tmp_path / kind,
        server_name=DOMAIN,
        cert=certificate.server,
        stub=f"127.0.0.1:{node.stub_port}",
        appservice=f"127.0.0.1:{as_port}",
        web_root=_web_root(tmp_path),
    ) as running:
        await _check_rest_through(running.port, certificate, as_port)
        args = [
            *CHROMIUM_ARGS,
            f"--host-resolver-rules=MAP {DOMAIN} 127.0.0.1:{running.port}",
            f"--ignore-certificate-errors-spki-list={certificate.spki_sha256()}",
        ]
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium, args=args)
            try:
                context = await browser.new_context()
                errors: list[str] = []
                run = uuid.uuid4().hex[:8]
                pages = []
                for name in ("alice", "bob"):
                    page = await context.new_page()
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    await page.goto(f"https://{DOMAIN}/runtime.html")
                    assert await page.evaluate("window.isSecureContext")
                    runtime_url = f"runtime://{DOMAIN}/{name}-{run}"
                    await page.evaluate(
                        "([d, r]) => { self.rt = new Runtime(d, r); }", [DOMAIN, runtime_url]
                    )
                    async with asyncio.timeout(30):
                        deployed = await page.evaluate("async () => await rt.deploySystemJS()")
                    assert deployed == "deployed", running.log()
                    pages.append(page)
                alice, bob = pages
                descriptor = await alice.evaluate(
                    "async () => (await fetch('/.well-known/protocolstub/default.ps.json')).json()"
                )
                assert descriptor["configuration"]["messagingnode"] == (
                    f"wss://{DOMAIN}/stub/connect"
                )
                # Each stub's first answer comes through its socket: no socket, no answer.
                async with asyncio.timeout(30):
                    alice_hyperty = await alice.evaluate("rt.allocate()")
                    bob_hyperty = await bob.evaluate("rt.allocate()")
                await alice.evaluate("([to, n]) => rt.ping(to, 1, n)", [bob_hyperty, MESSAGES])
                await bob.evaluate("([to]) => rt.ping(to, 1000, 1)", [alice_hyperty])
                await _until(bob, f"rt.received.length === {MESSAGES}", "Alice's messages")
                await _until(alice, "rt.received.length === 1", "Bob's message")
                assert await bob.evaluate("rt.received") == list(range(1, MESSAGES + 1))
                assert await alice.evaluate("rt.received") == [1000]
                assert errors == []
            finally:
                await browser.close()
        if kind == "nginx":
            # Both stubs' sockets went through the proxy, upgraded (101). (Chromium reaches
            # mn.test nowhere else, so with either proxy they can have gone no other way.)
            access = (running.prefix / "access.log").read_text()
            upgraded = [line for line in access.splitlines() if '"GET /stub/connect' in line]
            assert sum('" 101 ' in line for line in upgraded) >= 2, access
    assert node.metrics.matrix_events_in.labels("delivered")._value.get() >= 1


async def _check_rest_through(port: int, certificate: ProxyCertificate, as_port: int) -> None:
    """The registry's REST API and the dashboard answer through the proxy as the node does."""
    kwargs: dict[str, Any] = {
        "ssl": certificate.client_context(),
        "server_hostname": DOMAIN,
        "headers": {"Host": DOMAIN},
    }
    base, direct = f"https://127.0.0.1:{port}", f"http://127.0.0.1:{as_port}"
    user = "/registry/hyperty/user/user%3A%2F%2Fmn.test%2Fnobody"
    async with aiohttp.ClientSession() as session:
        async with session.get(direct + user) as resp:
            expected = (resp.status, await resp.text())
        async with session.get(base + user, **kwargs) as resp:
            assert (resp.status, await resp.text()) == expected
        # Through the proxy every request comes from loopback: with trust_loopback off, the
        # dashboard's data needs its token.
        async with session.get(base + "/dashboard/data.json", **kwargs) as resp:
            assert resp.status == 401
        bearer = {
            **kwargs,
            "headers": {"Host": DOMAIN, "Authorization": f"Bearer {DASHBOARD_TOKEN}"},
        }
        async with session.get(base + "/dashboard/data.json", **bearer) as resp:
            assert resp.status == 200
            json.loads(await resp.text())

"""Which domains are peers and how their homeservers are found: the allow list, configured
server names, and discovery through /.well-known/matrix/server (served here by aiohttp)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from adapter.access import AccessMonitor
from adapter.config import FederationConfig, PeerConfig
from adapter.federation.peers import PeerRefused, Peers
from adapter.routing_table import RoutingTable


@pytest_asyncio.fixture(loop_scope="session")
async def well_known() -> AsyncIterator[str]:
    async def serve(request: web.Request) -> web.StreamResponse:
        domain = request.match_info["domain"]
        if domain == "matrix.example":
            return web.json_response({"m.server": "hs.matrix.example:443"})
        if domain == "broken.example":
            return web.Response(text="not json")
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/{domain}/.well-known/matrix/server", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


@pytest.mark.asyncio(loop_scope="session")
async def test_peers_are_the_allow_list_found_by_configuration_or_discovery(
    well_known: str,
) -> None:
    config = FederationConfig(
        peers={
            "b.example": PeerConfig(server_name="127.0.0.1:8449"),
            "matrix.example": PeerConfig(),
            "nothing.example": PeerConfig(),
            "broken.example": PeerConfig(),
            "down.example": PeerConfig(),
        },
        discovery_timeout_seconds=1,
    )

    def url(domain: str) -> str:
        if domain == "down.example":
            return "http://127.0.0.1:9/.well-known/matrix/server"
        return f"{well_known}/{domain}/.well-known/matrix/server"

    async with aiohttp.ClientSession() as http:
        peers = Peers(config, "a.example", http, url)
        b = await peers.resolve("b.example")
        assert (b.server_name, b.bot) == ("127.0.0.1:8449", "@_rethink_bot:127.0.0.1:8449")
        found = await peers.resolve("matrix.example")
        assert found.server_name == "matrix.example"  # delegation is the homeserver's business
        assert peers.by_bot("@_rethink_bot:matrix.example") == found
        for domain, code in (
            ("elsewhere.example", 403),
            ("nothing.example", 404),
            ("broken.example", 404),
            ("down.example", 504),
        ):
            with pytest.raises(PeerRefused) as refused:
                await peers.resolve(domain)
            assert refused.value.code == code, domain
        assert peers.remote_domain("hyperty://b.example/x") == "b.example"
        assert peers.remote_domain("domain://msg-node.b.example/sm") == "b.example"
        assert peers.remote_domain("hyperty://a.example/x") is None


def test_other_domains_subscriptions_are_destinations() -> None:
    table = RoutingTable()
    table.add_runtime(1, "runtime://a/1")
    table.subscribe(1, ["comm://a/o/changes"])
    table.subscribe_domain("b.example", "runtime://b.example/1", ["comm://a/o/changes"])
    table.subscribe_domain("b.example", "runtime://b.example/2", ["comm://a/o/changes"])
    table.subscribe_domain("c.example", "runtime://c.example/1", ["comm://a/o/changes"])
    found = AccessMonitor("a", table).receivers(("comm://a/o/changes",), None)
    assert found.sessions == {1} and found.domains == {"b.example", "c.example"}
    # A domain stays a destination while any of its runtimes holds the subscription.
    table.unsubscribe_domain("b.example", "runtime://b.example/1", ["comm://a/o/changes"])
    assert AccessMonitor("a", table).receivers(("comm://a/o/changes",), None).domains == {
        "b.example",
        "c.example",
    }
    table.unsubscribe_domain("b.example", "runtime://b.example/2")  # its session ended
    assert AccessMonitor("a", table).receivers(("comm://a/o/changes",), None).domains == {
        "c.example"
    }
    table.unsubscribe(1, ["comm://a/o/changes"])
    table.unsubscribe_domain("c.example", "runtime://c.example/1", ["comm://a/o/changes"])
    assert not AccessMonitor("a", table).receivers(("comm://a/o/changes",), None).known

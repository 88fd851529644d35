"""MN services wired into the running node: registry relays and the policy engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from adapter.storage import migrate

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
D = "mn.test"


@pytest_asyncio.fixture(loop_scope="session")
async def fake_registries() -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []

    async def hyperty_by_url(request: web.Request) -> web.Response:
        seen.append(request)
        url = request.match_info["url"]
        if url.endswith("missing"):
            return web.json_response({"message": "Data not found"}, status=404)
        return web.json_response({url: {"descriptor": "hyperty-catalogue://d/x", "status": "live"}})

    async def guid(request: web.Request) -> web.Response:
        seen.append(request)
        return web.json_response({"Code": 200, "Description": "OK", "Value": "the-jwt"})

    app = web.Application()
    app.router.add_get("/hyperty/url/{url}", hyperty_by_url)
    app.router.add_get("/guid/{guid}", guid)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    await runner.cleanup()


async def test_registry_and_global_registry_are_relayed(
    start_node: NodeFactory, databases: Databases, fake_registries: tuple[str, list[Any]]
) -> None:
    base, seen = fake_registries
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url, **{"registry.url": base, "global_registry.url": base})
    rt = await PyRuntime(
        f"ws://127.0.0.1:{node.stub_port}/stub/connect", f"runtime://{D}/reg"
    ).connect()
    try:
        hyperty = f"hyperty://{D}/h1"
        answer = await rt.request(f"domain://registry.{D}/", "read", {"resource": hyperty})
        assert answer["body"]["code"] == 200
        assert answer["body"]["value"][hyperty]["status"] == "live"
        assert seen[-1].raw_path == "/hyperty/url/hyperty%3A%2F%2Fmn.test%2Fh1"

        missing = await rt.request(
            f"domain://registry.{D}", "read", {"resource": f"hyperty://{D}/missing"}
        )
        assert missing["body"]["code"] == 404 and "value" not in missing["body"]

        gr = await rt.request("global://registry/", "read", {"guid": "abc"})
        # The runtime's GraphConnector reads the global registry's fields at the body's top.
        assert gr["body"]["code"] == 200 and gr["body"]["Value"] == "the-jwt"
        assert gr["body"]["value"]["Value"] == "the-jwt"

        # The IdM answers from the node itself: an anonymous session has no identity to read.
        idm = await rt.request(f"domain://idm.{D}", "read", {})
        assert idm["body"]["code"] == 404 and "no identity" in idm["body"]["desc"]
        unknown = await rt.request(f"domain://msg-node.{D}/nothing-here", "read", {})
        assert unknown["body"]["code"] == 404
    finally:
        await rt.close()


async def test_unconfigured_registry_answers_503(
    start_node: NodeFactory, databases: Databases
) -> None:
    """No external registry and the built-in one switched off."""
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url, **{"registry.builtin.enabled": False})
    rt = await PyRuntime(
        f"ws://127.0.0.1:{node.stub_port}/stub/connect", f"runtime://{D}/noreg"
    ).connect()
    try:
        answer = await rt.request(f"domain://registry.{D}", "read", {"resource": "user://x/y"})
        assert answer["body"]["code"] == 503 and "not configured" in answer["body"]["desc"]
    finally:
        await rt.close()


async def test_policy_rules_and_rate_limit(start_node: NodeFactory, databases: Databases) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(
        url,
        **{
            "policy.rules": [
                {
                    "to": "hyperty://blocked.example/*",
                    "action": "deny",
                    "code": 451,
                    "reason": "not with them",
                }
            ],
            "policy.rate_limit": {"messages_per_second": 1.0, "burst": 3},
        },
    )
    rt = await PyRuntime(
        f"ws://127.0.0.1:{node.stub_port}/stub/connect", f"runtime://{D}/pol"
    ).connect()
    try:
        [h] = await rt.allocate(D)  # uses one token
        await rt.send({"id": "p1", "type": "ping", "from": h, "to": "hyperty://blocked.example/z"})
        denied = await rt.receive(5)
        assert denied["body"] == {"code": 451, "desc": "not with them"}
        codes = []
        for i in range(3):
            await rt.send({"id": f"r{i}", "type": "ping", "from": h, "to": f"hyperty://{D}/none"})
            codes.append((await rt.receive(5))["body"]["code"])
        assert 429 in codes, codes
    finally:
        await rt.close()

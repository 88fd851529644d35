"""The domain out of the box: the built-in registry through the node and Synapse, with presence
following runtimes' connections and status changes published to subscribers."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from yarl import URL

from adapter.storage import migrate

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"
REGISTRY = f"domain://registry.{D}/"
SM = f"domain://msg-node.{D}/sm"
USER = f"user://{D}/alice"


async def register(rt: PyRuntime, url: str, resources: list[str]) -> dict[str, Any]:
    value = {
        "user": USER,
        "descriptor": f"hyperty-catalogue://catalogue.{D}/.well-known/hyperty/Chat",
        "url": url,
        "expires": 120,
        "resources": resources,
        "dataSchemes": ["comm"],
        "runtime": rt.runtime_url,
        "status": "live",
    }
    return await rt.request(REGISTRY, "create", {"value": value, "policy": "p"})


async def read(rt: PyRuntime, resource: str, **criteria: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"resource": resource}
    if criteria:
        body["criteria"] = criteria
    return (await rt.request(REGISTRY, "read", body))["body"]


async def status_update(rt: PyRuntime, value: str) -> dict[str, Any]:
    """The next publication of a registration's status ``value`` (the registration's creation
    may be published too: destinations are decided when the message is delivered)."""
    while True:
        message = await rt.receive(15)
        if message.get("type") == "update" and message["body"] == {
            "attribute": "status",
            "value": value,
        }:
            assert str(message["to"]).endswith("/registration")
            return dict(message)


async def test_a_fresh_node_answers_the_registry_and_publishes_presence(
    start_node: NodeFactory, databases: Databases
) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url)
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/reg-alice", acked=True).connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/reg-bob", acked=True).connect()
    try:
        [chat] = await alice.allocate(D)
        assert (await register(alice, chat, ["chat"]))["body"]["code"] == 200

        found = await read(bob, USER)
        assert found["code"] == 200 and list(found["value"]) == [chat]
        assert found["value"][chat]["runtime"] == alice.runtime_url
        assert (await read(bob, USER, resources=["chat"]))["code"] == 200
        assert (await read(bob, USER, resources=["video"]))["code"] == 404
        assert (await read(bob, chat))["value"]["hypertyID"] == chat
        assert (await read(bob, f"user://{D}/nobody"))["code"] == 404

        # Keep-alive: an update with an empty body.
        keep = await alice.request(REGISTRY, "update", {"resource": chat, "value": {}})
        assert keep["body"]["code"] == 200

        # Bob follows alice's registration; alice's runtime goes away without `disconnect`.
        subscribed = await bob.request(SM, "subscribe", {"resources": [f"{chat}/registration"]})
        assert subscribed["body"]["code"] == 200
        await alice.drop()
        gone = await status_update(bob, "disconnected")
        assert gone["from"] == chat
        assert (await read(bob, USER))["code"] == 408  # every match is disconnected

        # Her runtime comes back: live again, and bob is told.
        await alice.connect()
        back = await status_update(bob, "live")
        assert back["from"] == chat
        assert (await read(bob, USER))["code"] == 200

        # The same data on the REST API of the appservice listener (read-only by default).
        rest = (
            f"http://127.0.0.1:{node.appservice_port}/registry/hyperty/user/{quote(USER, safe='')}"
        )
        async with aiohttp.ClientSession() as http, http.get(URL(rest, encoded=True)) as resp:
            assert resp.status == 200
            assert list(await resp.json()) == [chat]
        write = URL(rest + "/x", encoded=True)
        async with aiohttp.ClientSession() as http, http.put(write, json={}) as resp:
            assert resp.status == 403

        # Unregister: disconnected (then removed after the grace time), published too.
        gone_for_good = await alice.request(
            REGISTRY, "delete", {"value": {"user": USER, "url": chat}}
        )
        assert gone_for_good["body"]["code"] == 200
        assert (await status_update(bob, "disconnected"))["from"] == chat
    finally:
        await alice.close()
        await bob.close()

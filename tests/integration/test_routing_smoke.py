"""First light: two Python runtimes exchange a message through the real homeserver."""

from __future__ import annotations

import pytest

from ..conftest import Homeserver, NodeFactory
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
DOMAIN = "mn.test"


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_ping_pong(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    url = f"ws://127.0.0.1:{node.stub_port}/stub/connect"
    alice = await PyRuntime(url, f"runtime://{DOMAIN}/alice").connect()
    bob = await PyRuntime(url, f"runtime://{DOMAIN}/bob").connect(handshake="v1")
    try:
        assert bob.connect_answer and bob.connect_answer["response"] == 200
        [a] = await alice.allocate(DOMAIN)
        [b] = await bob.allocate(DOMAIN)
        await alice.send({"id": 7, "type": "PING", "from": a, "to": b, "body": {"x": 1.5}})
        got = await bob.receive(15)
        assert got == {"id": 7, "type": "PING", "from": a, "to": b, "body": {"x": 1.5}}
        await bob.send({"id": 7, "type": "response", "from": b, "to": a, "body": {"code": 200}})
        back = await alice.receive(15)
        assert back["body"]["code"] == 200 and back["from"] == b
    finally:
        await alice.close()
        await bob.close()

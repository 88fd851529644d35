"""Property-based fuzzing of what a hostile runtime can send, against a real node, Synapse and
database (issue 22): the stub frame grammar, MN service bodies (tests/support/grammar.py) and
the appservice transaction body.

For every example the node must: answer no request with a server error (5xx; an unconfigured
global registry's 503 is its documented answer), keep routing for an honest pair beside the
attacker, and keep a database it can load: every ``RESTART_EVERY`` examples the node is stopped
and started again on the same database and must come back routing.

CI runs a fixed budget (``RETHINK_FUZZ_EXAMPLES``, default 120 per backend); set it higher for a
long run (docs/benchmark.md reports a 30-minute one).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapter.node import Node

from ..conftest import Homeserver, NodeFactory
from ..support.grammar import D, frames, transactions
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]

EXAMPLES = int(os.environ.get("RETHINK_FUZZ_EXAMPLES", "120"))
RESTART_EVERY = max(EXAMPLES // 3, 20)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # One node serves every example of a test: that is the point (state accumulates).
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
    derandomize=os.environ.get("CI") == "true",
    print_blob=True,
)


def server_errors(received: list[Any]) -> list[Any]:
    """What the node answered with a 5xx, other than the unconfigured global registry's 503."""
    bad = []
    for item in received:
        if not isinstance(item, dict):
            continue
        code = item.get("response")
        body = item.get("body")
        if isinstance(body, dict) and item.get("type") == "response":
            code = body.get("code")
            if code == 503 and str(item.get("from", "")).startswith("global://"):
                continue
        if isinstance(code, int) and code >= 500:
            bad.append(item)
    return bad


@dataclass
class Arena:
    """A node, an honest pair, and the attacker's socket."""

    start_node: NodeFactory
    database_url: str
    node: Node | None = None
    alice: PyRuntime | None = None
    bob: PyRuntime | None = None
    a: str = ""
    b: str = ""
    mallory: aiohttp.ClientWebSocketResponse | None = None
    mallory_token: str | None = None
    http: aiohttp.ClientSession | None = None
    examples: int = 0
    pings: int = 0
    received: list[Any] = field(default_factory=list)

    async def open(self) -> None:
        self.node = await self.start_node(self.database_url)
        url = stub_url(self.node)
        # The same runtimes (same runtimeURLs, their tokens) across the node's restarts.
        if self.alice is None or self.bob is None:
            self.alice = PyRuntime(url, f"runtime://{D}/fuzz-alice", acked=True)
            self.bob = PyRuntime(url, f"runtime://{D}/fuzz-bob", acked=True)
        self.alice.stub_url = self.bob.stub_url = url
        await self.alice.connect()
        await self.bob.connect()
        if not self.a:
            [self.a] = await self.alice.allocate(D)
            [self.b] = await self.bob.allocate(D)
        self.http = self.http or aiohttp.ClientSession()
        await self.connect_mallory()

    async def connect_mallory(self) -> None:
        """The attacker's own session: resumed with its token, or new once it released it."""
        assert self.node is not None and self.http is not None
        answer: dict[str, Any] = {}
        for token in (self.mallory_token, None):
            self.mallory = await self.http.ws_connect(stub_url(self.node))
            data: dict[str, Any] = {
                "runtimeURL": f"runtime://{D}/fuzz-mallory",
                "ack": {"v": 1, "stub": "fuzzmallory01", "received": 0},
            }
            if token:
                data["token"] = token
            await self.mallory.send_str(orjson.dumps({"cmd": "connect", "data": data}).decode())
            answer = await self.mallory.receive_json(timeout=10)
            if answer.get("response") == 200:
                self.mallory_token = answer["data"]["token"]
                return
            await self.mallory.close()
        raise AssertionError(f"the attacker's own session was refused: {answer}")

    async def close(self, final: bool = True) -> None:
        for runtime in (self.alice, self.bob):
            if runtime is not None:
                await (runtime.close() if final else runtime.drop())
        if self.mallory is not None:
            await self.mallory.close()
        if self.node is not None:
            await self.node.stop()
        if final and self.http is not None:
            await self.http.close()

    async def attack(self, sent: list[str]) -> None:
        if self.mallory is None or self.mallory.closed:
            await self.connect_mallory()
        assert self.mallory is not None
        for frame in sent:
            if self.mallory.closed:
                break
            await self.mallory.send_str(frame)
        await self.drain(0.05)

    async def drain(self, quiet: float) -> None:
        assert self.mallory is not None
        while not self.mallory.closed:
            try:
                msg = await self.mallory.receive(timeout=quiet)
            except TimeoutError:
                return
            if msg.type != aiohttp.WSMsgType.TEXT:
                return
            parsed = orjson.loads(msg.data)
            if isinstance(parsed, list) and len(parsed) == 4:
                await self.mallory.send_str(f'{{"cmd":"ack","received":{parsed[0]}}}')
                parsed = parsed[3]
            self.received.append(parsed)

    async def honest_pair_routes(self) -> None:
        assert self.alice is not None and self.bob is not None
        self.pings += 1
        tag = f"ping-{self.pings}"
        await self.alice.send({"id": tag, "type": "ping", "from": self.a, "to": self.b})
        started = time.monotonic()
        try:
            async with asyncio.timeout(10):
                await self._ping_arrives(tag)
        except TimeoutError:
            raise AssertionError(await self._stall_report(tag, started)) from None

    async def _ping_arrives(self, tag: str) -> None:
        assert self.bob is not None
        while (await self.bob.receive(60)).get("id") != tag:
            pass  # what the attacker sent bob meanwhile

    async def _stall_report(self, tag: str, started: float) -> str:
        """Late or lost, and in what state the pair was: what a stall needs to be explained."""
        assert self.alice is not None and self.bob is not None
        try:
            async with asyncio.timeout(50):
                await self._ping_arrives(tag)
            fate = f"arrived late, after {time.monotonic() - started:.1f} s"
        except TimeoutError:
            fate = "never arrived within 60 s"
        alice, bob = self.alice, self.bob
        return (
            f"honest {tag} {fate}; alice closed={alice.ws is None or alice.ws.closed}"
            f" (code {alice.close_code}), unacked={len(alice.unacked)};"
            f" bob closed={bob.ws is None or bob.ws.closed} (code {bob.close_code})"
        )

    async def restart(self) -> None:
        """Stop and start the node on the same database: what it stored must load."""
        await self.close(final=False)
        self.node = None
        await self.open()


async def _arena(start_node: NodeFactory, database_url: str) -> Arena:
    arena = Arena(start_node, database_url)
    await arena.open()
    return arena


@pytest.fixture
async def arena(start_node: NodeFactory, database_url: str) -> Any:
    arena = await _arena(start_node, database_url)
    yield arena
    await arena.close()


@FUZZ
@given(data=st.data())
async def test_no_frame_makes_the_node_fail_stall_or_store_what_it_cannot_load(
    arena: Arena, data: st.DataObject
) -> None:
    known = [arena.a, arena.b, f"runtime://{D}/fuzz-alice", f"runtime://{D}/fuzz-bob"]
    sent = data.draw(st.lists(frames(known), min_size=1, max_size=4), label="frames")
    await arena.attack(sent)
    await arena.honest_pair_routes()
    assert server_errors(arena.received) == [], sent
    arena.examples += 1
    if arena.examples % RESTART_EVERY == 0:
        await arena.restart()
        await arena.honest_pair_routes()


@FUZZ
@given(body=transactions())
async def test_no_transaction_body_makes_the_appservice_fail_or_routing_stall(
    arena: Arena, homeserver: Homeserver, body: str
) -> None:
    assert arena.node is not None and arena.http is not None
    arena.examples += 1
    url = (
        f"http://127.0.0.1:{arena.node.appservice_port}"
        f"/_matrix/app/v1/transactions/fuzz-{os.getpid()}-{arena.examples}"
    )
    headers = {"Authorization": f"Bearer {homeserver.hs_token}"}
    async with arena.http.put(url, data=body.encode(), headers=headers) as resp:
        assert resp.status < 500, (resp.status, body)
    await arena.honest_pair_routes()

"""Property-based fuzzing of what a hostile runtime can send, against a real node, Synapse and
database (issue 22): the stub frame grammar, MN service bodies (tests/support/grammar.py) and
the appservice transaction body.

For every example the node must: close no connection 1011 (a failure inside the node), answer
no request with a server error (5xx; an unconfigured global registry's 503 is its documented
answer) even after the attacker resends as a real stub does (its unacknowledged numbered frames
again after every reconnect: a frame that fails inside the node three times is answered 500),
keep routing for an honest pair beside the attacker, and keep a database it can load: every
``RESTART_EVERY`` examples the node is stopped and started again on the same database and must
come back routing. The transaction fuzzer's node has a peer domain, so that the events of the
peer's node it is pushed are acted on (rooms followed, batches delivered); after every example
a genuine event of that peer must still reach a runtime.

Examples are new every run (the seed is printed in the session header) after the kept corpus
(tests/support/fuzzing.py). CI runs a fixed budget (``RETHINK_FUZZ_EXAMPLES``, default 120 per
backend); set it higher for a long run (docs/benchmark.md reports a 30-minute one).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, seed
from hypothesis import strategies as st

from adapter import carrier
from adapter.node import Node

from ..conftest import Homeserver, NodeFactory
from ..support.fuzzing import fuzz_seed, fuzz_settings
from ..support.grammar import D, frames, transactions
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]

EXAMPLES = int(os.environ.get("RETHINK_FUZZ_EXAMPLES", "120"))
RESTART_EVERY = max(EXAMPLES // 3, 20)
FUZZ = fuzz_settings(EXAMPLES)
# The test's own time grows with its examples (a fraction of a second each, on a busy machine
# more): the suite's 300 s would end a long run.
RUN_TIMEOUT = pytest.mark.timeout(300 + 2 * EXAMPLES)
# The peer domain of the transaction fuzzer's node: its node acts as this bot.
PEER = "peer.test"
PEER_BOT = "@_rethink_bot:peer.hs"
# Every genuine probe comes in a room of its own, so the peer opens a room per example: its
# bound on rooms (federation.peers.<peer>.max_rooms, 16 by default) is raised past any run's.
PEERS = {"federation.peers": {PEER: {"server_name": "peer.hs", "max_rooms": 100_000}}}
# How often the attacker reconnects and resends within one example, at most: the node answers a
# frame that fails inside it 500 at its third attempt (adapter/routing/ingress.py).
RESENDS = 4
# Closes after which a stub drops its session and what it had queued (stub_js/src/index.js):
# released (1000), refused (4401), replaced by a newer connection (4409).
FINAL_CLOSES = frozenset({1000, 4401, 4409})
CLOSE_INTERNAL_ERROR = 1011
NUMBERED = re.compile(r"\[\s*([0-9]+)\s*,")


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
    overrides: dict[str, Any] = field(default_factory=dict)
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
    # What the node answered the attacker in this example, and how it closed its sockets.
    received: list[Any] = field(default_factory=list)
    closes: list[int | None] = field(default_factory=list)
    # The attacker's numbered frames the node has not acknowledged: sent again after each
    # reconnect, in order, as the bundled stub does.
    unacked: list[tuple[int, str]] = field(default_factory=list)
    probes: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    arrived: set[str] = field(default_factory=set)  # the honest pings and probes bob got

    async def open(self) -> None:
        self.node = await self.start_node(self.database_url, **self.overrides)
        url = stub_url(self.node)
        # The same runtimes (same runtimeURLs, their tokens) across the node's restarts.
        if self.alice is None or self.bob is None:
            self.alice = PyRuntime(url, f"runtime://{D}/fuzz-alice", acked=True)
            self.bob = PyRuntime(url, f"runtime://{D}/fuzz-bob", acked=True)
            # The attacker may send them the same message twice (an example drawn again, its
            # numbered frames resent to a new session): only the honest pair's own pings are
            # held to once, by _arrives.
            self.alice.twice_allowed = self.bob.twice_allowed = True
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
                self._acknowledged(answer["data"]["ack"]["seq"])
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
        """Send the frames as a stub would, reconnecting when the node closes the socket, then
        resend what the node has not acknowledged until it has, or ``RESENDS`` times."""
        self.received, self.closes = [], []
        for frame in sent:
            await self._open()
            self._keep(frame)
            await self.mallory.send_str(frame)  # type: ignore[union-attr]
        await self.drain(0.05)
        for _ in range(RESENDS):
            if not self.unacked or not self.mallory or not self.mallory.closed:
                break
            await self._open()
            await self.drain(0.05)

    async def _open(self) -> None:
        """A live socket: after a close, a new connection with the token and the unacknowledged
        numbered frames sent again (or, after a close that ends the session, a new session and
        nothing kept)."""
        if self.mallory is not None and not self.mallory.closed:
            return
        code = None if self.mallory is None else self.mallory.close_code
        self.closes.append(code)
        if code in FINAL_CLOSES:
            self.unacked.clear()
        await self.connect_mallory()
        assert self.mallory is not None
        for _, text in self.unacked:
            await self.mallory.send_str(text)

    def _keep(self, frame: str) -> None:
        """A numbered frame a stub could have sent (a safe number above those kept) is kept
        until acknowledged."""
        numbered = NUMBERED.match(frame)
        if numbered is None:
            return
        seq = int(numbered.group(1))
        if 0 < seq <= carrier.MAX_NUMBER and all(seq > kept for kept, _ in self.unacked):
            self.unacked.append((seq, frame))

    def _acknowledged(self, seq: Any) -> None:
        if isinstance(seq, int):
            self.unacked = [(s, t) for s, t in self.unacked if s > seq]

    async def drain(self, quiet: float) -> None:
        assert self.mallory is not None
        while not self.mallory.closed:
            try:
                msg = await self.mallory.receive(timeout=quiet)
            except TimeoutError:
                return
            if msg.type != aiohttp.WSMsgType.TEXT:
                if self.mallory.closed:
                    self.closes.append(self.mallory.close_code)
                return
            parsed = orjson.loads(msg.data)
            if isinstance(parsed, list) and len(parsed) == 4:
                await self.mallory.send_str(f'{{"cmd":"ack","received":{parsed[0]}}}')
                parsed = parsed[3]
            elif isinstance(parsed, dict) and parsed.get("cmd") == "ack":
                self._acknowledged(parsed.get("seq"))
            self.received.append(parsed)

    async def honest_pair_routes(self) -> None:
        assert self.alice is not None and self.bob is not None
        self.pings += 1
        tag = f"ping-{self.pings}"
        await self.alice.send({"id": tag, "type": "ping", "from": self.a, "to": self.b})
        started = time.monotonic()
        try:
            async with asyncio.timeout(10):
                await self._arrives(tag)
        except TimeoutError:
            raise AssertionError(await self._stall_report(tag, started)) from None

    async def _arrives(self, tag: str) -> None:
        """Until ``tag`` arrives at bob; what the attacker sent him meanwhile is skipped, and
        an honest ping or probe that arrives a second time fails."""
        assert self.bob is not None
        while True:
            got = (await self.bob.receive(60)).get("id")
            if got == tag:
                self.arrived.add(tag)
                return
            assert got not in self.arrived, f"{got} reached bob twice"

    async def _stall_report(self, tag: str, started: float) -> str:
        """Late or lost, and in what state the pair was: what a stall needs to be explained."""
        assert self.alice is not None and self.bob is not None
        try:
            async with asyncio.timeout(50):
                await self._arrives(tag)
            fate = f"arrived late, after {time.monotonic() - started:.1f} s"
        except TimeoutError:
            fate = "never arrived within 60 s"
        alice, bob = self.alice, self.bob
        return (
            f"honest {tag} {fate}; alice closed={alice.ws is None or alice.ws.closed}"
            f" (code {alice.close_code}), unacked={len(alice.unacked)};"
            f" bob closed={bob.ws is None or bob.ws.closed} (code {bob.close_code})"
        )

    async def peer_event_arrives(self, homeserver: Homeserver) -> None:
        """A genuine event of the peer's node, in a room of its own pushed for the first time,
        reaches bob: the node still acts on what its peer sends."""
        n = next(self.probes)
        tag = f"peer-probe-{n}"
        text = orjson.dumps(
            {"id": tag, "type": "ping", "from": f"hyperty://{PEER}/prober", "to": self.b}
        ).decode()
        event = {
            "type": carrier.BATCH_EVENT,
            "room_id": f"!probe-{os.getpid()}-{n}:peer.hs",
            "sender": PEER_BOT,
            "event_id": f"$probe-{os.getpid()}-{n}",
            "content": {
                "v": carrier.LANE_FORMAT,
                "n": 1,
                "count": 1,
                "senders": [["prober", f"runtime://{PEER}/prober", PEER_BOT]],
                "messages": [[0, n, [self.b], text]],
            },
        }
        status = await self.push({"events": [event]}, homeserver, f"probe-{n}")
        assert status == 200, status
        try:
            async with asyncio.timeout(20):
                await self._arrives(tag)
        except TimeoutError:
            raise AssertionError(f"the peer's genuine event {tag} never reached bob") from None

    async def push(self, body: Any, homeserver: Homeserver, txn: str) -> int:
        """A transaction pushed to the node's appservice API as the homeserver does."""
        assert self.node is not None and self.http is not None
        url = (
            f"http://127.0.0.1:{self.node.appservice_port}"
            f"/_matrix/app/v1/transactions/fuzz-{os.getpid()}-{txn}"
        )
        data = body.encode() if isinstance(body, str) else orjson.dumps(body)
        headers = {"Authorization": f"Bearer {homeserver.hs_token}"}
        async with self.http.put(url, data=data, headers=headers) as resp:
            return resp.status

    async def restart(self) -> None:
        """Stop and start the node on the same database: what it stored must load."""
        await self.close(final=False)
        self.node = None
        await self.open()


@pytest.fixture
async def arena(start_node: NodeFactory, database_url: str) -> Any:
    arena = Arena(start_node, database_url)
    await arena.open()
    yield arena
    await arena.close()


@pytest.fixture
async def peered_arena(start_node: NodeFactory, database_url: str) -> Any:
    """The arena's node with a peer domain: the events of the peer's node are acted on."""
    arena = Arena(start_node, database_url, PEERS)
    await arena.open()
    yield arena
    await arena.close()


@RUN_TIMEOUT
@seed(fuzz_seed())
@FUZZ
@given(data=st.data())
async def test_no_frame_makes_the_node_fail_stall_or_store_what_it_cannot_load(
    arena: Arena, data: st.DataObject
) -> None:
    known = [arena.a, arena.b, f"runtime://{D}/fuzz-alice", f"runtime://{D}/fuzz-bob"]
    sent = data.draw(st.lists(frames(known), min_size=1, max_size=4), label="frames")
    await arena.attack(sent)
    assert CLOSE_INTERNAL_ERROR not in arena.closes, ("closed 1011", arena.closes, sent)
    assert server_errors(arena.received) == [], sent
    await arena.honest_pair_routes()
    arena.examples += 1
    if arena.examples % RESTART_EVERY == 0:
        await arena.restart()
        await arena.honest_pair_routes()


@RUN_TIMEOUT
@seed(fuzz_seed())
@FUZZ
@given(data=st.data())
async def test_no_transaction_body_makes_the_appservice_fail_or_routing_stall(
    peered_arena: Arena, homeserver: Homeserver, data: st.DataObject
) -> None:
    arena = peered_arena
    arena.examples += 1
    known = [arena.a, arena.b]
    assert arena.node is not None
    own_bot = arena.node.api.bot.user_id
    body = data.draw(transactions(known, PEER, PEER_BOT, own_bot), label="body")
    status = await arena.push(body, homeserver, str(arena.examples))
    assert status < 500, (status, body)
    await arena.honest_pair_routes()
    await arena.peer_event_arrives(homeserver)


async def test_the_fuzzer_sees_a_failure_inside_the_node_and_resends_until_it_is_answered(
    start_node: NodeFactory, databases: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fuzzer's own guard, on a node made to fail: a numbered frame whose deciding raises
    closes the attacker's socket 1011, the attacker resends it after each reconnect as the
    bundled stub does, and the node's 500 at the third attempt reaches it. Both are what the
    fuzz tests fail on."""
    arena = Arena(start_node, await databases.migrated_sqlite())
    await arena.open()
    try:
        assert arena.node is not None
        decide = arena.node.ingress._decide

        async def failing(attachment: Any, raw: str, parsed: Any, pending: Any) -> bool:
            if "poison" in raw:
                raise RuntimeError("a bug on this input")
            return await decide(attachment, raw, parsed, pending)

        monkeypatch.setattr(arena.node.ingress, "_decide", failing)
        poison = {"id": "p", "type": "ping", "from": arena.a, "to": arena.b, "body": {"poison": 1}}
        await arena.attack([f"[{10**6},{orjson.dumps(poison).decode()}]"])
        assert arena.closes.count(CLOSE_INTERNAL_ERROR) >= 2, arena.closes
        assert [m["body"]["code"] for m in server_errors(arena.received)] == [500]
    finally:
        await arena.close()

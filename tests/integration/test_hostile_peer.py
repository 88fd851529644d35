"""A far domain speaks only for itself (issue 24): node A against a hostile domain B, the test
acting as B's node with what B's operator holds (B's appservice token, B's homeserver), through
two federating Synapses on loopback. One test per row of the issue, and a fuzzer over the
content of B's batch events.

B's bot writes into a room it creates for A and invites A's bot into, as B's node would; what A
answers B is read from A's own room to B."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from hypothesis import given, seed
from hypothesis import strategies as st

from adapter import carrier
from adapter.federation import peer_feed
from adapter.node import Node
from adapter.routing.numbering import event_number
from adapter.storage import migrate
from appservice.api import HomeserverClient, MatrixError
from appservice.intent import AppserviceAPI, Intent

from ..conftest import Databases, Federation
from ..support.fuzzing import fuzz_seed, fuzz_settings
from ..support.grammar import CANONICAL_EDGES, canonical_values, json_values, text
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
A, B = "a.mn.test", "b.mn.test"
# A route Carol learned (an address of a domain neither node serves): known, and protected.
PROTECTED = "hyperty://elsewhere.example/protected"
HELLO_SECONDS = 90
# What B's runtimes may subscribe to here, all together (issue 41 row 10).
PEER_SUBSCRIPTIONS = 20


@dataclass
class HostileB:
    """Domain B as its operator could act: its node's bot on its homeserver, writing into one
    room for A (made once: every test's fresh node A follows it from the next event on)."""

    bot: Intent
    room_id: str = ""
    n: int = 0
    # The highest number any event in the room carried (a fuzzed one may be ahead of `n`).
    highest: int = 0
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def open_room(self, a_bot: str) -> None:
        # The invitation crosses federation, which may fail now and then on a busy machine.
        for attempt in range(10):
            try:
                self.room_id = await self.bot.create_room(invite=(a_bot,), federate=True)
                return
            except MatrixError as exc:
                if exc.status != 502 or attempt == 9:
                    raise
                await asyncio.sleep(3)

    async def hello(self, bob: PyRuntime, bo: str) -> None:
        """A first message to A's bob, once A's node follows the room (joined on the invitation,
        or found in the homeserver's push)."""
        tag = f"hello-{os.urandom(3).hex()}"
        await self.send([("bhello", self.n + 1, [bo], self.message(bo, tag=tag))])
        # B's homeserver sends to A at once unless an earlier request to A failed (a busy
        # machine): then it waits out its back-off and its one-minute wake-up of destinations
        # with something to send (Synapse's WAKEUP_RETRY_PERIOD).
        async with asyncio.timeout(HELLO_SECONDS):
            while (await bob.receive(HELLO_SECONDS)).get("body", {}).get("tag") != tag:
                pass

    def content(
        self, messages: list[tuple[str, int, list[str], str]], n: int | None = None
    ) -> dict[str, Any]:
        """A lane batch (format 2) as B's node writes it: (origin, oseq, to, text) each."""
        origins = list(dict.fromkeys(m[0] for m in messages))
        if n is None:
            self.n += 1
            n = self.n
        return {
            "v": carrier.LANE_FORMAT,
            "n": n,
            "count": len(messages),
            "senders": [[o, f"runtime://{B}/{o}", self.bot.user_id] for o in origins],
            "messages": [[origins.index(o), s, to, t] for o, s, to, t in messages],
        }

    async def send(
        self, messages: list[tuple[str, int, list[str], str]], n: int | None = None
    ) -> str:
        return await self.bot.send_event(
            self.room_id, carrier.BATCH_EVENT, self.content(messages, n)
        )

    def message(self, to: str, frm: str = f"hyperty://{B}/mallory", **body: Any) -> str:
        return orjson.dumps(
            {"id": f"b{next(self.ids)}", "type": "ping", "from": frm, "to": to, "body": body}
        ).decode()

    async def answers(self, node_a: Node, a_bot: str) -> list[dict[str, Any]]:
        """What A's node sent B (its answers), read from A's room to B."""
        intent, room_id = await node_a.rooms.to_peer(B, self.bot.user_id)
        page = await intent.messages(room_id, direction="b", limit=100)
        found: list[dict[str, Any]] = []
        for event in reversed(page["chunk"]):
            if event.get("type") != carrier.BATCH_EVENT:
                continue
            for routed in await carrier.decode_batch(event["content"], intent.download):
                found.append(orjson.loads(routed.text))
        return found


@dataclass
class Arena:
    a: Node
    b: HostileB
    a_bot: str
    alice: PyRuntime
    bob: PyRuntime
    carol: PyRuntime
    al: str
    bo: str
    arrived: set[str] = field(default_factory=set)  # the honest pings and B's probes bob got

    async def bob_gets(self, key: str, value: str, seconds: float) -> None:
        """Until the message whose ``key`` (its id, or its body's tag) is ``value`` reaches
        bob; what B's fuzzed events sent him meanwhile is skipped, and an earlier honest
        message arriving again fails."""
        async with asyncio.timeout(seconds):
            while True:
                got = await self.bob.receive(seconds)
                seen = got.get("id") if key == "id" else got.get("body", {}).get("tag")
                if seen == value:
                    self.arrived.add(value)
                    return
                assert seen not in self.arrived, f"{seen} reached bob twice"


async def _start_a(federation: Federation, databases: Databases) -> Node:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = Node(
        federation.a.node_config(
            url,
            **{
                "federation.peers": {
                    B: {
                        "server_name": federation.b.server_name,
                        "identity_providers": ["idp.b"],
                        "max_subscriptions": PEER_SUBSCRIPTIONS,
                    }
                },
                "policy.rules": [{"to": PROTECTED, "action": "deny", "reason": "protected"}],
            },
        )
    )
    await node.start()
    return node


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def b_side(federation: Federation) -> AsyncIterator[HostileB]:
    async with aiohttp.ClientSession() as http:
        b_api = AppserviceAPI(
            HomeserverClient(federation.b.url, federation.b.as_token, http),
            federation.b.server_name,
            "_rethink_bot",
        )
        hostile = HostileB(b_api.bot)
        await hostile.open_room(federation.a.bot)
        yield hostile


@pytest_asyncio.fixture(loop_scope="session")
async def arena(
    federation: Federation, databases: Databases, b_side: HostileB
) -> AsyncIterator[Arena]:
    node = await _start_a(federation, databases)
    hostile = b_side
    stub = f"ws://127.0.0.1:{node.stub_port}/stub/connect"
    alice = await PyRuntime(stub, f"runtime://{A}/hp-alice", acked=True).connect()
    bob = await PyRuntime(stub, f"runtime://{A}/hp-bob", acked=True).connect()
    # B's fuzzed events may carry the same message twice (B's own doing): only the honest
    # pings and B's probes are held to once (Arena.bob_gets).
    bob.twice_allowed = True
    carol = await PyRuntime(stub, f"runtime://{A}/hp-carol", acked=True).connect()
    try:
        [al] = await alice.allocate(A)
        [bo] = await bob.allocate(A)
        # Carol speaks from the protected address (a route it learned): the policy keeps B away.
        await carol.send({"id": "c0", "type": "ping", "from": PROTECTED, "to": bo})
        assert (await bob.receive(10))["id"] == "c0"
        await hostile.hello(bob, bo)
        yield Arena(node, hostile, federation.a.bot, alice, bob, carol, al, bo)
    finally:
        for runtime in (alice, bob, carol):
            await runtime.close()
        await node.stop()


async def _a_pair_routes(arena: Arena, tag: str) -> None:
    await arena.alice.send({"id": tag, "type": "ping", "from": arena.al, "to": arena.bo})
    await arena.bob_gets("id", tag, 10)


async def _answer(arena: Arena, message_id: str) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while True:
            for found in await arena.b.answers(arena.a, arena.a_bot):
                if found.get("id") == message_id and found.get("type") == "response":
                    return found
            await asyncio.sleep(0.3)


def _sub(kind: str, resources: list[str], source: str | None = f"runtime://{B}/r1") -> str:
    body: dict[str, Any] = {"resources": resources}
    if source is not None:
        body["source"] = source
    return orjson.dumps(
        {
            "id": f"sub-{kind}-{os.urandom(4).hex()}",
            "type": kind,
            "from": f"domain://msg-node.{B}/sm",
            "to": f"domain://msg-node.{A}/sm",
            "body": body,
        }
    ).decode()


async def test_a_peer_subscribes_only_to_this_domains_streams_for_a_named_runtime(
    arena: Arena,
) -> None:
    """Rows 1 and 2: B asks for an A runtime's hyperty, runtimeURL, a third domain's address;
    A refuses, stores nothing and sends B nothing of A's local traffic. A stream is granted,
    for the B runtime named, and ends with it."""
    b, a = arena.b, arena.a
    for target in (arena.bo, arena.bob.runtime_url, "hyperty://c.mn.test/x"):
        text = _sub("subscribe", [target])
        await b.send([("bnode", b.n + 1, [f"domain://msg-node.{A}/sm"], text)])
        answer = await _answer(arena, orjson.loads(text)["id"])
        assert answer["body"]["code"] == 403, answer
    nameless = _sub("subscribe", [f"{arena.al}/changes"], source=None)
    await b.send([("bnode", b.n + 1, [f"domain://msg-node.{A}/sm"], nameless)])
    assert (await _answer(arena, orjson.loads(nameless)["id"]))["body"]["code"] == 400
    assert await a.core.remote_subscriptions.all() == []
    # A-local traffic to bob stays in A.
    assert a.monitor.receivers((arena.bo,), None).domains == frozenset()
    # A stream of A is granted to the named B runtime, and ends with it.
    stream = f"{arena.al}/changes"
    granted = _sub("subscribe", [stream])
    await b.send([("bnode", b.n + 1, [f"domain://msg-node.{A}/sm"], granted)])
    assert (await _answer(arena, orjson.loads(granted)["id"]))["body"]["code"] == 200
    assert a.monitor.receivers((stream,), None).domains == {B}
    assert await a.core.remote_subscriptions.all() == [(stream, B, f"runtime://{B}/r1")]
    left = orjson.dumps(
        {
            "id": "left",
            "type": "unsubscribe",
            "from": f"domain://msg-node.{B}/sm",
            "to": f"domain://msg-node.{A}/sm",
            "body": {"source": f"runtime://{B}/r1"},
        }
    ).decode()
    await b.send([("bnode", b.n + 1, [f"domain://msg-node.{A}/sm"], left)])
    assert (await _answer(arena, "left"))["body"]["code"] == 200
    assert a.monitor.receivers((stream,), None).domains == frozenset()
    assert await a.core.remote_subscriptions.all() == []


async def test_one_batch_of_subscriptions_never_exceeds_the_peers_quota(arena: Arena) -> None:
    """Issue 41 row 10: one event of B carries 30 subscriptions x 5 streams against a quota of
    20; they are judged side by side, yet A grants 4 and refuses 26 (429, counted), and holds
    20. Then each runtime leaves, with an unsubscription naming only itself."""
    b, a = arena.b, arena.a
    sm = f"domain://msg-node.{A}/sm"
    texts = [
        _sub(
            "subscribe",
            [f"comm://{A}/burst{i}-{k}/changes" for k in range(5)],
            source=f"runtime://{B}/burst{i}",
        )
        for i in range(30)
    ]
    await b.send([("bburst", 1 + i, [sm], t) for i, t in enumerate(texts)])
    codes = [(await _answer(arena, orjson.loads(t)["id"]))["body"]["code"] for t in texts]
    assert codes.count(200) == 4 and codes.count(429) == 26, codes
    assert len(await a.core.remote_subscriptions.all()) == PEER_SUBSCRIPTIONS
    refused = a.metrics.registry.get_sample_value(
        "rethink_mn_quota_refusals_total", {"quota": "peer_subscriptions"}
    )
    assert refused == 26
    leaving = [
        orjson.dumps(
            {
                "id": f"leave-{i}-{os.urandom(3).hex()}",
                "type": "unsubscribe",
                "from": f"domain://msg-node.{B}/sm",
                "to": sm,
                "body": {"source": f"runtime://{B}/burst{i}"},
            }
        ).decode()
        for i in range(30)
    ]
    await b.send([("bburst", 31 + i, [sm], t) for i, t in enumerate(leaving)])
    for t in leaving:
        assert (await _answer(arena, orjson.loads(t)["id"]))["body"]["code"] == 200
    assert await a.core.remote_subscriptions.all() == []


async def test_a_peers_numbers_never_touch_a_local_runtimes(arena: Arena) -> None:
    """Row 3: B reuses alice's sender id with the highest number: alice's messages still flow."""
    session = arena.a.sessions.by_runtime(arena.alice.runtime_url)
    assert session is not None and arena.alice.acked
    alice_origin = f"{session.key}.{arena.alice.stub_id}"
    text = arena.b.message(arena.bo, frm=f"hyperty://{B}/mallory")
    await arena.b.send([(alice_origin, carrier.MAX_NUMBER, [arena.bo], text)])
    assert (await arena.bob.receive(20))["from"] == f"hyperty://{B}/mallory"
    for i in range(3):
        await _a_pair_routes(arena, f"after-reuse-{i}")
    assert arena.a.delivery.marks.get(alice_origin, 0) < carrier.MAX_NUMBER


async def test_a_peers_message_goes_where_its_text_says_and_policy_holds(arena: Arena) -> None:
    """Row 4: the batch's destination list names carol's protected address, the text bob's:
    bob receives it, carol nothing; a message whose text names the protected address is
    refused by A's rule."""
    sneaky = arena.b.message(arena.bo, tag="sneaky")
    await arena.b.send([("bmallory", 1, [PROTECTED], sneaky)])
    got = await arena.bob.receive(20)
    assert got["body"]["tag"] == "sneaky"
    assert await arena.carol.nothing_within(1.0)
    direct = arena.b.message(PROTECTED, tag="direct")
    await arena.b.send([("bmallory", 2, [PROTECTED], direct)])
    refused = await _answer(arena, orjson.loads(direct)["id"])
    assert refused["body"]["code"] == 403
    assert await arena.carol.nothing_within(1.0)


async def test_a_peer_vouches_only_for_its_own_identities(arena: Arena) -> None:
    """Row 7: an asserted identity of A (or of an IdP not listed for B) arrives as not asserted;
    B's own users and the IdPs listed for it keep the assertion."""
    cases = {
        f"user://{A}/ceo": False,
        "user://gmail.com/ceo": False,
        f"user://{B}/bob": True,
        "user://idp.b/bob": True,
    }
    for i, (user, kept) in enumerate(cases.items()):
        text = arena.b.message(
            arena.bo,
            identity={"userProfile": {"userURL": user}},
            assertedIdentity=True,
            case=i,
        )
        await arena.b.send([("bmallory", 100 + i, [arena.bo], text)])
        got = await arena.bob.receive(20)
        assert got["body"]["case"] == i and got["body"]["assertedIdentity"] is kept, (user, got)


# -- the peer fuzzer -------------------------------------------------------------------------------

# Each example crosses federation: a third of the frame fuzzer's budget.
EXAMPLES = max(int(os.environ.get("RETHINK_FUZZ_EXAMPLES", "120")) // 3, 10)
# While the fuzzer runs, a gap in B's numbers (an event far ahead) is given up on after this
# long instead of 30 s: every example ends with B's next event reaching A's bob.
FUZZ_GAP_DEADLINE = 2.0
# An event number at the very end of the range would spend B's room for good (nothing can
# follow it): B's own loss, and the end of this room's fuzzing. The fuzzer's event numbers stop
# short of it; the numbers of the messages inside still reach the highest.
LAST_FUZZED_NUMBER = carrier.MAX_NUMBER - 10**6


def batch_contents(to: list[str]) -> st.SearchStrategy[Any]:
    """Lane batch contents a hostile peer can write (as canonical JSON, which is all a
    homeserver stores and federates): every field wrong in every way."""
    values = canonical_values
    number = st.one_of(
        st.sampled_from([n for n in CANONICAL_EDGES if n <= LAST_FUZZED_NUMBER]),
        st.integers(1, 10**6),
        text(8),
    )
    message = st.one_of(
        st.builds(
            lambda m: json.dumps(m),
            st.fixed_dictionaries(
                {
                    "id": json_values,
                    "type": st.sampled_from(["ping", "subscribe", "response", "read"]),
                    "from": st.sampled_from([f"hyperty://{B}/x", f"hyperty://{A}/x", "x"]),
                    "to": st.one_of(st.sampled_from(to), text(20)),
                },
                optional={"body": json_values},
            ),
        ),
        text(40),
    )
    entry = st.tuples(
        st.one_of(st.integers(0, 2), values),
        st.one_of(st.sampled_from(CANONICAL_EDGES), number),
        st.one_of(st.lists(st.sampled_from(to), max_size=3), values),
        st.one_of(message, values),
    ).map(list)
    sender = st.one_of(
        st.tuples(
            st.one_of(st.sampled_from(["bfuzz", "a" * 200]), text(20)),
            text(20),
            text(20),
        ).map(list),
        values,
    )
    return st.fixed_dictionaries(
        {"v": st.one_of(st.just(2), values)},
        optional={
            "n": number,
            "count": values,
            "senders": st.one_of(st.lists(sender, max_size=3), values),
            "messages": st.one_of(st.lists(entry, max_size=4), values),
            "media": values,
        },
    )


async def _b_next_event_reaches_bob(arena: Arena) -> None:
    """B's next event (numbered after everything B's room holds) is handled and its message
    reaches bob, whatever the example before it was: a feed that stalled or died fails here."""
    b = arena.b
    feed = arena.a.peer_feeds._feeds[b.room_id]  # type: ignore[union-attr]
    n = max(b.n, b.highest, feed.last_n) + 1
    tag = f"probe-{os.urandom(3).hex()}"
    await b.send([("bprobe", n, [arena.bo], b.message(arena.bo, tag=tag))], n=n)
    b.n = n
    try:
        await arena.bob_gets("tag", tag, FUZZ_GAP_DEADLINE + 60)
    except TimeoutError:
        raise AssertionError(
            f"B's event {n} never reached bob: A's feed at {feed.last_n}, "
            f"holding {sorted(feed._held)}"
        ) from None
    b.n = max(b.n, feed.last_n)


# Each example may wait out a gap (FUZZ_GAP_DEADLINE) and cross federation twice.
@pytest.mark.timeout(300 + 10 * EXAMPLES)
@seed(fuzz_seed())
@fuzz_settings(EXAMPLES)
@given(data=st.data())
async def test_no_batch_content_of_a_peer_fails_or_stalls_this_node(
    arena: Arena, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent by B's bot into its room for A, through both homeservers as a peer's events come:
    A handles it (or holds it, for a number ahead), keeps routing its own pair, keeps its
    checkpoints writable, and handles B's next event: after every example, whatever its
    numbering (a gap it leaves is given up on after FUZZ_GAP_DEADLINE)."""
    monkeypatch.setattr(peer_feed, "GAP_DEADLINE_SECONDS", FUZZ_GAP_DEADLINE)
    b = arena.b
    content = data.draw(batch_contents([arena.bo, arena.al, PROTECTED]), label="content")
    numbering = data.draw(st.sampled_from(["next", "stale", "ahead", "garbage"]), label="n")
    if numbering == "next":
        content["n"] = b.n + 1
    elif numbering == "stale":
        content["n"] = max(b.n - 1, 1)
    elif numbering == "ahead":
        content["n"] = b.n + 3
    try:
        await b.bot.send_event(b.room_id, carrier.BATCH_EVENT, content)
    except MatrixError as refused:
        assert refused.status == 400  # not canonical JSON: never reaches A
    else:
        # What A reads as its number, if any (0: none it can use).
        b.highest = max(b.highest, event_number(content))
    await _b_next_event_reaches_bob(arena)
    await _a_pair_routes(arena, f"fuzz-{os.urandom(3).hex()}")
    await arena.a.settlement.checkpoint()
    failed = arena.a.metrics.registry.get_sample_value(
        "rethink_mn_checkpoints_total", {"outcome": "failed"}
    )
    assert not failed, content


# Last: the heaviest federation traffic of the suite (a backlog of large events).
async def test_a_peer_cannot_hold_a_room_hostage(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows 5 and 6: events past a gap that is never filled are held within bounds, the gap is
    declared lost after its deadline and the room goes on; an event whose media does not exist
    is retried, skipped, and the feed goes on."""
    monkeypatch.setattr(peer_feed, "GAP_DEADLINE_SECONDS", 3.0)
    monkeypatch.setattr(peer_feed, "EVENT_RETRY_SECONDS", 2.0)
    monkeypatch.setattr(peer_feed, "MAX_HELD_BYTES", 512 * 1024)
    feed = arena.a.peer_feeds._feeds[arena.b.room_id]  # type: ignore[union-attr]
    b = arena.b
    # Numbers up to `highest` may be in the room already (a fuzzed event ahead): the gap is
    # made past them, or reading the room would fill it.
    b.n = max(b.n, b.highest)
    skipped = b.n + 1  # never sent
    b.n += 1
    filler = "x" * 40_000
    events = 30
    for i in range(events):
        await b.send([("bflood", 1000 + i, [arena.bo], b.message(arena.bo, tag=f"f{i}", f=filler))])
        assert feed.held_bytes <= 512 * 1024
    got = [m["body"]["tag"] for m in await arena.bob.receive_n(events, 60)]
    assert got == [f"f{i}" for i in range(events)]
    lost = arena.a.metrics.registry.get_sample_value(
        "rethink_mn_peer_events_total", {"outcome": "lost"}
    )
    assert lost is not None and lost >= 1, skipped
    # A batch in media that does not exist: retried, skipped; the next event is delivered.
    missing = {
        "v": carrier.LANE_FORMAT,
        "n": b.n + 1,
        "count": 1,
        "media": {
            "uri": f"mxc://{arena.a.config.homeserver.server_name}/nothing",
            "encoding": carrier.FRAMES,
        },
    }
    b.n += 1
    await b.bot.send_event(b.room_id, carrier.BATCH_EVENT, missing)
    await b.send([("bflood", 2000, [arena.bo], b.message(arena.bo, tag="after-media"))])
    assert (await arena.bob.receive(30))["body"]["tag"] == "after-media"
    await _a_pair_routes(arena, "after-hostage")


# After every other test: once B's bot has joined A's room to B, B's homeserver is slow to
# deliver new invitations to A (minutes), which the tests above make.
async def test_only_the_writer_sends_in_a_room_and_a_stray_event_is_not_fatal(
    arena: Arena, federation: Federation
) -> None:
    """Row 8: B's bot cannot post into A's room to B (power levels); pushed anyway beside a
    genuine event, the stray one is ignored and the genuine one delivered."""
    intent, room_a = await arena.a.rooms.to_peer(B, arena.b.bot.user_id)
    await arena.b.bot.join(room_a)
    with pytest.raises(MatrixError) as refused:
        await arena.b.bot.send_event(room_a, carrier.BATCH_EVENT, arena.b.content([], n=1))
    assert refused.value.status == 403
    stray = {
        "type": carrier.BATCH_EVENT,
        "room_id": room_a,
        "sender": arena.b.bot.user_id,
        "event_id": "$stray",
        "content": arena.b.content(
            [("bstray", 1, [arena.bo], arena.b.message(arena.bo, tag="stray"))], n=1
        ),
    }
    genuine_text = arena.b.message(arena.bo, tag="genuine")
    genuine = {
        "type": carrier.BATCH_EVENT,
        "room_id": arena.b.room_id,
        "sender": arena.b.bot.user_id,
        "event_id": "$genuine-" + os.urandom(4).hex(),
        "content": arena.b.content([("bgenuine", 1, [arena.bo], genuine_text)]),
    }
    async with (
        aiohttp.ClientSession() as http,
        http.put(
            f"http://127.0.0.1:{arena.a.appservice_port}/_matrix/app/v1/transactions/stray-{os.urandom(4).hex()}",
            json={"events": [stray, genuine]},
            headers={"Authorization": f"Bearer {federation.a.hs_token}"},
        ) as resp,
    ):
        assert resp.status == 200
    assert (await arena.bob.receive(20))["body"]["tag"] == "genuine"
    assert await arena.bob.nothing_within(1.0)
    del intent

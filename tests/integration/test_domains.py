"""Two reTHINK domains, each with its own node and Synapse, federating on loopback: the
trapezoid runtime A → node A → Matrix federation → node B → runtime B, end to end."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from adapter.node import Node
from adapter.storage import migrate

from ..conftest import Databases, FederatedHomeserver, Federation
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
A, B = "a.mn.test", "b.mn.test"


@dataclass
class Domains:
    a: Node
    b: Node

    def stub(self, node: Node) -> str:
        return f"ws://127.0.0.1:{node.stub_port}/stub/connect"


# Short, so that the test of a peer that stops confirming takes seconds.
MAX_HOLD = 0.5
WINDOW = 2


async def start(side: FederatedHomeserver, peer: FederatedHomeserver, databases: Databases) -> Node:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = Node(
        side.node_config(
            url,
            **{
                "federation.peers": {peer.domain: {"server_name": peer.server_name}},
                "federation.flow_window_events": WINDOW,
                "federation.flow_max_hold_seconds": MAX_HOLD,
            },
        )
    )
    await node.start()
    return node


@pytest_asyncio.fixture(loop_scope="session")
async def domains(federation: Federation, databases: Databases) -> AsyncIterator[Domains]:
    a = await start(federation.a, federation.b, databases)
    b = await start(federation.b, federation.a, databases)
    try:
        yield Domains(a, b)
    finally:
        await a.stop()
        await b.stop()


def ping(i: Any, frm: str, to: str) -> dict[str, Any]:
    return {"id": i, "type": "ping", "from": frm, "to": to, "body": {"n": i}}


async def test_a_message_and_its_answer_cross_domains(domains: Domains) -> None:
    alice = await PyRuntime(domains.stub(domains.a), f"runtime://{A}/x-alice", acked=True).connect()
    bob = await PyRuntime(domains.stub(domains.b), f"runtime://{B}/x-bob", acked=True).connect()
    try:
        [a] = await alice.allocate(A)
        [b] = await bob.allocate(B)
        await alice.send(ping("p1", a, b))
        got = await bob.receive(30)
        assert got["id"] == "p1" and got["from"] == a
        await bob.send({"id": "p1", "type": "response", "from": b, "to": a, "body": {"code": 200}})
        answer = await alice.receive(30)
        assert answer["type"] == "response" and answer["from"] == b
        # B measures how old A's events are when it handles them (A's homeserver's stamp to B
        # taking them). B's node may first catch up on what earlier tests left in the rooms
        # the two domains share, so only what it handles from here on is judged.
        ages = domains.b.metrics.registry
        count_name, sum_name = (
            "rethink_mn_peer_event_age_seconds_count",
            "rethink_mn_peer_event_age_seconds_sum",
        )
        handled_before = ages.get_sample_value(count_name) or 0.0
        total_before = ages.get_sample_value(sum_name) or 0.0
        exchange_started = time.monotonic()
        # Order per sender holds across domains, and everything is acknowledged at A.
        for i in range(50):
            await alice.send(ping(i, a, b))
        assert [m["id"] for m in await bob.receive_n(50, 30)] == list(range(50))
        async with asyncio.timeout(10):
            while alice.unacked:
                await asyncio.sleep(0.05)
        assert bob.duplicates == 0
        # Every event of the exchange was measured, and none is older than the exchange.
        handled = (ages.get_sample_value(count_name) or 0.0) - handled_before
        total = (ages.get_sample_value(sum_name) or 0.0) - total_before
        assert handled >= 1, handled
        assert 0 < total / handled <= time.monotonic() - exchange_started, (total, handled)
    finally:
        await alice.close()
        await bob.close()


async def test_unknown_address_in_b_is_answered_404_in_a_and_strangers_are_refused(
    domains: Domains,
) -> None:
    alice = await PyRuntime(domains.stub(domains.a), f"runtime://{A}/x-lost").connect()
    try:
        [a] = await alice.allocate(A)
        await alice.send(ping("nobody", a, f"hyperty://{B}/nobody-here"))
        answer = await alice.receive(30)
        assert answer["id"] == "nobody" and answer["body"]["code"] == 404
        await alice.send(ping("elsewhere", a, "hyperty://c.mn.test/someone"))
        refused = await alice.receive(10)
        assert refused["id"] == "elsewhere" and refused["body"]["code"] == 403
    finally:
        await alice.close()


async def test_b_serves_a_only_its_registry_reads_and_its_own_addresses(
    domains: Domains,
) -> None:
    alice = await PyRuntime(domains.stub(domains.a), f"runtime://{A}/x-guest").connect()
    bob = await PyRuntime(domains.stub(domains.b), f"runtime://{B}/x-host").connect()
    try:
        [a] = await alice.allocate(A)
        [b] = await bob.allocate(B)
        # B's address allocation is for B's runtimes: refused, answered across.
        allocation = f"domain://msg-node.{B}/hyperty-address-allocation"
        body = {"scheme": "hyperty", "value": {"number": 1}}
        await alice.send(
            {"id": "grab", "type": "create", "from": a, "to": allocation, "body": body}
        )
        refused = await alice.receive(30)
        assert refused["id"] == "grab" and refused["body"]["code"] == 403
        # A runtime of A speaking in the name of one of B's addresses is refused by its own
        # node (B's addresses are B's); Bob never sees it, the genuine message after it arrives.
        # (B's node drops such a message at its door too: test_hostile_peer.py.)
        await alice.send(ping("spoof", f"hyperty://{B}/not-alice", b))
        spoof = await alice.receive(10)
        assert spoof["id"] == "spoof" and spoof["body"]["code"] == 403, spoof
        await alice.send(ping("genuine", a, b))
        got = await bob.receive(30)
        assert got["id"] == "genuine"
    finally:
        await alice.close()
        await bob.close()


async def test_a_subscription_across_domains_gets_every_update_once_per_domain(
    domains: Domains,
) -> None:
    def runtime(node: Node, name: str, domain: str) -> PyRuntime:
        return PyRuntime(domains.stub(node), f"runtime://{domain}/x-{name}", acked=True)

    reporter = await runtime(domains.b, "reporter", B).connect()
    near = await runtime(domains.b, "near", B).connect()
    far = [await runtime(domains.a, f"far{i}", A).connect() for i in range(3)]
    try:
        [obj] = await reporter.allocate(B, scheme="comm", endpoint="address-allocation")
        changes = f"{obj}/changes"
        for observer, node_domain in ((near, B), *((f, A) for f in far)):
            answer = await observer.request(
                f"domain://msg-node.{node_domain}/sm", "subscribe", {"resources": [changes]}
            )
            assert answer["body"]["code"] == 200
        # Answered only once node B has recorded domain A: no wait needed before publishing.
        sent_before = domains.b.metrics.matrix_events_out.labels("inline")._value.get()
        await reporter.send({"id": "u1", "type": "update", "from": obj, "to": changes, "body": {}})
        for observer in (near, *far):
            assert (await observer.receive(30))["id"] == "u1"
        # One event in B's lane and one to domain A, whatever the number of observers there.
        sent = domains.b.metrics.matrix_events_out.labels("inline")._value.get() - sent_before
        assert sent <= 3  # (and at most one journal event)
        for observer in (near, *far):
            assert await observer.nothing_within(0.5)  # once: no second copy follows
            assert observer.duplicates == 0 and observer.delivered_twice == 0

        # All of A's observers leave: A tells B, and the next update stays in B.
        for observer in far:
            left = await observer.request(
                f"domain://msg-node.{A}/sm", "unsubscribe", {"resources": [changes]}
            )
            assert left["body"]["code"] == 200
        await asyncio.sleep(1.0)
        await reporter.send({"id": "u2", "type": "update", "from": obj, "to": changes, "body": {}})
        assert (await near.receive(30))["id"] == "u2"
        for observer in far:
            assert await observer.nothing_within(1.0)
    finally:
        for rt in (reporter, near, *far):
            await rt.close()


async def test_b_homeserver_restart_mid_stream_loses_nothing(
    domains: Domains, federation: Federation
) -> None:
    alice = await PyRuntime(
        domains.stub(domains.a), f"runtime://{A}/x-stream", acked=True
    ).connect()
    bob = await PyRuntime(domains.stub(domains.b), f"runtime://{B}/x-sink", acked=True).connect()
    try:
        [a] = await alice.allocate(A)
        [b] = await bob.allocate(B)
        total = 300

        async def stream() -> None:
            for i in range(total):
                await alice.send(ping(i, a, b))
                await asyncio.sleep(0.01)

        sending = asyncio.create_task(stream())
        first = [m["body"]["n"] for m in await bob.receive_n(30, 30)]
        await federation.b.process.stop_async()
        await asyncio.sleep(2.0)
        federation.b.process.start()
        await federation.b.process.wait_ready()
        await sending
        rest = [m["body"]["n"] for m in await bob.receive_n(total - 30, 90)]
        assert first + rest == list(range(total))
        assert await bob.nothing_within(1.0)
        assert bob.duplicates == 0 and bob.delivered_twice == 0
    finally:
        await alice.close()
        await bob.close()


async def test_a_far_side_that_falls_behind_gets_fewer_larger_events_and_everything(
    domains: Domains, federation: Federation
) -> None:
    """Flow control across domains: B's node confirms what it has handled (read receipts); when
    it stops (its homeserver frozen, as a far side far behind), A counts it as behind once the
    oldest event in flight is overdue (2 x (its floor + the confirmation interval)), then keeps
    at most WINDOW events unconfirmed and sends one event per MAX_HOLD, carrying everything
    that waited. When B comes back, every message arrives, in order, once."""
    alice = await PyRuntime(domains.stub(domains.a), f"runtime://{A}/x-fast", acked=True).connect()
    bob = await PyRuntime(domains.stub(domains.b), f"runtime://{B}/x-slow", acked=True).connect()
    b_synapse = federation.b.process.pid
    assert b_synapse is not None
    frozen = False
    try:
        [a] = await alice.allocate(A)
        [b] = await bob.allocate(B)
        assert domains.a.federation is not None
        link = await domains.a.federation.link(B)
        # Light load: every message its own event, confirmed by B's node.
        for i in range(5):
            await alice.send(ping(i, a, b))
            assert (await bob.receive(30))["body"]["n"] == i
        async with asyncio.timeout(15):
            while not link.pace.confirming or link.pace.in_flight:
                await asyncio.sleep(0.05)

        patience = link.pace.patience
        os.kill(b_synapse, signal.SIGSTOP)
        frozen = True
        before = link.pace.last_sent
        started = time.monotonic()
        # Long enough that most of it is sent after the silence is overdue.
        total = 5 + round(3 * patience / 0.01)
        for i in range(5, total):
            await alice.send(ping(i, a, b))
            await asyncio.sleep(0.01)
        async with asyncio.timeout(30):  # persisted on A's homeserver, paced
            while alice.unacked:
                await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
        events = link.pace.last_sent - before
        # Without flow control each of these messages left in an event of its own (A's
        # homeserver answers within milliseconds; they were sent 10 ms apart). With it, one
        # event per message only until the silence is overdue, then the window, then one event
        # per MAX_HOLD.
        overdue_within = patience / 0.01
        assert events <= overdue_within + WINDOW + elapsed / MAX_HOLD + 2, (events, elapsed)
        assert events < (total - 5) / 2, (events, elapsed)
        assert link.pace.behind
        held = domains.a.metrics.peer_paced.labels(B, "max_hold")._value.get()
        assert held >= 1

        os.kill(b_synapse, signal.SIGCONT)
        frozen = False
        got = [m["body"]["n"] for m in await bob.receive_n(total - 5, 60)]
        assert got == list(range(5, total))
        assert await bob.nothing_within(1.0) and bob.duplicates == 0
        # B confirms again: nothing is left unconfirmed, and a lone message leaves at once.
        async with asyncio.timeout(15):
            while link.pace.in_flight:
                await asyncio.sleep(0.05)
        await alice.send(ping(total, a, b))
        assert (await bob.receive(10))["body"]["n"] == total
    finally:
        if frozen:
            os.kill(b_synapse, signal.SIGCONT)
        await alice.close()
        await bob.close()


async def test_b_node_away_at_first_contact_gets_everything_when_back(
    domains: Domains,
) -> None:
    """B's node is down when A first writes to domain B, so B's bot has not joined A's room:
    A's runtime keeps sending (acknowledged once A's homeserver has it); when B's node is back it
    joins, reads what the room holds and delivers it all to Bob, in order, once."""
    alice = await PyRuntime(domains.stub(domains.a), f"runtime://{A}/x-early", acked=True).connect()
    bob = await PyRuntime(domains.stub(domains.b), f"runtime://{B}/x-late", acked=True).connect()
    restarted: Node | None = None
    try:
        [a] = await alice.allocate(A)
        [b] = await bob.allocate(B)
        config = domains.b.config
        await domains.b.stop()
        total = 40
        for i in range(total):
            await alice.send(ping(i, a, b))
        async with asyncio.timeout(30):  # durable on A's side (after its wait for B's join)
            while alice.unacked:
                await asyncio.sleep(0.1)
        restarted = Node(config)
        await restarted.start()
        bob.stub_url = domains.stub(restarted)
        await bob.connect()
        got = [m["body"]["n"] for m in await bob.receive_n(total, 60)]
        assert got == list(range(total))
        assert await bob.nothing_within(1.0)
        assert bob.duplicates == 0 and bob.delivered_twice == 0
    finally:
        await alice.close()
        await bob.close()
        if restarted is not None:
            await restarted.stop()


async def test_demo_page_across_domains(domains: Domains, chromium: str) -> None:
    """The demo with Bob in the other domain, in headless Chromium: Alice finds Bob in domain
    B's registry, follows his registration and pings him, all through federation."""
    from playwright.async_api import TimeoutError as PageTimeout

    from ..support.browser import chromium_browser

    peer = f"ws://127.0.0.1:{domains.b.stub_port}/stub/connect"
    url = f"http://127.0.0.1:{domains.a.stub_port}/demo?peer={peer}&peerDomain={B}"
    async with chromium_browser(chromium) as browser:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(url)
        try:
            await page.wait_for_selector("#result[data-pongs='1']", timeout=45_000)
        except PageTimeout:
            logs = await page.locator(".log li").all_inner_texts()
            result = await page.locator("#result").inner_text()
            raise AssertionError(f"{result}\n" + "\n".join(logs)) from None
        await page.click("#disconnect")
        await page.wait_for_selector(
            "#bob-registration[data-status='disconnected']", timeout=30_000
        )
        bob_log = await page.locator("#bob .log li").all_inner_texts()
        domains_shown = await page.locator(".domain").all_inner_texts()
    assert errors == []
    assert domains_shown == [A, B]
    assert any(f"registered as user://{B}/bob-" in line for line in bob_log)
    assert sum("← ping" in line for line in bob_log) == 1

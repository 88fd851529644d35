"""The decisions behind issue 41's bounds and shares: who a client is, a bound taken in one
step, which detached session goes first, a sender's share of what waits for a runtime, the
pacing of a connection, and a journal that keeps what took effect."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from adapter.bounds import Bound
from adapter.carrier import JournalEncoder
from adapter.clients import ClientKeys
from adapter.config import ConfigError, QuotaConfig, parse_config
from adapter.identity.model import Identity
from adapter.observability import NodeMetrics
from adapter.routing.journal import REQUEST_CUT, Journal
from adapter.routing.stream import BatchStream, StreamLimits
from adapter.sessions.eviction import EvictionOrder
from adapter.sessions.mailbox import (
    Mailbox,
    Parcel,
    Tally,
    Waiting,
    WaitingBounds,
    waiting_refusal,
)
from adapter.sessions.registry import SessionsFull
from adapter.stub.pacing import ClientPaces, Pace, TokenBucket
from tests.unit.sessions.test_session_bounds import Link, registry

# -- who a client is ----------------------------------------------------------------------------


def test_a_client_is_its_host_and_an_ipv6_host_its_64() -> None:
    keys = ClientKeys()
    assert keys.host("192.0.2.7", {}) == "ip:192.0.2.7"
    assert keys.host("2001:db8:1:2:aaaa::1", {}) == keys.host("2001:db8:1:2:bbbb::9", {})
    assert keys.host("2001:db8:1:2::1", {}) != keys.host("2001:db8:1:3::1", {})
    assert keys.host("::ffff:192.0.2.7", {}) == "ip:192.0.2.7"
    assert keys.host(None, {}) == "ip:unknown"


def test_a_forwarded_address_is_believed_only_from_a_trusted_proxy() -> None:
    forged = {"X-Forwarded-For": "203.0.113.5"}
    assert ClientKeys().host("192.0.2.7", forged) == "ip:192.0.2.7"
    proxied = ClientKeys(["10.0.0.0/8"])
    assert proxied.host("192.0.2.7", forged) == "ip:192.0.2.7"  # not a proxy: a claim
    assert proxied.host("10.1.1.1", forged) == "ip:203.0.113.5"
    # A chain: the nearest address that is not a trusted proxy, read from the right; what the
    # client wrote itself at the left is not believed.
    chain = {"X-Forwarded-For": "198.51.100.1, 203.0.113.5, 10.2.2.2"}
    assert proxied.host("10.1.1.1", chain) == "ip:203.0.113.5"
    rfc = {"Forwarded": 'for="[2001:db8::1]:4711";proto=https, for=10.3.3.3'}
    assert proxied.host("10.1.1.1", rfc) == keys_of("2001:db8::1")
    assert proxied.host("10.1.1.1", {"X-Forwarded-For": "unknown"}) == "ip:10.1.1.1"
    assert proxied.host("10.1.1.1", {}) == "ip:10.1.1.1"


def keys_of(address: str) -> str:
    return ClientKeys().host(address, {})


def test_a_verified_identity_is_the_client_wherever_it_connects_from() -> None:
    assert ClientKeys.of("ip:192.0.2.7", ("matrix", "@a:hs")) == "id:matrix:@a:hs"
    assert ClientKeys.of("ip:192.0.2.7", None) == "ip:192.0.2.7"


def test_trusted_proxies_must_be_addresses_or_networks() -> None:
    raw = {
        "domain": "d",
        "appservice": {"as_token": "a" * 16, "hs_token": "b" * 16},
        "stub": {"trusted_proxies": ["not-an-address"]},
    }
    with pytest.raises(ConfigError, match="trusted_proxies"):
        parse_config(raw, "test", environ={})
    with pytest.raises(ValueError, match="waiting_bytes_per_sender"):
        QuotaConfig(waiting_bytes=64 * 1024, waiting_bytes_per_sender=128 * 1024)
    assert QuotaConfig(waiting_bytes=64 * 1024).sender_share == 16 * 1024


# -- a bound ------------------------------------------------------------------------------------


def test_a_bound_refuses_a_client_beyond_its_share_and_anyone_beyond_the_total() -> None:
    refused: list[tuple[str, str]] = []
    bound = Bound("things", 2, 3, lambda r, s: refused.append((r, s)))
    assert bound.take("a") is None and bound.take("a") is None
    over = bound.take("a")
    assert over is not None and (over.code, over.scope) == (429, "client")
    assert bound.take("b") is None
    full = bound.take("c")
    assert full is not None and (full.code, full.scope) == (503, "total")
    assert refused == [("things", "client"), ("things", "total")]
    assert (bound.held("a"), bound.taken) == (2, 3)
    bound.give("a")
    assert bound.take("c") is None
    # Nothing is taken by a refusal, and a take of several is all or nothing.
    assert bound.take("b", 2) is not None and bound.held("b") == 1
    # A holder of no known client counts towards the total only.
    bound.give("c")
    assert bound.take("", 1) is None and bound.taken == 3


# -- which detached session goes first ------------------------------------------------------------


@dataclass
class Held:
    id: int
    used: bool = False
    client: str = "ip:192.0.2.1"


def test_eviction_takes_the_newest_unused_then_the_newest_used() -> None:
    detached = {i: Held(i, used=i in (1, 4)) for i in range(1, 7)}
    order = EvictionOrder(detached.get, lambda: len(detached))
    for held in detached.values():
        order.push(held)
    picked = []
    while (victim := order.pick()) is not None:
        picked.append(victim.id)
        del detached[victim.id]
    assert picked == [6, 5, 3, 2, 4, 1]


def test_eviction_skips_sessions_attached_again_or_used_since() -> None:
    detached = {i: Held(i) for i in range(1, 4)}
    order = EvictionOrder(detached.get, lambda: len(detached))
    for held in detached.values():
        order.push(held)
    del detached[3]  # attached again
    detached[2].used = True  # came back and went away again
    assert order.pick_unused() is detached[1]
    del detached[1]
    assert order.pick_unused() is None
    assert order.pick() is detached[2]


def test_eviction_takes_from_the_client_holding_the_most_sessions_first() -> None:
    """A flood of used sessions from one host never evicts a session of another host, even a
    newer one never used (found by the domain model: an away runtime that had not sent yet lost
    its session, and its runtimeURL, to a flood of sessions that each sent one request)."""
    flood, honest = "ip:198.51.100.66", "ip:192.0.2.1"
    detached = {i: Held(i, used=True, client=flood) for i in range(1, 9)}
    detached[9] = Held(9, used=False, client=honest)
    held = {flood: 8, honest: 1}
    order = EvictionOrder(detached.get, lambda: len(detached), lambda c: held.get(c, 0))
    for session in detached.values():
        order.push(session)
    picked = []
    while held[flood] > held[honest]:
        victim = order.pick()
        assert victim is not None
        picked.append(victim.id)
        del detached[victim.id]
        held[victim.client] -= 1  # released: its place given back
    assert picked == [8, 7, 6, 5, 4, 3, 2]


async def test_sessions_are_bounded_per_client_and_anonymous_ones_displace_none() -> None:
    sessions, evicted = registry()
    sessions._bound = Bound("sessions", 2, 3)
    first = await sessions.attach("runtime://d/1", Link(), None, None, client="ip:a")
    await sessions.attach("runtime://d/2", Link(), None, None, client="ip:a")
    with pytest.raises(SessionsFull) as refused:
        await sessions.attach("runtime://d/3", Link(), None, None, client="ip:a")
    assert refused.value.code == 429
    await sessions.detach(first)
    await sessions.attach("runtime://d/3", Link(), None, None, client="ip:b")
    with pytest.raises(SessionsFull) as full:
        await sessions.attach("runtime://d/4", Link(), None, None, client="ip:c")
    assert full.value.code == 503 and not evicted
    # One that proved an identity displaces the newest detached session never used.
    alice = Identity("@alice:hs", "hs", "matrix", authenticated=True)
    await sessions.attach("runtime://d/4", Link(), None, None, alice, client="id:matrix:alice")
    await asyncio.sleep(0.05)
    assert evicted == [1]
    assert sorted(s.runtime_url for s in sessions) == [f"runtime://d/{i}" for i in (2, 3, 4)]
    assert sessions._bound.taken == 3
    # A session coming back needs no new place; one released gives its place back.
    [two] = [s for s in sessions if s.runtime_url == "runtime://d/2"]
    await sessions.release(two)
    assert sessions._bound.held("ip:a") == 0 and sessions._bound.taken == 2


# -- a sender's share -------------------------------------------------------------------------


def test_a_sender_is_held_to_its_share_and_everyone_to_the_quota() -> None:
    bounds = WaitingBounds(per_runtime=100, per_sender=25, per_client=150, total=200)
    assert waiting_refusal(Waiting(0, 0), 10, bounds) is None
    share = waiting_refusal(Waiting(20, 20), 10, bounds)
    assert share is not None and share[0] == 413 and "sender" in share[1]
    assert waiting_refusal(Waiting(80, 0, 80, 80), 10, bounds) is None
    full = waiting_refusal(Waiting(95, 0, 95, 95), 10, bounds)
    assert full is not None and full[0] == 413 and "sender" not in full[1]
    client = waiting_refusal(Waiting(0, 0, 145, 145), 10, bounds)
    assert client is not None and client[0] == 413 and "client" in client[1]
    node = waiting_refusal(Waiting(0, 0, 0, 195), 10, bounds)
    assert node is not None and node[0] == 503


def test_a_mailbox_counts_what_waits_by_sender() -> None:
    mailbox = Mailbox(1, 0, lambda _m: None)
    tally = Tally()
    mailbox.join(tally, "ip:a")
    for origin, text in (("aaa.s1", "x" * 10), ("aaa.s2", "y" * 5), ("bbb.s1", "z" * 7)):
        mailbox._kept.append(mailbox._new_entry(0, Parcel(text, origin, 1), None))
    assert (mailbox.waiting_from("aaa"), mailbox.waiting_from("bbb")) == (15, 7)
    assert (tally.of("ip:a"), tally.total) == (22, 22)
    entries = mailbox.take_unstored(None)
    mailbox.stored(entries)
    assert mailbox.waiting_from("aaa") == 15  # stored still waits
    mailbox._forget_stored(entries[-1].dseq)
    assert (mailbox.waiting_from("aaa"), mailbox.waiting_from("bbb"), mailbox.waiting_bytes) == (
        0,
        0,
        0,
    )
    assert (tally.of("ip:a"), tally.total) == (0, 0)


# -- pacing ---------------------------------------------------------------------------------------


def test_a_connection_beyond_its_rate_waits_and_within_it_never_does() -> None:
    now = [0.0]
    bucket = TokenBucket(10, 5, lambda: now[0])
    assert [bucket.take(1) for _ in range(5)] == [0.0] * 5
    assert bucket.take(1) == pytest.approx(0.1)
    now[0] += 1.0
    assert bucket.take(1) == 0.0
    # An honest runtime: 5 messages a second of 10 kB, far below the defaults, never waits.
    now[0] = 0.0
    pace = Pace(1000, 20_000, 4 * 1024 * 1024, 128 * 1024 * 1024, lambda: now[0])
    waits = []
    for i in range(600):
        now[0] = i / 5
        waits.append(pace.take(10_000))
    assert max(waits) == 0.0
    # A flood of tiny frames is held to its rate once its burst is spent.
    flood = Pace(1000, 20_000, 0, 1024, lambda: 0.0)
    assert sum(flood.take(50) for _ in range(20_000)) == 0.0
    assert flood.take(50) == pytest.approx(0.001)


def test_the_connections_of_one_client_share_its_rate_and_its_pace_rests_after_the_last() -> None:
    now = [0.0]
    paces = ClientPaces(10, 5, 0, 1024, lambda: now[0])
    first, second = paces.join("10.9.9.9"), paces.join("10.9.9.9")
    other = paces.join("10.8.8.8")
    assert len(paces) == 2
    # Each connection sends three frames (within any rate of its own): the client's burst of
    # five is spent by both together, and the sixth frame waits.
    assert [first.take(1) for _ in range(3)] == [0.0] * 3
    assert [second.take(1) for _ in range(2)] == [0.0] * 2
    assert second.take(1) == pytest.approx(0.1)
    # Another client meanwhile has its whole burst.
    assert [other.take(1) for _ in range(5)] == [0.0] * 5
    # A client's pace is kept while any of its connections is open, and after the last until
    # it has rested (its buckets full again), then dropped.
    paces.leave("10.9.9.9")
    assert paces.join("10.9.9.9") is first
    paces.leave("10.9.9.9")
    paces.leave("10.9.9.9")
    paces.leave("10.8.8.8")
    assert len(paces) == 2
    # Connecting again before then is no fresh burst: the sixth frame still waits.
    again = paces.join("10.9.9.9")
    assert again is first and again.take(1) == pytest.approx(0.2)
    paces.leave("10.9.9.9")
    paces.leave("10.8.8.8")  # a second leave of a gone client changes nothing
    assert len(paces) == 2
    # 10.8.8.8 is full again at 0.5 s, 10.9.9.9 (seven frames short of its burst) at 0.7 s.
    now[0] = 0.6
    paces.join("10.7.7.7")
    assert len(paces) == 2  # 10.7.7.7 and 10.9.9.9
    paces.leave("10.7.7.7")  # a client that never sent leaves nothing behind
    assert len(paces) == 1
    now[0] = 0.7
    assert paces.join("10.9.9.9") is not first
    paces.leave("10.9.9.9")
    assert len(paces) == 0


# -- a journal that keeps what took effect ---------------------------------------------------


async def test_a_full_journal_keeps_every_entry_and_holds_its_producers() -> None:
    async def target(refresh: bool) -> tuple[object, str]:
        raise AssertionError("not reached in this test")

    metrics = NodeMetrics(CollectorRegistry())
    stream: BatchStream[bytes] = BatchStream(
        "journal",
        JournalEncoder(),
        dict,
        target,
        metrics,
        StreamLimits(max_queued_bytes=1024),
        background=True,
        ready=asyncio.Event(),  # the homeserver away: nothing leaves
        drop_when_full=False,
    )
    journal = Journal(stream)
    for i in range(50):
        journal.rejected(f"runtime://d/{i}", "x" * 40, "refused")
    assert metrics.registry.get_sample_value(
        "rethink_mn_stream_items_dropped_total", {"stream": "journal"}
    ) in (None, 0.0)
    assert stream.queued_bytes > 1024
    # The stub endpoint reads no frame meanwhile.
    assert await journal.room(0.01) is False
    await stream.close()


class Recording:
    """A journal stream that keeps what is pushed."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def push(self, item: bytes) -> None:
        self.entries.append(orjson.loads(item))


def test_a_service_request_of_a_megabyte_is_kept_as_its_header_and_size() -> None:
    recording = Recording()
    journal = Journal(recording)  # type: ignore[arg-type]
    header = {"id": 7, "type": "read", "from": "runtime://d/r", "to": "domain://msg-node.d/x"}
    huge = orjson.dumps({**header, "body": {"value": "x" * 1_000_000}}).decode()
    journal.service("runtime://d/r", huge, '{"body":{"code":404}}')
    small = orjson.dumps({**header, "body": {"value": "x" * 100}}).decode()
    journal.service("runtime://d/r", small, '{"body":{"code":200}}')
    cut, whole = (entry["request"] for entry in recording.entries)
    assert orjson.loads(cut) == {**header, "body": {"cut": len(huge)}}
    assert whole == small
    # Not JSON at all: its first characters, as a refused request's are kept.
    journal.service("runtime://d/r", "y" * 1_000_000, "{}")
    assert len(recording.entries[-1]["request"]) == REQUEST_CUT

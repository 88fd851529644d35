"""The routing core with fakes around it: what the ingress decides, what delivery does with a
lane event, how settlement moves a lane's position, and how a stub's numbered messages become
acknowledgeable. No homeserver, no database: the fast inner loop (make test-fast)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from adapter.access import AccessMonitor
from adapter.bounds import Bound, SessionShares
from adapter.carrier import Routed
from adapter.config import PolicyConfig, PolicyRule, QuotaConfig
from adapter.envelope import Message
from adapter.identity.model import Identity
from adapter.observability import NodeMetrics
from adapter.routing.delivery import Delivery
from adapter.routing.ingress import Ingress, ServiceDirectory
from adapter.routing.journal import Journal
from adapter.routing.lanes import Outgoing
from adapter.routing.marks import SenderMarks
from adapter.routing.policy import MessageGate
from adapter.routing.settlement import LaneLedger, Settlement
from adapter.routing_table import RoutingTable
from adapter.services.base import Requester, ServiceReply
from adapter.sessions.mailbox import Mailbox, Parcel, Waiting, WaitingBounds
from adapter.sessions.session import Attachment, Session
from adapter.sessions.upstream import Pending, Upstream
from adapter.stub.protocol import BadHello, parse_hello, split_numbered
from tests.unit.sessions.test_mailbox import FakeLink, MemoryStore

D = "mn.test"


def metrics() -> NodeMetrics:
    return NodeMetrics(CollectorRegistry())


class Sessions:
    """The registry's lookups, over sessions made by hand."""

    def __init__(self) -> None:
        self._by_id: dict[int, Session] = {}

    def add(self, session_id: int, table: RoutingTable) -> Session:
        session = Session(
            session_id,
            f"{session_id:016x}",
            f"runtime://{D}/{session_id}",
            f"@_rethink_{session_id}:hs",
            Mailbox(session_id, 1, lambda _m: None),
            1,
        )
        self._by_id[session_id] = session
        table.add_runtime(session_id, session.runtime_url)
        return session

    def get(self, session_id: int) -> Session | None:
        return self._by_id.get(session_id)

    def by_origin(self, origin: str) -> Session | None:
        key = origin.split(".", 1)[0]
        return next((s for s in self._by_id.values() if s.key == key), None)


async def attached(session: Session, acking: bool = False) -> FakeLink:
    link = FakeLink()
    session.mailbox.attach(link, acking)
    await session.mailbox.resume(MemoryStore(), 0)
    return link


def routed(session: Session, n: int, to: str, origin: str | None = None) -> Routed:
    text = orjson.dumps({"id": n, "type": "update", "from": "hyperty://d/x", "to": to}).decode()
    return Routed(text, (to,), session.sender(origin or f"{session.key}.s"), n)


# -- delivery -----------------------------------------------------------------------------------


def delivering(
    table: RoutingTable, sessions: Sessions, marks: SenderMarks | None = None
) -> Delivery:
    return Delivery(
        AccessMonitor("d", table),
        sessions,  # type: ignore[arg-type]
        Journal(None),
        metrics(),
        marks or SenderMarks(),
    )


async def test_delivery_fans_out_drops_what_was_routed_before_and_seals_the_event() -> None:
    table = RoutingTable()
    sessions = Sessions()
    sender, sub1, sub2 = (sessions.add(i, table) for i in (1, 2, 3))
    table.subscribe(2, ["comm://o/changes"])
    table.subscribe(3, ["comm://o/changes"])
    links = [await attached(sub1), await attached(sub2)]
    delivery = delivering(table, sessions)
    ledger = LaneLedger("!lane")
    ticket = ledger.open("$e1")
    await delivery.deliver([routed(sender, 1, "comm://o/changes")], ticket)
    assert [len(link.frames) for link in links] == [1, 1]
    assert ticket.sealed and ticket.settled  # plain stubs have it once written
    assert delivery.routed_through(f"{sender.key}.s") == 1

    # The same message carried again (a resend before a crash) reaches nobody.
    again = ledger.open("$e2")
    await delivery.deliver([routed(sender, 1, "comm://o/changes")], again)
    assert [len(link.frames) for link in links] == [1, 1]


async def test_a_delivery_to_an_acknowledging_stub_holds_the_event_until_acknowledged() -> None:
    table = RoutingTable()
    sessions = Sessions()
    sender, receiver = sessions.add(1, table), sessions.add(2, table)
    table.add_allocations(2, ["hyperty://d/r"], None)
    link = await attached(receiver, acking=True)
    delivery = delivering(table, sessions)
    ledger = LaneLedger("!lane")
    ticket = ledger.open("$e1")
    await delivery.deliver([routed(sender, 5, "hyperty://d/r")], ticket)
    marks = SenderMarks()
    assert ledger.advance(marks) is None  # not acknowledged yet
    assert marks.settled == {}
    receiver.mailbox.on_ack(link.numbers()[0])
    assert ledger.advance(marks) == "$e1"
    assert marks.settled == {f"{sender.key}.s": 5}
    assert marks.due() == ({f"{sender.key}.s": 5}, [])


async def test_a_delivery_that_fails_midway_is_delivered_again_from_where_it_failed() -> None:
    """Defect: a failure sealed the event with its later messages skipped, the position moving
    past them. Now the lane tries the event again; what was handed on is not handed on twice."""
    table = RoutingTable()
    sessions = Sessions()
    sender, receiver = sessions.add(1, table), sessions.add(2, table)
    table.add_allocations(2, ["hyperty://d/r"], None)
    link = await attached(receiver)
    delivery = delivering(table, sessions)
    deliver = receiver.mailbox.deliver
    calls = {"n": 0}

    async def failing_second(parcel: Parcel, ticket: object = None) -> str:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("the database went away while keeping it")
        return await deliver(parcel, ticket)  # type: ignore[arg-type]

    receiver.mailbox.deliver = failing_second  # type: ignore[method-assign]
    event = [routed(sender, n, "hyperty://d/r") for n in (1, 2, 3)]
    ticket = LaneLedger("!lane").open("$e1")
    with pytest.raises(ConnectionError):
        await delivery.deliver(event, ticket)
    await delivery.deliver(event, ticket)  # the lane's retry
    assert [m["id"] for m in link.messages()] == [1, 2, 3]  # type: ignore[index]


async def test_a_destination_gone_before_delivery_is_answered_to_its_sender() -> None:
    """The receiver disconnected between the sender's message being taken (acknowledged) and
    its delivery: the sender hears 404, as it would have a moment earlier, instead of nothing.
    A stream without subscribers is no error."""
    table = RoutingTable()
    sessions = Sessions()
    sender = sessions.add(1, table)
    table.add_allocations(1, ["comm://d/o"], None)
    link = await attached(sender)
    delivery = delivering(table, sessions)
    await delivery.deliver([routed(sender, 1, "runtime://d/gone")], None)
    [answer] = link.messages()
    assert answer["id"] == 1 and answer["body"]["code"] == 404  # type: ignore[index]
    await delivery.deliver([routed(sender, 2, "comm://d/o/changes")], None)
    assert len(link.messages()) == 1


async def test_what_a_released_session_had_not_received_is_answered_to_its_senders() -> None:
    """The receiver left (disconnect) with routed messages sent to it and not acknowledged:
    each sender still attached hears 404; a sender that left too hears nothing."""
    table = RoutingTable()
    sessions = Sessions()
    sender, gone = sessions.add(1, table), sessions.add(2, table)
    link = await attached(sender)
    gone.released = True
    delivery = delivering(table, sessions)
    parcels = [
        Parcel(routed(sender, 7, "hyperty://d/r").text, f"{sender.key}.s", 7),
        Parcel(routed(gone, 8, "hyperty://d/r").text, f"{gone.key}.s", 8),
    ]
    await delivery.unreceived(parcels)
    [answer] = link.messages()
    assert answer["id"] == 7 and answer["body"]["code"] == 404  # type: ignore[index]


# -- settlement ---------------------------------------------------------------------------------


class FakeCheckpoints:
    def __init__(self) -> None:
        self.commits: list[tuple[Any, ...]] = []
        self.fail = False

    async def commit(
        self,
        kept: Sequence[tuple[int, Sequence[Any]]],
        deletes: Sequence[tuple[int, int]],
        positions: Mapping[str, str],
        marks: Mapping[str, int],
        dropped: Sequence[str] = (),
    ) -> None:
        if self.fail:
            raise ConnectionError("database down")
        self.commits.append(
            (
                [(sid, [e.dseq for e in entries]) for sid, entries in kept],
                list(deletes),
                dict(positions),
                dict(marks),
                list(dropped),
            )
        )


async def test_a_checkpoint_stores_what_is_kept_and_moves_positions_past_settled_events() -> None:
    store = FakeCheckpoints()
    marks = SenderMarks()
    settlement = Settlement(store, metrics(), marks)  # type: ignore[arg-type]
    box = Mailbox(9, 1, settlement.mailbox_dirty)
    ledger = settlement.ledger("!lane")
    t1, t2 = ledger.open("$1"), ledger.open("$2")
    marks.route("o.s", 4, t1)
    await box.deliver(routed_parcel(), t1)  # kept: the runtime is away
    t1.seal()
    t2.seal()
    await settlement.checkpoint()
    [(session_id, [dseq])] = store.commits[0][0]
    assert session_id == 9 and dseq == (1 << 32) + 1
    # The position waits for $1 (not stored when the checkpoint began) even though $2 is settled.
    assert store.commits[0][2] == {}
    await settlement.checkpoint()
    # Once stored, $1 is settled: the position moves past both events, with $1's mark.
    positions = {k: v for c in store.commits for k, v in c[2].items()}
    marks = {k: v for c in store.commits for k, v in c[3].items()}
    assert positions == {"!lane": "$2"} and marks == {"o.s": 4}


async def test_a_failed_checkpoint_keeps_everything_for_the_next() -> None:
    store = FakeCheckpoints()
    settlement = Settlement(store, metrics(), SenderMarks())  # type: ignore[arg-type]
    box = Mailbox(9, 1, settlement.mailbox_dirty)
    ticket = settlement.ledger("!lane").open("$1")
    ticket.seal()
    await box.deliver(routed_parcel(), ticket)
    store.fail = True
    with pytest.raises(ConnectionError):
        await settlement.checkpoint()
    assert ticket.pending == 1
    store.fail = False
    await settlement.checkpoint()
    await settlement.checkpoint()
    assert ticket.pending == 0
    assert any(c[2] == {"!lane": "$1"} for c in store.commits)


async def test_a_senders_marks_move_at_delivery_and_settle_with_their_lanes_position() -> None:
    """Delivery and settlement share one SenderMarks: delivery's mark moves as the message is
    handed on (a resend is dropped at once); the mark a restart would read moves, and is
    stored, once the event is settled and its lane's position moves past it."""
    table = RoutingTable()
    sessions = Sessions()
    sender, receiver = sessions.add(1, table), sessions.add(2, table)
    table.add_allocations(2, ["hyperty://d/r"], None)
    link = await attached(receiver, acking=True)
    marks = SenderMarks()
    store = FakeCheckpoints()
    settlement = Settlement(store, metrics(), marks)  # type: ignore[arg-type]
    delivery = delivering(table, sessions, marks)
    origin = f"{sender.key}.s"
    ticket = settlement.ledger("!lane").open("$e1")
    await delivery.deliver([routed(sender, 3, "hyperty://d/r")], ticket)
    await delivery.deliver([routed(sender, 3, "hyperty://d/r")], None)  # carried twice
    assert len(link.frames) == 1
    assert delivery.routed_through(origin) == 3 and ticket.marks == {origin: 3}
    await settlement.checkpoint()
    assert marks.settled == {} and store.commits == []  # not acknowledged: not settled
    receiver.mailbox.on_ack(link.numbers()[0])
    await settlement.checkpoint()
    assert marks.settled == {origin: 3}
    assert store.commits[-1][2:4] == ({"!lane": "$e1"}, {origin: 3})
    assert marks.due() == ({}, [])  # stored: not written again


async def test_restored_marks_are_routed_and_settled_alike() -> None:
    """At a start the stored marks are what was routed too: delivery drops what they cover,
    and nothing is due until a later event settles."""
    table = RoutingTable()
    sessions = Sessions()
    sender, receiver = sessions.add(1, table), sessions.add(2, table)
    table.add_allocations(2, ["hyperty://d/r"], None)
    link = await attached(receiver)
    origin = f"{sender.key}.s"
    marks = SenderMarks()
    marks.restore({origin: 5})
    settlement = Settlement(FakeCheckpoints(), metrics(), marks)  # type: ignore[arg-type]
    delivery = delivering(table, sessions, marks)
    ticket = settlement.ledger("!lane").open("$e1")
    event = [routed(sender, n, "hyperty://d/r") for n in (5, 6)]
    await delivery.deliver(event, ticket)
    assert [m["id"] for m in link.messages()] == [6]  # type: ignore[index]
    assert marks.settled == {origin: 5} and marks.due() == ({}, [])
    await settlement.checkpoint()
    assert marks.settled == {origin: 6}


async def test_marks_let_go_leave_routed_settled_open_events_and_the_table() -> None:
    """An origin let go loses every mark it has: routed, settled, its share of the events
    still open (that settle later without it), and its row at the next checkpoint. A lane's
    ``drop`` touches only the lanes named; ``let_go`` every lane."""
    store = FakeCheckpoints()
    marks = SenderMarks()
    settlement = Settlement(store, metrics(), marks)  # type: ignore[arg-type]
    done, open_a, open_b = (
        settlement.ledger(room).open(f"$in{room}") for room in ("!a", "!a", "!b")
    )
    marks.route("gone.s", 4, done)
    marks.route("kept.s", 1, done)
    done.seal()
    await settlement.checkpoint()
    marks.route("gone.s", 5, open_a)
    marks.route("gone.s", 6, open_b)
    marks.route("kept.s", 2, open_a)

    settlement.drop(["gone.s"], ["!a"])
    assert marks.routed == {"kept.s": 2} and marks.settled == {"kept.s": 1}
    assert open_a.marks == {"kept.s": 2} and open_b.marks == {"gone.s": 6}
    settlement.let_go(["gone.s"])
    assert open_b.marks == {}
    open_a.seal()
    open_b.seal()
    await settlement.checkpoint()
    assert store.commits[-1][3:] == ({"kept.s": 2}, ["gone.s"])
    assert marks.settled == {"kept.s": 2} and marks.due() == ({}, [])


def routed_parcel() -> Any:
    from adapter.sessions.mailbox import Parcel

    return Parcel('{"id":1}', "o.s", 1)


# -- upstream -----------------------------------------------------------------------------------


def test_acknowledgements_are_cumulative_over_messages_done_out_of_order() -> None:
    told: list[int] = []
    upstream = Upstream("k.s", lambda up: told.append(up.acked))
    p1, p2, p3 = (upstream.take(n) for n in (1, 2, 3))
    assert upstream.take(2) is None  # a resend
    assert p1 and p2 and p3
    upstream.done(p2)  # an MN service answered message 2 first
    assert upstream.acked == 0 and told == []
    upstream.done(p1)  # message 1's event is persisted
    assert upstream.acked == 2 and told == [2]
    upstream.done(p3)
    assert told == [2, 3]


def test_a_number_given_back_again_counts_its_times_and_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(f"{Upstream.__module__}.time", SimpleNamespace(monotonic=lambda: clock[0]))
    upstream = Upstream("k.s", lambda up: None)
    pending = upstream.take(1)
    assert pending is not None
    assert upstream.give_back(pending)[0] == 1
    again = upstream.take(1)  # its resend after the reconnect is taken again
    assert again is not None
    clock[0] += 2.5
    times, seconds = upstream.give_back(again)
    assert times == 2 and seconds == 2.5
    other = upstream.take(1)
    assert other is not None and upstream.take(2) is not None
    assert upstream.give_back(Pending(2))[0] == 1  # another number starts over


# -- ingress ------------------------------------------------------------------------------------


class Outbox:
    def __init__(self, room: bool = True) -> None:
        self.items: list[Outgoing] = []
        self.room = room

    def has_room_for(self, size: int) -> bool:
        return self.room

    async def wait_for_room(self, size: int, timeout: float) -> bool:
        return self.room

    def push(self, item: Outgoing) -> None:
        self.items.append(item)


class Outboxes:
    def __init__(self) -> None:
        self.outbox = Outbox()

    def for_session(self, session: Session) -> Outbox:
        return self.outbox

    def for_node(self) -> Outbox:
        return self.outbox


class Routes:
    async def learn(self, session_id: int, address: str) -> None:
        pass


class EchoService:
    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        return ServiceReply(200, value={"runtime": requester.runtime_url})


def ingress_for(
    table: RoutingTable,
    outboxes: Outboxes,
    marks: dict[str, int],
    rules: Sequence[PolicyRule] = (),
    quotas: QuotaConfig | None = None,
    waiting: dict[int, int] | None = None,
    learned: SessionShares | None = None,
) -> Ingress:
    services = ServiceDirectory(D)
    services.add_endpoint("echo", EchoService())
    return Ingress(
        table,
        AccessMonitor(D, table),
        services,
        outboxes,
        Journal(None),
        Routes(),  # type: ignore[arg-type]
        MessageGate(PolicyConfig(rules=list(rules))),
        lambda origin: marks.get(origin, 0),
        metrics(),
        quotas or QuotaConfig(),
        lambda session_id, _sender: Waiting((waiting or {}).get(session_id, 0), 0),
        WaitingBounds.of(quotas or QuotaConfig()),
        backpressure_timeout=0.01,
        learned=learned,
    )


def frame(n: Any, to: str, frm: str = "hyperty://mn.test/a", type_: str = "ping") -> str:
    return orjson.dumps({"id": n, "type": type_, "from": frm, "to": to}).decode()


async def decide(
    ingress: Ingress, attachment: Attachment, text: str, seq: int | None = None
) -> None:
    pending = attachment.upstream.take(seq) if attachment.upstream and seq is not None else None
    await ingress.on_message(attachment, text, orjson.loads(text), pending)


async def test_the_ingress_serves_routes_and_refuses() -> None:
    table = RoutingTable()
    sessions = Sessions()
    me, peer = sessions.add(1, table), sessions.add(2, table)
    table.add_allocations(1, ["hyperty://mn.test/a"], None)
    table.add_allocations(2, ["hyperty://mn.test/b"], None)
    link = await attached(me)
    outboxes = Outboxes()
    ingress = ingress_for(table, outboxes, {}, [PolicyRule(type="forbidden", action="deny")])
    attachment = Attachment(me, link, None, False)

    await decide(ingress, attachment, frame(1, f"domain://msg-node.{D}/echo", type_="read"))
    await decide(ingress, attachment, frame(2, "hyperty://mn.test/b"))
    await decide(ingress, attachment, frame(3, "hyperty://mn.test/nobody"))
    await decide(ingress, attachment, frame(4, "hyperty://mn.test/b", type_="forbidden"))
    await decide(ingress, attachment, frame(5, "hyperty://mn.test/b", frm="hyperty://mn.test/b"))

    answers = {m["id"]: m["body"]["code"] for m in link.messages()}  # type: ignore[index]
    assert answers == {1: 200, 3: 404, 4: 403, 5: 403}
    [item] = outboxes.outbox.items
    assert item.routed.to == ("hyperty://mn.test/b",)
    assert item.routed.sender.runtime == me.runtime_url
    assert peer.mailbox.in_flight == 0


async def test_numbered_messages_are_done_when_answered_or_carried_and_resends_skipped() -> None:
    table = RoutingTable()
    sessions = Sessions()
    me = sessions.add(1, table)
    sessions.add(2, table)
    table.add_allocations(1, ["hyperty://mn.test/a"], None)
    table.add_allocations(2, ["hyperty://mn.test/b"], None)
    link = await attached(me, acking=True)
    acks: list[int] = []
    upstream, _ = me.upstream_for("stubA", lambda up: acks.append(up.acked))
    attachment = Attachment(me, link, upstream, False)
    outboxes = Outboxes()
    marks = {upstream.origin: 3}  # messages up to 3 were carried before a restart
    ingress = ingress_for(table, outboxes, marks)

    await decide(ingress, attachment, frame(1, "hyperty://mn.test/b"), seq=3)  # a resend
    assert acks == [3] and outboxes.outbox.items == []
    await decide(ingress, attachment, frame(2, "hyperty://mn.test/b"), seq=4)
    await decide(ingress, attachment, frame(3, f"domain://msg-node.{D}/echo"), seq=5)
    assert acks == [3], "not durable until its event is persisted"
    [item] = outboxes.outbox.items
    assert item.routed.oseq == 4 and item.routed.sender.origin == upstream.origin
    item.done()  # the lane's event is persisted
    assert acks == [3, 4], "5's answer lives only in the node's memory: not durable yet"
    me.mailbox.on_ack(2**53)  # the stub acknowledges the answer it received
    assert acks == [3, 4, 5]


async def test_a_plain_stub_is_refused_with_503_when_the_homeserver_cannot_take_more() -> None:
    table = RoutingTable()
    sessions = Sessions()
    me = sessions.add(1, table)
    sessions.add(2, table)
    table.add_allocations(1, ["hyperty://mn.test/a"], None)
    table.add_allocations(2, ["hyperty://mn.test/b"], None)
    link = await attached(me)
    outboxes = Outboxes()
    outboxes.outbox.room = False
    await decide(
        ingress_for(table, outboxes, {}),
        Attachment(me, link, None, False),
        frame(1, "hyperty://mn.test/b"),
    )
    [answer] = link.messages()
    assert answer["body"]["code"] == 503  # type: ignore[index]


# -- the stub protocol's frames -----------------------------------------------------------------


def test_numbered_frames_keep_the_message_text_exactly() -> None:
    text = '{"id":1,"type":"x","from":"a","to":"b","body":{"f":1.50,"s":"é, ]"}}'
    assert split_numbered(f"[12,{text}]") == (12, text)
    assert split_numbered('[12 , {"a":1}]') == (12, ' {"a":1}')
    assert split_numbered('["x",{}]') is None
    assert split_numbered("[1,2,3") is None


def test_hello_offers_are_checked() -> None:
    hello = parse_hello({"v": 1, "stub": "abcdEFGH12", "received": 5})
    assert hello is not None and (hello.stub, hello.received) == ("abcdEFGH12", 5)
    assert parse_hello({"v": 2, "stub": "abcdEFGH12"}) is None  # a version this node lacks
    assert parse_hello(None) is None
    for bad in ({"v": 1, "stub": "short"}, {"v": 1, "stub": "abcdEFGH12", "received": -1}, "x"):
        try:
            parse_hello(bad)
        except BadHello:
            continue
        raise AssertionError(f"accepted {bad!r}")


# -- who may do what -----------------------------------------------------------------------------


async def ingress_and_me(**options: Any) -> tuple[Ingress, Session, FakeLink, Outboxes]:
    table = RoutingTable()
    sessions = Sessions()
    me = sessions.add(1, table)
    sessions.add(2, table)
    table.add_allocations(1, ["hyperty://mn.test/a"], None)
    table.add_allocations(2, ["hyperty://mn.test/b"], None)
    outboxes = Outboxes()
    return ingress_for(table, outboxes, {}, **options), me, await attached(me), outboxes


def body_message(body: Any, frm: str = "hyperty://mn.test/a") -> str:
    return orjson.dumps(
        {"id": 9, "type": "invite", "from": frm, "to": "hyperty://mn.test/b", "body": body}
    ).decode()


async def test_nobody_sends_from_the_nodes_own_addresses() -> None:
    ingress, me, link, outboxes = await ingress_and_me()
    attachment = Attachment(me, link, None, False)
    for forged in (
        f"domain://msg-node.{D}/sm",
        f"domain://registry.{D}/",
        "global://registry/",
        f"domain://idm.{D}",
    ):
        await decide(ingress, attachment, frame(forged, "hyperty://mn.test/b", frm=forged))
    assert [m["body"]["code"] for m in link.messages()] == [403] * 4  # type: ignore[index]
    assert outboxes.outbox.items == []


async def test_identity_assertions_are_checked_against_the_proven_identity() -> None:
    ingress, me, link, outboxes = await ingress_and_me()
    me.identity = Identity("@alice:hs", "hs", "matrix", True, username="@alice:hs")
    attachment = Attachment(me, link, None, False)
    alice = {"userProfile": {"userURL": "user://hs/alice"}}
    exact = body_message({"identity": alice, "f": 0}).replace('"f":0', '"f":1.50')
    await decide(ingress, attachment, exact)
    await decide(
        ingress,
        attachment,
        body_message({"identity": {"userProfile": {"userURL": "user://hs/mallory"}}}),
    )
    await decide(ingress, attachment, body_message({"x": 1}))
    [refused] = link.messages()
    assert refused["body"]["code"] == 403  # type: ignore[index]
    matched, attached_identity = (item.routed.text for item in outboxes.outbox.items)
    assert '"f":1.50' in matched  # the rest of the text is untouched
    assert orjson.loads(matched)["body"]["assertedIdentity"] is True
    added = orjson.loads(attached_identity)["body"]
    assert added["assertedIdentity"] is True
    assert added["identity"]["userProfile"]["userURL"] == "user://hs/alice"


async def test_an_anonymous_runtime_cannot_claim_an_asserted_identity() -> None:
    ingress, me, link, outboxes = await ingress_and_me()
    attachment = Attachment(me, link, None, False)
    await decide(ingress, attachment, body_message({"assertedIdentity": True}))
    [item] = outboxes.outbox.items
    assert orjson.loads(item.routed.text)["body"]["assertedIdentity"] is False


async def test_quotas_refuse_learning_and_full_destinations() -> None:
    ingress, me, link, _ = await ingress_and_me(
        quotas=QuotaConfig(learned_routes=2, waiting_bytes=64 * 1024), waiting={2: 64 * 1024}
    )
    attachment = Attachment(me, link, None, False)
    for n in range(3):
        await decide(
            ingress,
            attachment,
            frame(n, "hyperty://mn.test/nobody-here", frm=f"hyperty://other.example/{n}"),
        )
    await decide(ingress, attachment, frame(3, "hyperty://mn.test/b"))  # bob's backlog is full
    codes = [m["body"]["code"] for m in link.messages()]  # type: ignore[index]
    # Two new `from` addresses are learned (404: nobody there), the third is over the quota;
    # the message to bob, whose backlog is full, is refused with 413.
    assert codes == [404, 404, 429, 413]


async def test_learned_routes_are_bounded_per_client_and_given_back_with_their_session() -> None:
    """Two sessions of one client, each within its own quota of learned routes, share the
    client's bound; a session released gives its routes' places back."""
    table = RoutingTable()
    sessions = Sessions()
    first, second = sessions.add(1, table), sessions.add(2, table)
    table.add_allocations(1, ["hyperty://mn.test/a"], None)
    table.add_allocations(2, ["hyperty://mn.test/b"], None)
    shares = SessionShares(Bound("learned_routes", 3, 100), lambda _session: "ip:10.9.9.9")
    ingress = ingress_for(table, Outboxes(), {}, learned=shares)
    links = {1: await attached(first), 2: await attached(second)}
    attachments = {1: Attachment(first, links[1], None, False)}
    attachments[2] = Attachment(second, links[2], None, False)

    async def speak(session_id: int, n: int) -> int:
        frm = f"hyperty://other.example/{n}"
        await decide(ingress, attachments[session_id], frame(n, "hyperty://mn.test/x", frm=frm))
        return int(links[session_id].messages()[-1]["body"]["code"])  # type: ignore[index]

    # Learned (404: nobody at the destination) until the client holds 3; then 429.
    assert [await speak(1, 0), await speak(1, 1), await speak(2, 2)] == [404, 404, 404]
    assert await speak(2, 3) == 429
    table.remove_session(1)
    assert await speak(2, 4) == 404

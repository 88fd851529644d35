"""One message never harms another (issue 41, rows 1, 2 and 9): the wire's bounds are checked
once where a message enters, and set by the weakest consumer; a message's id is exact from the
one parse (nothing reads the frame again); and on every path that carries many messages
together, a failure stays with its message while the others go on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from adapter import carrier
from adapter.access import AccessMonitor
from adapter.analytics.schema import MESSAGES_ARROW_SCHEMA
from adapter.carrier import LaneEncoder, Routed, Sender
from adapter.config import parse_config
from adapter.envelope import (
    MAX_ID_NUMBER,
    MAX_NESTING,
    InvalidMessage,
    Message,
    answer,
    body_bytes,
    nesting_exceeds,
    parse,
)
from adapter.export.admission import EventAdmission
from adapter.export.rows import INT32, message_fields, rows_for_event
from adapter.export.runner import ExportSummary, event_rows, write_parquet
from adapter.observability import NodeMetrics
from adapter.ops.ingest import ingest_spool
from adapter.ops.layout import DashboardLayout
from adapter.ops.tap import EventTap
from adapter.routing.delivery import Delivery
from adapter.routing.journal import Journal
from adapter.routing.lanes import Outgoing
from adapter.routing.marks import SenderMarks
from adapter.routing.settlement import LaneLedger
from adapter.routing_table import RoutingTable
from adapter.services.base import Requester, ServiceReply
from adapter.sessions.mailbox import Parcel
from adapter.sessions.session import Attachment
from tests.unit.routing.test_routing_core import (
    Outboxes,
    Sessions,
    attached,
    decide,
    ingress_for,
    metrics,
)

D = "mn.test"
A, B, C = "hyperty://mn.test/a", "hyperty://mn.test/b", "hyperty://mn.test/c"


class nested:
    """A JSON value ``depth`` levels deep (a list of lists), written as text by ``text``."""

    def __init__(self, depth: int) -> None:
        self.depth = depth


def text(message: dict[str, Any]) -> str:
    """The message's JSON text, written as a hostile runtime's serialiser would: at any depth
    (orjson refuses beyond 254 levels, the standard library recurses)."""
    deep: list[int] = []

    def placeholder(value: Any) -> str:
        assert isinstance(value, nested)
        deep.append(value.depth)
        return f"@deep{len(deep) - 1}@"

    written = json.dumps(message, separators=(",", ":"), default=placeholder)
    for i, depth in enumerate(deep):
        written = written.replace(f'"@deep{i}@"', "[" * depth + "]" * depth)
    return written


def failed_items(m: NodeMetrics, path: str) -> float:
    return m.failed_items.labels(path)._value.get()  # type: ignore[attr-defined,no-any-return]


# -- the bound, where a message enters ------------------------------------------------------------


def test_nesting_is_bounded_where_a_message_enters_below_what_every_consumer_writes() -> None:
    header = {"id": 1, "type": "update", "from": A, "to": B}
    # The message object is level 1, its body level 2.
    fits = parse(text({**header, "body": {"v": nested(MAX_NESTING - 2)}}))
    with pytest.raises(InvalidMessage) as refused:
        parse(text({**header, "body": {"v": nested(MAX_NESTING - 1)}}))
    assert refused.value.code == 400 and "nest" in refused.value.reason
    # What enters can be written again by the weakest writer on its paths (orjson, which
    # refuses beyond 254 levels), inside a record of the node's own a few levels deep.
    orjson.dumps({"record": {"entries": [{"message": orjson.loads(fits.raw)}]}})
    assert json.loads(text({"v": nested(3)})) == {"v": [[[]]]}
    # The issue's poison: a body ~1,000 deep, inside the parser's own limit of 1,024.
    with pytest.raises(InvalidMessage):
        parse(text({**header, "body": {"v": nested(1000)}}))


def test_the_nesting_check_counts_levels_exactly() -> None:
    for depth in (2, MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 300, 1000):
        as_list = orjson.loads(text({"v": nested(depth)}))["v"]
        as_dict = orjson.loads(text({"v": nested(depth - 1)}))
        assert nesting_exceeds(as_list) is (depth > MAX_NESTING)
        assert nesting_exceeds(as_dict) is (depth > MAX_NESTING)
    assert not nesting_exceeds("text") and not nesting_exceeds({"deep": "[" * 500})


def test_an_id_is_a_string_or_an_integer_every_consumer_holds_exactly() -> None:
    header = {"type": "ping", "from": A, "to": B}
    for good in (0, 7, -1, MAX_ID_NUMBER, -MAX_ID_NUMBER, "7", "x" * 1024):
        assert parse(text({**header, "id": good})).id == good
    for bad in (1.5, 1.0, MAX_ID_NUMBER + 1, 2**64 + 1, 10**40, True, None, [1]):
        with pytest.raises(InvalidMessage) as refused:
            parse(text({**header, "id": bad}))
        assert refused.value.code == 400


def test_the_issues_poison_is_refused_at_entry_and_any_answer_is_written_from_the_one_parse() -> (
    None
):
    """Defect: an answer to a message with a float id read the raw frame again with the
    standard library's json, which raised RecursionError on a body ~1,000 deep."""
    poison = text({"id": 1.5, "type": "ping", "from": A, "to": B, "body": {"v": nested(1000)}})
    with pytest.raises(InvalidMessage) as refused:
        parse(poison)
    assert refused.value.code == 400
    # An answer never reads the frame: a message's raw text plays no part in it.
    message = Message("not JSON at all", 12, "ping", A, (B,), {})
    assert orjson.loads(answer(message, 404, desc="gone"))["id"] == 12


def test_a_bodys_size_is_read_from_its_text() -> None:
    raw = '{"id":1,"body" : {"a": [1, 2]} ,"type":"x"}'
    assert body_bytes(raw) == len('{"a": [1, 2]}')
    assert body_bytes('{"id":1}') == 0


# -- a lane event: one message fails, the others are delivered ------------------------------------


async def test_a_poison_message_to_a_vanished_address_does_not_stop_its_lane_events_others() -> (
    None
):
    """Row 1: the poison (float id, body ~1,000 deep) to an address that went away before
    delivery, between two honest runtimes' messages in one lane event. Defect: answering it
    raised, the event was retried and then settled as it stood: the messages after it were
    never delivered."""
    table = RoutingTable()
    sessions = Sessions()
    mallory, alice, bob = (sessions.add(i, table) for i in (1, 2, 3))
    table.add_allocations(3, [B], None)
    bob_link = await attached(bob)
    await attached(mallory)
    m = metrics()
    delivery = Delivery(AccessMonitor("mn.test", table), sessions, Journal(None), m, SenderMarks())  # type: ignore[arg-type]
    poison = text({"id": 1.5, "type": "ping", "from": A, "to": C, "body": {"v": nested(1000)}})
    honest = alice.sender(f"{alice.key}.s")
    event = [
        Routed(text({"id": 1, "type": "ping", "from": A, "to": B}), (B,), honest, 1),
        Routed(poison, (C,), mallory.sender(f"{mallory.key}.s"), 1),
        Routed(text({"id": 2, "type": "ping", "from": A, "to": B}), (B,), honest, 2),
    ]
    ticket = LaneLedger("!lane").open("$e1")
    await delivery.deliver(event, ticket)
    assert [msg["id"] for msg in bob_link.messages()] == [1, 2]  # type: ignore[index]
    assert ticket.sealed


async def test_a_message_that_fails_inside_the_node_is_answered_and_the_others_go_on() -> None:
    """Whatever fails for one message (here its destination's mailbox raises, as a bug would)
    is answered 500 to its sender and counted; the event's other messages are delivered, and
    the event is not handed over again for it."""
    table = RoutingTable()
    sessions = Sessions()
    sender, broken, fine = (sessions.add(i, table) for i in (1, 2, 3))
    table.add_allocations(2, [B], None)
    table.add_allocations(3, [C], None)
    sender_link = await attached(sender)
    fine_link = await attached(fine)

    async def raising(parcel: Parcel, ticket: object = None) -> str:
        raise RuntimeError("a bug this message reached")

    broken.mailbox.deliver = raising  # type: ignore[method-assign]
    m = metrics()
    delivery = Delivery(AccessMonitor("mn.test", table), sessions, Journal(None), m, SenderMarks())  # type: ignore[arg-type]
    origin = sender.sender(f"{sender.key}.s")
    event = [
        Routed(text({"id": n, "type": "ping", "from": A, "to": to}), (to,), origin, n)
        for n, to in ((1, C), (2, B), (3, C))
    ]
    await delivery.deliver(event, LaneLedger("!lane").open("$e1"))
    assert [msg["id"] for msg in fine_link.messages()] == [1, 3]  # type: ignore[index]
    [refusal] = sender_link.messages()
    assert refusal["id"] == 2 and refusal["body"]["code"] == 500  # type: ignore[index]
    assert failed_items(m, "delivery") == 1
    assert delivery.routed_through(f"{sender.key}.s") == 3


async def test_each_sender_of_what_a_released_runtime_missed_is_told_even_if_one_fails() -> None:
    table = RoutingTable()
    sessions = Sessions()
    first, second, gone = (sessions.add(i, table) for i in (1, 2, 3))
    first_link, second_link = await attached(first), await attached(second)
    gone.released = True

    async def raising(parcel: Parcel, ticket: object = None) -> str:
        raise RuntimeError("a bug")

    first.mailbox.deliver = raising  # type: ignore[method-assign]
    m = metrics()
    delivery = Delivery(AccessMonitor("mn.test", table), sessions, Journal(None), m, SenderMarks())  # type: ignore[arg-type]
    await delivery.unreceived(
        [
            Parcel(text({"id": 7, "type": "ping", "from": A, "to": C}), f"{first.key}.s", 7),
            Parcel(text({"id": 8, "type": "ping", "from": B, "to": C}), f"{second.key}.s", 8),
        ]
    )
    [told] = second_link.messages()
    assert told["id"] == 8 and told["body"]["code"] == 404  # type: ignore[index]
    assert first_link.messages() == [] and failed_items(m, "unreceived") == 1


# -- a service request that took effect ------------------------------------------------------------


class Recorded:
    """A journal stream that keeps what is pushed."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def push(self, item: bytes) -> None:
        self.entries.append(orjson.loads(item))


class Writing:
    """A service that takes effect (``writes``) and answers ``value``."""

    def __init__(self, value: Any = None) -> None:
        self.writes = 0
        self.value = value

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        self.writes += 1
        return ServiceReply(200, value=self.value, affected=1)


async def serving(service: Writing) -> tuple[Any, Any, Recorded, Attachment]:
    table = RoutingTable()
    sessions = Sessions()
    me = sessions.add(1, table)
    table.add_allocations(1, [A], None)
    ingress = ingress_for(table, Outboxes(), {})
    ingress._services.add_endpoint("write", service)
    recorded = Recorded()
    ingress._journal = Journal(recorded)  # type: ignore[arg-type]
    link = await attached(me)
    return ingress, link, recorded, Attachment(me, link, None, False)


async def test_the_issues_poison_on_a_service_request_is_refused_before_anything_is_written() -> (
    None
):
    """Row 9. Defect: the registry write stood, yet its sender was answered 500 and the journal
    recorded the request as refused."""
    service = Writing()
    ingress, link, recorded, attachment = await serving(service)
    poison = text(
        {
            "id": 1.5,
            "type": "create",
            "from": A,
            "to": f"domain://msg-node.{D}/write",
            "body": {"value": nested(1000)},
        }
    )
    await ingress.on_message(attachment, poison, orjson.loads(poison))
    [refusal] = link.messages()
    assert refusal["body"]["code"] == 400  # type: ignore[index]
    assert service.writes == 0
    assert [e["kind"] for e in recorded.entries] == ["rejected"]


async def test_a_request_that_took_effect_is_never_answered_or_journalled_as_refused() -> None:
    """The service wrote, and its answer's value cannot be written: the sender hears the
    service's code, and the journal records the request as served."""
    service = Writing(value={"unwritable": object()})
    ingress, link, recorded, attachment = await serving(service)
    request = text({"id": 3, "type": "create", "from": A, "to": f"domain://msg-node.{D}/write"})
    await decide(ingress, attachment, request)
    [reply] = link.messages()
    assert reply["id"] == 3 and reply["body"]["code"] == 200  # type: ignore[index]
    assert service.writes == 1
    [entry] = recorded.entries
    assert entry["kind"] == "service" and entry["affected"] == 1


# -- the export and the dashboard: one message, one event ----------------------------------------

ALICE = Sender("k1.s", "runtime://mn.test/alice", "@_rethink_a:localhost")


def batch_event(n: int, texts: list[str], ts: int | None = None) -> dict[str, Any]:
    items = [
        Outgoing(Routed(t, (B,), ALICE, i + 1), 1)  # type: ignore[arg-type]
        for i, t in enumerate(texts)
    ]
    inline = LaneEncoder().encode({"lane": 0, "n": n}, items).inline
    assert inline is not None
    return {
        "type": carrier.BATCH_EVENT,
        "event_id": f"$e{n}",
        "room_id": "!lane:hs",
        "sender": ALICE.user,
        "origin_server_ts": int(time.time() * 1000) if ts is None else ts,
        "content": orjson.loads(inline),
    }


def deep_message(i: int) -> str:
    return text({"id": i, "type": "update", "from": A, "to": B, "body": {"v": nested(300)}})


def test_a_message_deeper_than_orjson_writes_still_gets_its_row() -> None:
    """Row 2. Defect: orjson.dumps refused the body (more than 254 levels) and the exception
    failed the whole export file, every dashboard cycle on the same spool."""
    row, parsed = message_fields(deep_message(4))
    assert parsed is not None and row["msg_id"] == "4" and row["type"] == "update"
    assert row["body_size"] == len(text({"v": nested(300)}))
    response = text({"id": 5, "type": "response", "from": B, "to": A, "body": {"code": 2**40}})
    assert message_fields(response)[0]["response_code"] is None  # beyond the int32 column


async def test_an_event_that_fails_is_skipped_and_the_others_are_exported() -> None:
    async def fetch(_uri: str) -> bytes:
        raise AssertionError("no media here")

    good = batch_event(1, [text({"id": 1, "type": "ping", "from": A, "to": B})])
    # An event whose time has no date (far beyond year 9999).
    late = batch_event(2, [text({"id": 2, "type": "ping", "from": A, "to": B})], ts=2**62)
    rows, _ = await rows_for_event(good, fetch)
    assert len(rows) == 1
    summary = ExportSummary("t")
    admission = EventAdmission("localhost", "_rethink_", "@bot:localhost", {})
    messages, _ = await event_rows(None, [late, good], summary, admission)  # type: ignore[arg-type]
    assert [r["msg_id"] for r in messages] == ["1"]
    assert sum(summary.undecodable.values()) == 1


def test_a_row_the_schema_cannot_hold_is_left_out_not_the_file(tmp_path: Path) -> None:
    row, _ = message_fields(text({"id": 1, "type": "ping", "from": A, "to": B}))
    base = {
        "event_id": "$e",
        "room_id": "!r",
        "event_type": carrier.BATCH_EVENT,
        "sender": "@b:hs",
        "runtime": None,
        "origin_server_ts": 1,
        "ts": 1,
        "carrier": "inline",
        "messages_in_event": 2,
        "kind": "routed",
        "service": None,
        "addresses": None,
        "identity": None,
        "date": "2026-11-29",
    }
    good = {**base, **row, "index_in_event": 0}
    bad = {**base, **row, "index_in_event": 1, "to_count": INT32 + 1}
    assert write_parquet([good, bad], MESSAGES_ARROW_SCHEMA, tmp_path, "part.parquet") == 1
    table = pq.read_table(tmp_path)
    assert table.column("index_in_event").to_pylist() == [0]


async def test_the_dashboard_cycle_goes_on_past_a_deeply_nested_message(tmp_path: Path) -> None:
    """Row 2 on the dashboard's path: the spool holds a batch with a message 300 levels deep
    between two others; the worker writes all three rows, and the spool is consumed."""
    layout = DashboardLayout(tmp_path / "dashboard")
    layout.prepare()
    config = parse_config({"appservice": {"as_token": "a" * 20, "hs_token": "h" * 20}})
    tap = EventTap(layout.spool_dir, NodeMetrics(CollectorRegistry()), keep_seconds=3600)
    honest = [text({"id": i, "type": "ping", "from": A, "to": B}) for i in (1, 3)]
    tap.observe([batch_event(1, [honest[0], deep_message(2), honest[1]])])
    await tap.flush()
    summary = await ingest_spool(config, layout)
    assert summary.message_rows == 3
    table = pq.read_table(layout.export_dir / "messages")
    assert sorted(table.column("msg_id").to_pylist()) == ["1", "2", "3"]
    assert list(layout.spool_dir.iterdir()) == []

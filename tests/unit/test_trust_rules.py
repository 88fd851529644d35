"""The trust model's decision logic on its own (DESIGN §10): the wire's bounds, what the routing
table keeps, what a subscription may name. The monitor's own table of rules is in
test_access_monitor.py."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from adapter import carrier
from adapter.access import AccessMonitor
from adapter.addresses import is_stream_address
from adapter.envelope import (
    MAX_DESTINATIONS,
    InvalidMessage,
    check_header,
    parse,
)
from adapter.routing_table import RoutingTable
from adapter.services.base import Requester
from adapter.services.subscriptions import SubscriptionService
from adapter.stub.protocol import (
    MAX_NUMBER,
    BadFrame,
    BadHello,
    hello_from_query,
    parse_hello,
    split_numbered,
    wire_number,
)

ALICE, BOB, MALLORY = 1, 2, 3


def test_numbered_frames_carry_numbers_matrix_can_hold() -> None:
    assert split_numbered('[1,{"a":1}]') == (1, '{"a":1}')
    assert split_numbered(f"[{MAX_NUMBER},{{}}]") == (MAX_NUMBER, "{}")
    for bad in (MAX_NUMBER + 1, 2**64 + 1, 0):
        with pytest.raises(BadFrame):
            split_numbered(f"[{bad},{{}}]")
    # Not a numbered frame at all (then refused as a message that is not an object).
    assert split_numbered("[-1,{}]") is None
    assert split_numbered("[\u0661\u0662,{}]") is None  # Arabic-Indic digits are not a number
    assert split_numbered("[1.5,{}]") is None


def test_control_frame_numbers_and_names_are_bounded() -> None:
    assert wire_number(0) == 0 and wire_number(MAX_NUMBER) == MAX_NUMBER
    for bad in (-1, MAX_NUMBER + 1, True, 1.0, "1", None):
        assert wire_number(bad) is None
    with pytest.raises(BadHello):
        parse_hello({"v": 1, "stub": "abcdefgh", "received": 2**53})
    with pytest.raises(BadHello):
        hello_from_query({"ack": "1", "stub": "abcdefgh", "received": "\u0661"})
    assert hello_from_query({"ack": "1", "stub": "abcdefgh", "received": "7"}) is not None


def test_a_message_header_is_bounded() -> None:
    ok = {"id": 1, "type": "ping", "from": "hyperty://d/a", "to": "hyperty://d/b"}
    assert parse(orjson.dumps(ok).decode()).type == "ping"
    for field, value in (
        ("id", "i" * 1025),
        ("type", "t" * 65),
        ("to", ["hyperty://d/b"] * (MAX_DESTINATIONS + 1)),
        ("from", "f" * 1025),
    ):
        with pytest.raises(InvalidMessage) as refused:
            parse(orjson.dumps({**ok, field: value}).decode())
        assert refused.value.code == 400


def test_carried_numbers_are_checked_when_read_back() -> None:
    def batch(oseq: object) -> dict[str, object]:
        return {
            "v": carrier.LANE_FORMAT,
            "senders": [["o", "runtime://d/1", "@u:hs"]],
            "messages": [[0, oseq, ["hyperty://d/b"], "{}"]],
        }

    async def fetch(_uri: str) -> bytes:
        raise AssertionError("inline")

    assert asyncio.run(carrier.decode_batch(batch(MAX_NUMBER), fetch))[0].oseq == MAX_NUMBER
    for bad in (MAX_NUMBER + 1, 0, -5, True, 1.5):
        with pytest.raises(carrier.CarrierError):
            asyncio.run(carrier.decode_batch(batch(bad), fetch))


def test_stream_addresses() -> None:
    for stream in (
        "comm://d/o/changes",
        "comm://d/o/children/chat",
        "comm://d/o/children/",
        "hyperty://d/h/registration",
    ):
        assert is_stream_address(stream)
    # An object's request channel is its reporter's, not a stream (access.py, "Receive at").
    for own in (
        "hyperty://d/h",
        "runtime://d/1",
        "runtime://d/1/sm",
        "comm://d/o",
        "user://i/a",
        "comm://d/o/subscription",
    ):
        assert not is_stream_address(own)


def _table() -> RoutingTable:
    table = RoutingTable()
    table.add_runtime(BOB, "runtime://d/bob")
    table.add_allocations(BOB, ["hyperty://d/b", "comm://d/o"], None)
    table.add_runtime(MALLORY, "runtime://d/mallory")
    return table


def test_a_learned_address_is_never_taken_over() -> None:
    table = _table()
    assert table.learn(BOB, "user://i/b")
    assert not table.learn(MALLORY, "user://i/b")
    assert not table.learn(MALLORY, "hyperty://d/b")
    assert not table.learn(MALLORY, "runtime://d/bob")
    assert table.learned_holder("user://i/b") == BOB
    table.remove_session(BOB)
    assert table.learn(MALLORY, "user://i/b")
    assert table.learned_holder("user://i/b") == MALLORY


class _Routes:
    async def subscribe(self, _session: int, _addresses: list[str]) -> None:
        return None

    async def unsubscribe(self, _session: int, _addresses: list[str]) -> None:
        return None


async def test_the_subscription_manager_refuses_another_runtimes_own_addresses() -> None:
    table = _table()
    denied: list[str] = []

    def policy(_requester: Requester, address: str) -> str | None:
        denied.append(address)
        return "denied by policy" if address.endswith("/children/secret") else None

    monitor = AccessMonitor("d", table)
    sm = SubscriptionService(table, monitor, _Routes(), policy=policy)  # type: ignore[arg-type]
    mallory = Requester(MALLORY, "runtime://d/mallory")

    async def subscribe(body: dict[str, object]) -> int:
        message = parse(
            orjson.dumps(
                {"id": 1, "type": "subscribe", "from": "x://m", "to": "domain://msg-node.d/sm"}
                | {"body": body}
            ).decode()
        )
        return (await sm.handle(message, mallory)).code

    for target in ("hyperty://d/b", "runtime://d/bob", "runtime://d/bob/sm", "comm://d/o"):
        assert await subscribe({"resources": [target]}) == 403, target
        assert await subscribe({"subscribe": target}) == 403, target
    assert (
        await subscribe({"resources": ["comm://d/o/changes", "hyperty://d/b/registration"]}) == 200
    )
    assert (
        await subscribe({"resources": ["runtime://d/mallory/sm", "hyperty-runtime://d/p2p/1"]})
        == 200
    )
    # The phase-1 form: the object's streams, not the object itself, for another's object.
    assert await subscribe({"resource": "comm://d/o", "childrenResources": ["chat"]}) == 200
    assert "comm://d/o" not in table.subscriptions_of(MALLORY)
    assert {"comm://d/o/changes", "comm://d/o/children/chat"} <= table.subscriptions_of(MALLORY)
    # The operator's rules refine what the rule allows.
    assert await subscribe({"resources": ["comm://d/o/children/secret"]}) == 403
    assert "comm://d/o/children/secret" in denied


def test_a_nul_character_anywhere_in_a_message_is_refused_where_it_enters() -> None:
    """Found by the 30-minute fuzz: an address holding NUL made PostgreSQL refuse the learned
    route's row, and the sender got 500. An escaped backslash before "u0000" is no NUL."""
    nul = r'{"id":1,"type":"ping","from":"user://d/a\u0000","to":"hyperty://d/b"}'
    with pytest.raises(InvalidMessage) as refused:
        check_header(nul, orjson.loads(nul))
    assert refused.value.code == 400
    literal = (
        r'{"id":1,"type":"ping","from":"user://d/a","to":"hyperty://d/b","body":{"t":"\\u0000"}}'
    )
    assert check_header(literal, orjson.loads(literal)).from_ == "user://d/a"

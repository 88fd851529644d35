"""A message read again after a start (routing/recovery.py) that has no destination any more is
not answered 404: it was routed before the stop, and its sender had its outcome then (issue 43).
Routed live, the same message is answered."""

from __future__ import annotations

import orjson
import pytest

from adapter.access import AccessMonitor
from adapter.carrier import Routed
from adapter.routing.delivery import Delivery
from adapter.routing.journal import Journal
from adapter.routing.marks import SenderMarks
from adapter.routing.settlement import LaneLedger
from adapter.routing_table import RoutingTable

from .test_routing_core import Sessions, attached, metrics

A, B = "hyperty://mn.test/a", "hyperty://mn.test/b"


@pytest.mark.parametrize("recovered", [False, True], ids=["live", "read-again"])
async def test_a_message_with_no_destination_is_answered_404_only_when_routed_live(
    recovered: bool,
) -> None:
    table = RoutingTable()
    sessions = Sessions()
    alice = sessions.add(1, table)
    alice_link = await attached(alice)
    delivery = Delivery(
        AccessMonitor("mn.test", table), sessions, Journal(None), metrics(), SenderMarks()
    )  # type: ignore[arg-type]
    ping = orjson.dumps({"id": 1, "type": "ping", "from": A, "to": B}).decode()
    event = [Routed(ping, (B,), alice.sender(f"{alice.key}.s"), 1)]
    await delivery.deliver(event, LaneLedger("!lane").open("$e1"), recovered=recovered)
    answers = [m["body"]["code"] for m in alice_link.messages()]  # type: ignore[index]
    assert answers == ([] if recovered else [404])

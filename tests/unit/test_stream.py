"""The batch stream against a fake homeserver: adaptive batching, retries with the same
transaction id, and a batch the homeserver refuses as too large split until it fits."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from adapter.carrier import JournalEncoder
from adapter.observability import NodeMetrics
from adapter.routing.stream import BatchStream, StreamLimits
from appservice.api import HomeserverUnreachable, MatrixError


class FakeIntent:
    user_id = "@bot:hs"

    def __init__(self, max_items: int = 1000, fail_first: int = 0) -> None:
        self.max_items = max_items
        self.fail_first = fail_first
        self.sent: list[tuple[str, list[Any]]] = []
        self.txn_ids: list[str] = []
        self._txn = 0

    def new_txn_id(self) -> str:
        self._txn += 1
        return f"t{self._txn}"

    async def send_event(self, room_id: str, event_type: str, content: bytes, txn_id: str) -> str:
        self.txn_ids.append(txn_id)
        if self.fail_first:
            self.fail_first -= 1
            raise HomeserverUnreachable("down")
        entries = orjson.loads(content)["entries"]
        if len(entries) > self.max_items:
            raise MatrixError(413, "M_TOO_LARGE", "event too large", "send")
        await asyncio.sleep(0.01)
        self.sent.append((txn_id, entries))
        return f"$e{len(self.sent)}"


def stream(intent: FakeIntent, done: list[tuple[int, str]]) -> BatchStream[bytes]:
    async def target(refresh: bool) -> tuple[Any, str]:
        return intent, "!room"

    return BatchStream(
        "test",
        JournalEncoder(),
        dict,
        target,
        NodeMetrics(CollectorRegistry()),
        StreamLimits(retry_initial=0.01, retry_max=0.02),
        on_sent=lambda batch, event_id: done.append((len(batch), event_id)),
    )


async def test_a_lone_item_goes_at_once_and_what_queues_meanwhile_shares_the_next_event() -> None:
    intent = FakeIntent()
    done: list[tuple[int, str]] = []
    s = stream(intent, done)
    s.push(orjson.dumps({"i": 0}))
    await asyncio.sleep(0)  # the stream takes it: its event is in flight
    for i in range(1, 50):
        s.push(orjson.dumps({"i": i}))
    assert await s.flush(5)
    assert [n for n, _ in done] == [1, 49]
    assert [e["i"] for _, batch in intent.sent for e in batch] == list(range(50))


async def test_a_failed_send_is_retried_with_the_same_transaction_id() -> None:
    intent = FakeIntent(fail_first=2)
    done: list[tuple[int, str]] = []
    s = stream(intent, done)
    s.push(b'{"a":1}')
    assert await s.flush(5)
    assert intent.txn_ids == ["t1", "t1", "t1"] and done == [(1, "$e1")]


async def test_a_batch_refused_as_too_large_is_split_and_nothing_is_lost_or_reordered() -> None:
    intent = FakeIntent(max_items=7)
    done: list[tuple[int, str]] = []
    s = stream(intent, done)
    s.push(b'{"i":-1}')  # goes alone; the rest queue behind it
    await asyncio.sleep(0)
    for i in range(40):
        s.push(orjson.dumps({"i": i}))
    assert await s.flush(5)
    assert [e["i"] for _, batch in intent.sent for e in batch] == [-1, *range(40)]
    assert all(len(batch) <= 7 for _, batch in intent.sent)
    assert sum(n for n, _ in done) == 41

"""The batch stream against a fake homeserver: adaptive batching, retries with the same
transaction id, and a batch the homeserver refuses as too large split until it fits."""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from adapter import carrier
from adapter.carrier import JournalEncoder, LaneEncoder, Routed, Sender
from adapter.observability import NodeMetrics
from adapter.routing.lanes import Lane, Outgoing
from adapter.routing.settlement import LaneLedger
from adapter.routing.stream import BatchStream, StreamLimits, Traffic
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


async def test_a_flush_under_steady_traffic_waits_only_for_what_came_before_it() -> None:
    """A session moving to another process waits on its lanes' flush while the other runtimes
    keep sending: it must return once what was pushed before it is sent, not when the stream
    next goes idle (never, under steady traffic)."""
    intent = FakeIntent()
    done: list[tuple[int, str]] = []
    s = stream(intent, done)
    keep_pushing = True

    async def steady() -> None:
        i = 0
        while keep_pushing:
            s.push(orjson.dumps({"i": i}))
            i += 1
            await asyncio.sleep(0.002)

    pushing = asyncio.create_task(steady())
    await asyncio.sleep(0.05)
    s.push(b'{"i":"mine"}')
    try:
        assert await s.flush(1.0)
        sent = [e["i"] for _, batch in intent.sent for e in batch]
        assert "mine" in sent
    finally:
        keep_pushing = False
        await pushing
    assert await s.flush(5)


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


class PoisonIntent(FakeIntent):
    """Refuses any event holding an entry marked poison, as Synapse refuses an event holding an
    integer beyond 2^53 (400 M_BAD_JSON); or answers ``status`` for the first ``refusals``."""

    def __init__(self, status: int = 400, refusals: int = 0) -> None:
        super().__init__()
        self.status = status
        self.refusals = refusals
        self.refreshes = 0

    async def send_event(self, room_id: str, event_type: str, content: bytes, txn_id: str) -> str:
        entries = orjson.loads(content)["entries"]
        if self.refusals:
            self.refusals -= 1
            raise MatrixError(self.status, "M_X", "refused", "send")
        if any(e.get("poison") for e in entries):
            raise MatrixError(400, "M_BAD_JSON", "JSON integer out of range", "send")
        return await super().send_event(room_id, event_type, content, txn_id)


class Numbered:
    """A stream numbering its events as lanes do: the number counts once persisted."""

    def __init__(self) -> None:
        self.n = 0
        self.numbers: list[int] = []

    def header(self) -> dict[str, Any]:
        return {"n": self.n + 1}

    def sent(self, batch: list[Any], event_id: str) -> None:
        self.n += 1


def poisoned_stream(
    intent: FakeIntent, refused: list[bytes], numbered: Numbered | None = None
) -> BatchStream[bytes]:
    async def target(refresh: bool) -> tuple[Any, str]:
        if refresh and isinstance(intent, PoisonIntent):
            intent.refreshes += 1
        return intent, "!room"

    async def on_refused(item: bytes, refusal: MatrixError) -> None:
        assert refusal.status == 400
        refused.append(item)

    numbered = numbered or Numbered()
    return BatchStream(
        "test",
        JournalEncoder(),
        numbered.header,
        target,
        NodeMetrics(CollectorRegistry()),
        StreamLimits(retry_initial=0.01, retry_max=0.02),
        on_sent=numbered.sent,
        on_refused=on_refused,
    )


async def test_an_item_the_homeserver_refuses_is_isolated_answered_and_the_stream_goes_on() -> None:
    intent = PoisonIntent()
    refused: list[bytes] = []
    numbered = Numbered()
    s = poisoned_stream(intent, refused, numbered)
    s.push(b'{"i":-1}')
    await asyncio.sleep(0)  # in flight: the rest queue into one batch with the poison inside
    for i in range(40):
        s.push(orjson.dumps({"i": i, "poison": i == 23}))
    assert await s.flush(5)
    assert refused == [orjson.dumps({"i": 23, "poison": True})]
    delivered = [e["i"] for _, batch in intent.sent for e in batch]
    assert delivered == [-1, *(i for i in range(40) if i != 23)]
    # And the stream still sends what comes after.
    s.push(b'{"i":99}')
    assert await s.flush(5)
    assert intent.sent[-1][1] == [{"i": 99}]


async def test_split_and_refused_batches_leave_no_gap_in_the_event_numbers() -> None:
    intent = PoisonIntent()
    numbered = Numbered()
    numbers: list[int] = []
    original = intent.send_event

    async def record(room_id: str, event_type: str, content: bytes, txn_id: str) -> str:
        event_id = await original(room_id, event_type, content, txn_id)
        numbers.append(orjson.loads(content)["n"])
        return event_id

    intent.send_event = record  # type: ignore[method-assign]
    s = poisoned_stream(intent, [], numbered)
    s.push(b'{"i":-1}')
    await asyncio.sleep(0)
    for i in range(30):
        s.push(orjson.dumps({"i": i, "poison": i % 7 == 3}))
    assert await s.flush(5)
    assert numbers == list(range(1, len(numbers) + 1)) and numbered.n == len(numbers)


async def test_rate_limits_and_server_errors_are_retried_not_refused() -> None:
    for status in (429, 500, 408):
        intent = PoisonIntent(status=status, refusals=3)
        refused: list[bytes] = []
        s = poisoned_stream(intent, refused)
        s.push(b'{"i":1}')
        assert await s.flush(5)
        assert refused == [] and [b for _, b in intent.sent] == [[{"i": 1}]], status


async def test_a_room_refusal_provisions_the_room_again_and_retries() -> None:
    intent = PoisonIntent(status=403, refusals=2)
    refused: list[bytes] = []
    s = poisoned_stream(intent, refused)
    s.push(b'{"i":1}')
    assert await s.flush(5)
    assert refused == [] and intent.refreshes == 2 and len(intent.sent) == 1


class MediaIntent(FakeIntent):
    def __init__(self) -> None:
        super().__init__(fail_first=3)
        self.uploads = 0

    async def upload(self, data: bytes, content_type: str, filename: str) -> str:
        self.uploads += 1
        return f"mxc://hs/{self.uploads}"

    async def send_event(self, room_id: str, event_type: str, content: Any, txn_id: str) -> str:
        self.txn_ids.append(txn_id)
        if self.fail_first:
            self.fail_first -= 1
            raise HomeserverUnreachable("down")
        self.sent.append((txn_id, [content]))
        return f"$e{len(self.sent)}"


async def test_a_media_batch_is_uploaded_once_however_often_its_event_is_retried() -> None:
    intent = MediaIntent()
    done: list[tuple[int, str]] = []
    s = stream(intent, done)
    s.push(orjson.dumps({"blob": "x" * 70_000}))  # beyond an event: travels as media
    assert await s.flush(5)
    assert intent.uploads == 1 and intent.txn_ids == ["t1"] * 4 and len(done) == 1


class LaneIntent(FakeIntent):
    """Takes lane events; media as well, counted."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []

    async def upload(self, data: bytes, content_type: str, filename: str) -> str:
        return "mxc://hs/1"

    async def send_event(self, room_id: str, event_type: str, content: Any, txn_id: str) -> str:
        self.kinds.append(carrier.media_kind(orjson.loads(content)))
        await asyncio.sleep(0.01)
        self.sent.append((txn_id, []))
        return f"$e{len(self.sent)}"


def lane_stream(intent: LaneIntent, done: list[int], one_event_below: int) -> BatchStream[Any]:
    async def target(refresh: bool) -> tuple[Any, str]:
        return intent, "!lane"

    return BatchStream(
        "lane",
        LaneEncoder(),
        dict,
        target,
        NodeMetrics(CollectorRegistry()),
        StreamLimits(retry_initial=0.01, retry_max=0.02, one_event_below_bytes=one_event_below),
        on_sent=lambda batch, _event_id: done.extend(i.routed.oseq for i in batch),
    )


def crowd_message(i: int) -> Outgoing:
    sender = Sender(f"{i:016x}.stubX", f"runtime://x/{i:04d}", f"@_rethink_{i:032x}:hs")
    noise = base64.b64encode(random.Random(i).randbytes(225)).decode()
    return Outgoing(Routed(orjson.dumps({"id": i, "s": noise}).decode(), ("b",), sender, i), 1)


async def test_a_lane_below_its_backlog_sends_what_fits_one_event_in_order() -> None:
    """What queued while an event was in flight leaves in events that hold their messages
    (inline or packed), not in one media event (a slower send that would let the next batch
    grow as big)."""
    intent = LaneIntent()
    done: list[int] = []
    s = lane_stream(intent, done, one_event_below=1024 * 1024)
    for i in range(1, 601):
        s.push(crowd_message(i))
    assert await s.flush(5)
    assert done == list(range(1, 601))
    assert "media" not in intent.kinds and "packed" in intent.kinds and len(intent.kinds) > 2


async def test_a_backlog_leaves_in_large_media_events() -> None:
    intent = LaneIntent()
    done: list[int] = []
    s = lane_stream(intent, done, one_event_below=100_000)
    for i in range(1, 601):
        s.push(crowd_message(i))
    assert await s.flush(5)
    assert done == list(range(1, 601))
    assert intent.kinds[0] == "media"


class GatedLaneIntent(LaneIntent):
    """Keeps each event's content; a send waits for ``gate`` while it is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.contents: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.sending = asyncio.Event()

    async def send_event(self, room_id: str, event_type: str, content: Any, txn_id: str) -> str:
        self.sending.set()
        await self.gate.wait()
        self.contents.append(orjson.loads(content))
        return await super().send_event(room_id, event_type, content, txn_id)


class NoDelivery:
    """The lane's delivery, unused here beyond what the lane asks of it."""

    def routed_through(self, origin: str) -> int:
        return 0

    async def deliver(self, *args: Any) -> None:
        return None


def own_lane(intent: GatedLaneIntent) -> Lane:
    """A ready lane writing into "!own" through ``intent``, delivering nowhere."""

    async def target(index: int, refresh: bool) -> tuple[Any, str]:
        return intent, "!own"

    lane = Lane(
        0,
        target,
        NoDelivery(),  # type: ignore[arg-type]
        LaneLedger,
        NodeMetrics(CollectorRegistry()),
        StreamLimits(retry_initial=0.01, retry_max=0.02),
        Traffic(),
    )
    lane.ready.set()
    return lane


async def test_a_lanes_flush_under_steady_traffic_waits_only_for_what_came_before_it() -> None:
    """The same for a lane: sent, and delivered here, through what was pushed before the
    flush, while more keeps coming."""
    intent = GatedLaneIntent()
    lane = own_lane(intent)
    keep_pushing = True

    async def steady() -> None:
        i = 1
        while keep_pushing:
            lane.push(crowd_message(i))
            i += 1
            await asyncio.sleep(0.002)

    pushing = asyncio.create_task(steady())
    await asyncio.sleep(0.05)
    try:
        before = lane.last_number
        assert await lane.flush(1.0)
        assert lane.delivered_number > before
    finally:
        keep_pushing = False
        await pushing
    assert await lane.flush(5)
    await lane.close()


async def test_a_lane_names_the_rooms_to_read_first_in_its_next_event_and_no_later() -> None:
    """After taking sessions from another process, the next event of each lane names that
    process's lanes (with the numbers to read them through). A requirement added while an
    event is on its way goes with the one after it: that event was encoded before the moved
    runtimes could send anything."""
    intent = GatedLaneIntent()
    lane = own_lane(intent)
    lane.push(crowd_message(1))
    assert await lane.flush(5)  # the lane knows its room now
    lane.require_after({"!p1": 7, "!own": 9, "!p0": 0})
    lane.require_after({"!p1": 5, "!p2": 3})
    lane.push(crowd_message(2))
    assert await lane.flush(5)
    lane.push(crowd_message(3))
    assert await lane.flush(5)
    intent.gate.clear()
    intent.sending.clear()
    lane.push(crowd_message(4))
    await intent.sending.wait()
    lane.require_after({"!p3": 4})
    intent.gate.set()
    lane.push(crowd_message(5))
    assert await lane.flush(5)
    afters = [c.get("after") for c in intent.contents]
    assert afters == [None, {"!p1": 7, "!p2": 3}, None, None, {"!p3": 4}]
    assert [carrier.read_after(c) for c in intent.contents][1] == {"!p1": 7, "!p2": 3}
    await lane.close()

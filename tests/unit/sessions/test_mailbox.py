"""A session's mailbox with a fake socket and an in-memory store: numbering, acknowledgements,
keeping, storing and the resume replay."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson

from adapter.sessions.mailbox import EPOCH_SHIFT, Entry, Mailbox, Parcel
from adapter.storage.pending import StoredRow


class FakeLink:
    """Records what the node wrote; ``lose`` makes writes vanish (a socket dying in transit)."""

    peer = "test"

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.lose = False
        self.closed = False

    @property
    def open(self) -> bool:
        return not self.closed

    async def send(self, data: str | bytes) -> bool:
        if self.closed:
            return False
        if not self.lose:
            self.frames.append(data.encode() if isinstance(data, str) else data)
        return True

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = True

    def messages(self) -> list[object]:
        """What the runtime got: the message of a numbered frame, or the frame itself."""
        parsed = [orjson.loads(f) for f in self.frames]
        return [p[3] if isinstance(p, list) else p for p in parsed]

    def numbers(self) -> list[int]:
        return [orjson.loads(f)[0] for f in self.frames]


class MemoryStore:
    def __init__(self) -> None:
        self.rows: dict[int, list[StoredRow]] = {}

    async def append(self, session_id: int, entries: Sequence[Entry]) -> None:
        self.rows.setdefault(session_id, []).extend(
            StoredRow(e.dseq, e.text, e.origin, e.oseq) for e in entries
        )

    async def after(self, session_id: int, dseq: int, limit: int) -> list[StoredRow]:
        rows = sorted(self.rows.get(session_id, []), key=lambda r: r.dseq)
        return [r for r in rows if r.dseq > dseq][:limit]

    async def remove_through(self, session_id: int, dseq: int) -> None:
        self.rows[session_id] = [r for r in self.rows.get(session_id, []) if r.dseq > dseq]


class FakeTicket:
    event_id = "$event"

    def __init__(self) -> None:
        self.pending = 0

    def hold(self) -> None:
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1


def message(n: int) -> Parcel:
    return Parcel(
        orjson.dumps({"id": n, "type": "update", "from": "a", "to": "b"}).decode(), "o.s", n
    )


def mailbox(epoch: int = 3) -> tuple[Mailbox, list[Mailbox]]:
    dirty: list[Mailbox] = []
    return Mailbox(7, epoch, dirty.append), dirty


async def live(box: Mailbox, link: FakeLink, acking: bool, store: MemoryStore) -> None:
    box.attach(link, acking)
    await box.resume(store, 0)


async def test_numbers_grow_with_the_start_count_and_frames_carry_origin_and_number() -> None:
    box, _ = mailbox(epoch=3)
    link = FakeLink()
    await live(box, link, True, MemoryStore())
    await box.deliver(message(1))
    await box.deliver(Parcel('{"id":"x","type":"response"}'))  # the node's own answer
    first, answer = (orjson.loads(f) for f in link.frames)
    assert first[0] == (3 << EPOCH_SHIFT) + 1 and first[1:3] == ["o.s", 1]
    assert answer[:3] == [(3 << EPOCH_SHIFT) + 2, None, 0]
    # A later start of the node numbers above everything of an earlier one.
    later, _ = mailbox(epoch=4)
    assert later._next() > (3 << EPOCH_SHIFT) + (1 << 31)


async def test_acknowledged_deliveries_settle_their_event() -> None:
    box, _ = mailbox()
    link = FakeLink()
    await live(box, link, True, MemoryStore())
    ticket = FakeTicket()
    for n in range(3):
        await box.deliver(message(n), ticket)
    assert ticket.pending == 3 and box.in_flight == 3
    box.on_ack(link.numbers()[1])
    assert ticket.pending == 1 and box.in_flight == 1
    box.on_ack(link.numbers()[2])
    assert ticket.pending == 0 and box.in_flight == 0


async def test_what_a_dropped_stub_did_not_acknowledge_is_replayed_exactly() -> None:
    store = MemoryStore()
    box, _ = mailbox()
    first = FakeLink()
    await live(box, first, True, store)
    for n in range(3):
        await box.deliver(message(n))
    first.lose = True  # these two never reach the runtime
    for n in range(3, 5):
        await box.deliver(message(n))
    received = first.numbers()[-1]
    box.detach(first)
    for n in range(5, 7):  # while away: kept
        assert await box.deliver(message(n)) == "queued"

    second = FakeLink()
    box.attach(second, True)
    await box.resume(store, received)
    assert [m["id"] for m in second.messages()] == [3, 4, 5, 6]  # type: ignore[index]
    assert await box.deliver(message(7)) == "live"
    assert [m["id"] for m in second.messages()][-1] == 7  # type: ignore[index]


async def test_a_plain_stub_gets_kept_messages_once_and_they_leave_the_store() -> None:
    store = MemoryStore()
    box, dirty = mailbox()
    ticket = FakeTicket()
    for n in range(3):
        assert await box.deliver(message(n), ticket) == "queued"
    assert dirty and ticket.pending == 3
    taken = box.take_unstored(0.5)  # kept messages are stored whatever their age
    await store.append(box.session_id, taken)
    box.stored(taken)
    assert ticket.pending == 0
    link = FakeLink()
    box.attach(link, False)
    await box.resume(store, 0)
    assert [m["id"] for m in link.messages()] == [0, 1, 2]  # type: ignore[index]
    assert store.rows[box.session_id] == []


async def test_deliveries_during_a_resume_wait_behind_the_replay_and_are_not_stored_by_it() -> None:
    store = MemoryStore()
    box, _ = mailbox()
    for n in range(2):
        await box.deliver(message(n))
    taken = box.take_unstored(None)
    await store.append(box.session_id, taken)
    box.stored(taken)

    link = FakeLink()
    box.attach(link, True)
    gate = asyncio.Event()
    original = store.after

    async def slow_after(session_id: int, dseq: int, limit: int) -> list[StoredRow]:
        await gate.wait()
        return await original(session_id, dseq, limit)

    store.after = slow_after  # type: ignore[method-assign]
    resuming = asyncio.create_task(box.resume(store, 0))
    await asyncio.sleep(0)
    assert await box.deliver(message(2)) == "queued"
    # A checkpoint meanwhile must leave it to the resume (stored now, it would be missed).
    assert box.take_unstored(None) == []
    gate.set()
    await resuming
    assert [m["id"] for m in link.messages()] == [0, 1, 2]  # type: ignore[index]
    assert box.live


async def test_slow_acknowledgements_are_stored_and_acknowledged_rows_deleted() -> None:
    store = MemoryStore()
    box, _ = mailbox()
    link = FakeLink()
    await live(box, link, True, store)
    ticket = FakeTicket()
    await box.deliver(message(0), ticket)
    assert box.take_unstored(60.0) == []  # not slow yet
    taken = box.take_unstored(0.0)
    await store.append(box.session_id, taken)
    box.stored(taken)
    assert ticket.pending == 0  # stored is settled
    box.on_ack(link.numbers()[0])
    assert box.delete_through == link.numbers()[0]
    await store.remove_through(box.session_id, box.delete_through)
    box.deleted(box.delete_through)
    assert not box.dirty


async def test_a_failed_write_keeps_the_entries() -> None:
    box, _ = mailbox()
    ticket = FakeTicket()
    await box.deliver(message(0), ticket)
    taken = box.take_unstored(None)
    box.not_stored(taken)
    assert ticket.pending == 1
    assert [e.dseq for e in box.take_unstored(None)] == [e.dseq for e in taken]


async def test_a_released_session_settles_everything_it_held() -> None:
    box, _ = mailbox()
    link = FakeLink()
    await live(box, link, True, MemoryStore())
    ticket = FakeTicket()
    await box.deliver(message(0), ticket)
    box.detach(link)
    await box.deliver(message(1), ticket)
    assert [p.oseq for p in box.discard()] == [0, 1]  # what it had not acknowledged
    assert ticket.pending == 0


async def test_a_released_session_returns_only_routed_messages_it_did_not_acknowledge() -> None:
    """Their senders are told; a node's own frame (no origin) and what the stub acknowledged
    (it received them before it left) are not among them."""
    box, _ = mailbox()
    link = FakeLink()
    await live(box, link, True, MemoryStore())
    for n in (1, 2, 3):
        await box.deliver(message(n))
    await box.deliver(Parcel('{"id":9,"type":"response"}'))
    box.on_ack(link.numbers()[0])
    assert [p.oseq for p in box.discard()] == [2, 3]


async def test_a_released_mailbox_keeps_and_stores_nothing_more() -> None:
    """A delivery racing a release (a writer's hand-back, a resume) must not leave entries for a
    session whose rows are gone: every checkpoint of every session would fail on them."""
    box, _ = mailbox()
    ticket = FakeTicket()
    await box.deliver(message(1), ticket)  # kept: nobody is attached
    taken = box.take_unstored(None)
    box.discard()
    box.not_stored(taken)  # the checkpoint writing them failed (the rows are gone)
    assert ticket.pending == 0  # settled: the lane's position is not held back by them
    assert await box.deliver(message(2)) == "released"
    box.give_back(['{"id":3}'])
    assert box.take_unstored(None) == [] and not box.dirty


async def test_what_a_plain_stub_did_not_read_comes_back_before_what_was_kept_after_it() -> None:
    box, _ = mailbox()
    await box.deliver(message(2))  # kept after the drop
    box.give_back([message(1).text])  # its socket had not written message 1
    kept = box.take_unstored(None)
    assert [orjson.loads(e.text)["id"] for e in kept] == [1, 2]
    assert [e.dseq for e in kept] == sorted(e.dseq for e in kept)

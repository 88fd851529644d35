"""One session's deliveries: to its socket when it is live, kept for its resume when it is not.

Every delivery gets a number (``dseq``) that only grows for the session's whole life, across
restarts of the node too. A stub speaking the acknowledged protocol receives it with each
message and acknowledges what it received; until then the delivery stays here ("in flight"),
and the next checkpoint writes it to the database if its acknowledgement is slow. A runtime that
is not connected gets its deliveries kept (and stored at the next checkpoint); when it connects
again they are replayed first, in order, then live traffic follows.

A delivery that carries part of a lane event holds that event's ``Ticket`` until it is settled
(acknowledged by the stub, or stored): the lane's recovery position only moves past events whose
deliveries are all settled. docs/stub-protocol.md and docs/matrix-mapping.md say why.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from ..config import QuotaConfig
from ..storage.pending import StoredDelivery
from .link import Link

# Deliveries are numbered <epoch> << 32 | <counter>: the epoch grows with every start of the node
# (kept in the database), so numbers never go back even though counters live in memory.
EPOCH_SHIFT = 32


class Ticket(Protocol):
    """The lane event a delivery carries part of (see routing/settlement.py)."""

    @property
    def event_id(self) -> str | None: ...

    def hold(self) -> None:
        """One more delivery of the event is not settled yet."""

    def release(self) -> None:
        """One of them is settled."""


class Parcel:
    """One message as delivered: the same for every destination session."""

    __slots__ = ("_digest", "_frame_head", "_payload", "origin", "oseq", "shared", "text")

    def __init__(self, text: str, origin: str | None = None, oseq: int = 0) -> None:
        self.text = text
        # Who numbered it, and its number there: a receiving stub drops what it already has.
        # None for what the node itself says (its answers).
        self.origin = origin
        self.oseq = oseq
        # Delivered to several sessions (a publication to a stream's subscribers): kept in
        # the database once for all of them that are away (storage/pending.py).
        self.shared = False
        self._payload: bytes | None = None
        self._frame_head: bytes | None = None
        self._digest: str | None = None

    def digest(self) -> str:
        """The text's SHA-256 (hex), computed once however many sessions keep it."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.payload()).hexdigest()
        return self._digest

    def payload(self) -> bytes:
        """The message's UTF-8 text, encoded once however many runtimes it goes to."""
        if self._payload is None:
            self._payload = self.text.encode()
        return self._payload

    def frame(self, dseq: int) -> bytes:
        """``[dseq, origin, oseq, message]`` for a stub speaking the acknowledged protocol."""
        if self._frame_head is None:
            origin = orjson.dumps(self.origin)
            self._frame_head = b"," + origin + b",%d," % self.oseq
        return b"[%d%s%s]" % (dseq, self._frame_head, self.payload())


class Tally:
    """Bytes waiting for runtimes (kept, in flight, stored), node-wide and by the client each
    runtime's session counts against (clients.py): what ``quotas.waiting_bytes_total`` and
    ``quotas.waiting_bytes_per_client`` bound, beside each runtime's own quota."""

    def __init__(self) -> None:
        self.total = 0
        self._by_client: dict[str, int] = {}

    def of(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def add(self, client: str, amount: int) -> None:
        self.total += amount
        if client:
            left = self._by_client.get(client, 0) + amount
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)


@dataclass(frozen=True, slots=True)
class Waiting:
    """What waits, in bytes, as the share a sender's next message to a runtime is held to."""

    for_runtime: int
    from_sender: int
    # For every runtime of the client the runtime's session counts against, and node-wide.
    for_client: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class WaitingBounds:
    per_runtime: int
    per_sender: int
    per_client: int
    total: int

    @classmethod
    def of(cls, quotas: QuotaConfig) -> WaitingBounds:
        return cls(
            quotas.waiting_bytes,
            quotas.sender_share,
            quotas.waiting_bytes_per_client,
            quotas.waiting_bytes_total,
        )


def waiting_refusal(waiting: Waiting, size: int, bounds: WaitingBounds) -> tuple[int, str] | None:
    """Why ``size`` more bytes from a sender may not wait for a runtime, with the code its
    sender is answered; None when they may. A sender's share keeps one sender from filling a
    runtime's quota for all the others; the client's and the node's bounds keep one client's
    away runtimes from filling the node's."""
    if waiting.from_sender + size > bounds.per_sender:
        return 413, (
            f"too much from this sender is waiting for the destination runtime "
            f"({waiting.from_sender} of its share of {bounds.per_sender} bytes)"
        )
    if waiting.for_runtime + size > bounds.per_runtime:
        return 413, "too much is waiting for the destination runtime"
    if waiting.for_client + size > bounds.per_client:
        return 413, "too much is waiting for the destination runtime's client"
    if waiting.total + size > bounds.total:
        return 503, "the node keeps its most for runtimes that are away; retry later"
    return None


def sender_of(origin: str | None) -> str:
    """The sender of a parcel numbered in ``origin`` (``<session key>.<numbering>``)."""
    return origin.split(".", 1)[0] if origin else ""


class Entry:
    __slots__ = ("dseq", "parcel", "since", "ticket")

    def __init__(self, dseq: int, parcel: Parcel, ticket: Ticket | None) -> None:
        self.dseq = dseq
        self.parcel = parcel
        self.ticket = ticket
        self.since = time.monotonic()
        if ticket is not None:
            ticket.hold()

    @property
    def text(self) -> str:
        return self.parcel.text

    @property
    def origin(self) -> str | None:
        return self.parcel.origin

    @property
    def oseq(self) -> int:
        return self.parcel.oseq

    @property
    def event_id(self) -> str | None:
        return self.ticket.event_id if self.ticket is not None else None

    @property
    def digest(self) -> str | None:
        """The name its text is kept under once for every session it waits for, when it is
        shared (None: kept in its own row)."""
        return self.parcel.digest() if self.parcel.shared else None

    def settle(self) -> None:
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None


class DeliveryStore(Protocol):
    """Where kept deliveries wait in the database (storage/pending.py)."""

    async def append(self, session_id: int, entries: Sequence[Entry]) -> None: ...

    async def after(self, session_id: int, dseq: int, limit: int) -> Sequence[StoredDelivery]: ...

    async def remove_through(self, session_id: int, dseq: int) -> None: ...


# "live" (on its socket), "queued" (kept for its resume), "released" (the session is gone)
Outcome = str


class Mailbox:
    def __init__(
        self,
        session_id: int,
        epoch: int,
        on_dirty: Callable[[Mailbox], None],
        stored_through: int = 0,
        stored_bytes: int = 0,
    ) -> None:
        self.session_id = session_id
        self._base = epoch << EPOCH_SHIFT
        self._counter = 0
        self._on_dirty = on_dirty
        self._link: Link | None = None
        self._acking = False  # the attached stub acknowledges what it receives
        self._replaying = False
        self._inflight: deque[Entry] = deque()  # sent to an acknowledging stub, not yet acked
        self._kept: list[Entry] = []  # for a runtime that is not live, not stored yet
        self._acked = 0  # the highest number the stub acknowledged
        # The highest number stored in the database, and rows up to which are no longer needed.
        self._stored_through = stored_through
        self.delete_through = 0
        # Bytes of what waits for the runtime (kept, in flight, stored): what its quota limits.
        # Rows stored by an earlier run count as one lump until a delete passes their end.
        self._stored_sizes: deque[tuple[int, int, str]] = deque()
        # The same bytes by sender (the session key its origins start with; "" for the
        # node's own): what each sender's share of the quota limits (routing/ingress.py).
        self._by_sender: dict[str, int] = {}
        # The node's tally this mailbox counts in (``join``), and what it has counted there.
        self._tally: Tally | None = None
        self._client = ""
        self._tallied = 0
        self._stored_bytes = 0
        self._earlier_bytes = stored_bytes
        self._earlier_through = stored_through
        self._memory_bytes = 0
        # Entries taken by a checkpoint and not committed yet: a resume must not read the
        # database before they are there.
        self._writing = 0
        self._written = asyncio.Event()
        self._written.set()
        # Released: nothing is delivered, kept or stored any more (its rows are gone, and a
        # checkpoint writing for it would fail for every session).
        self.discarded = False
        # While the session is taken over from another node process: what arrives waits here,
        # behind what is read again from the rooms (``hold`` / ``unhold``).
        self._held: list[Entry] | None = None

    # -- state --------------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self._link is not None and not self._replaying

    @property
    def waiting_bytes(self) -> int:
        return self._memory_bytes + self._stored_bytes + self._earlier_bytes

    def join(self, tally: Tally, client: str) -> None:
        """Count what waits here in ``tally``, for ``client``, from now on (moved from any
        tally or client it was counted for before)."""
        self.leave()
        self._tally, self._client = tally, client
        self._retally()

    def leave(self) -> None:
        """Count nothing more in the tally (the session left this node process)."""
        if self._tally is not None:
            self._tally.add(self._client, -self._tallied)
        self._tally, self._tallied = None, 0

    def _retally(self) -> None:
        if self._tally is not None:
            now = self.waiting_bytes
            self._tally.add(self._client, now - self._tallied)
            self._tallied = now

    def waiting_from(self, sender: str) -> int:
        """Bytes waiting for the runtime that ``sender`` (a session key) sent."""
        return self._by_sender.get(sender, 0)

    def _count_sender(self, parcel: Parcel, size: int) -> None:
        sender = sender_of(parcel.origin)
        left = self._by_sender.get(sender, 0) + size
        if left > 0:
            self._by_sender[sender] = left
        else:
            self._by_sender.pop(sender, None)

    def _new_entry(self, dseq: int, parcel: Parcel, ticket: Ticket | None) -> Entry:
        self._memory_bytes += len(parcel.text)
        self._count_sender(parcel, len(parcel.text))
        self._retally()
        return Entry(dseq, parcel, ticket)

    def _done_with(self, entry: Entry) -> None:
        """``entry`` leaves memory without being stored: the runtime has it."""
        self._memory_bytes -= len(entry.parcel.text)
        self._count_sender(entry.parcel, -len(entry.parcel.text))
        self._retally()
        entry.settle()

    def _forget_stored(self, through: int) -> None:
        sizes = self._stored_sizes
        while sizes and sizes[0][0] <= through:
            _dseq, size, sender = sizes.popleft()
            self._stored_bytes -= size
            left = self._by_sender.get(sender, 0) - size
            if left > 0:
                self._by_sender[sender] = left
            else:
                self._by_sender.pop(sender, None)
        if through >= self._earlier_through:
            self._earlier_bytes = 0
        self._retally()

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def dirty(self) -> bool:
        return bool(self._kept or self._inflight) or self.delete_through > 0

    def _next(self) -> int:
        self._counter += 1
        return self._base + self._counter

    # -- delivering ---------------------------------------------------------------------------

    async def deliver(self, parcel: Parcel, ticket: Ticket | None = None) -> Outcome:
        if self.discarded:
            return "released"
        if self._held is not None:
            self._held.append(self._new_entry(0, parcel, ticket))
            return "queued"
        dseq = self._next()
        link = self._link
        if link is not None and not self._replaying:
            if self._acking:
                if not self._inflight:
                    self._on_dirty(self)
                self._inflight.append(self._new_entry(dseq, parcel, ticket))
                # A failed send leaves it in flight: the detach that follows keeps it.
                await link.send(parcel.frame(dseq))
                return "live"
            if await link.send(parcel.payload()):
                if ticket is not None:  # a plain stub has it once its socket took it
                    ticket.hold()
                    ticket.release()
                return "live"
        self._kept.append(self._new_entry(dseq, parcel, ticket))
        self._on_dirty(self)
        return "queued"

    async def store_all(self, store: DeliveryStore) -> None:
        """Write everything this mailbox keeps or has in flight to ``store``: before a resume
        replays from it, or when the session goes to another node process."""
        await self._written.wait()
        entries = self._take(None, leave_kept=False)
        if entries:
            try:
                await store.append(self.session_id, entries)
            except BaseException:
                self.not_stored(entries)
                raise
            self.stored(entries)

    def hold(self) -> None:
        """Keep what is delivered aside until ``unhold``."""
        self._held = []

    def unhold(self, before: Sequence[Parcel], ticket: Ticket | None = None) -> None:
        """Keep ``before`` (read again from the rooms; each delivery of it holds ``ticket``
        until settled), then what was held meanwhile, but not twice: a held message that is
        also in ``before`` is dropped."""
        held, self._held = self._held or [], None
        seen = {(p.origin, p.oseq) for p in before if p.origin is not None}
        for parcel in before:
            self._kept.append(self._new_entry(self._next(), parcel, ticket))
        for entry in held:
            if (entry.parcel.origin, entry.parcel.oseq) in seen:
                self._done_with(entry)
                continue
            entry.dseq = self._next()
            self._kept.append(entry)
        if self._kept:
            self._on_dirty(self)

    def on_ack(self, received: int) -> None:
        """The stub has everything numbered up to ``received``."""
        if not self._acking or received <= self._acked:
            return
        self._acked = received
        inflight = self._inflight
        while inflight and inflight[0].dseq <= received:
            self._done_with(inflight.popleft())
        if self._stored_through and received > self.delete_through:
            self.delete_through = min(received, self._stored_through)
            self._on_dirty(self)

    def give_back(self, texts: Sequence[str]) -> None:
        """Messages a plain stub's connection could not write before it was dropped as too slow:
        kept, ahead of anything newer, for the runtime's resume. What was kept meanwhile is
        numbered again after them (nothing kept is stored yet), so the order holds."""
        if self.discarded or not texts:
            return
        entries = [self._new_entry(0, Parcel(text), None) for text in texts] + self._kept
        for entry in entries:
            entry.dseq = self._next()
        self._kept = entries
        self._on_dirty(self)

    # -- storing (called by the checkpoint) ---------------------------------------------------

    def take_unstored(self, min_age: float | None) -> list[Entry]:
        """What should be written now: everything kept, and what a stub has left unacknowledged
        for at least ``min_age`` seconds (all of it when None). In number order. The caller
        must report the outcome with ``stored`` or ``not_stored``.

        What arrives while a resume replays stays in memory: the resume sends it itself once
        the stored part is through."""
        return self._take(min_age, self._replaying and self._link is not None)

    def _take(self, min_age: float | None, leave_kept: bool) -> list[Entry]:
        if self.discarded:
            return []
        if leave_kept:
            taken: list[Entry] = []
        else:
            taken, self._kept = self._kept, []
        inflight = self._inflight
        cutoff = time.monotonic() - min_age if min_age is not None else None
        while inflight and (cutoff is None or inflight[0].since <= cutoff):
            taken.append(inflight.popleft())
        taken.sort(key=lambda e: e.dseq)
        if taken:
            self._writing += 1
            self._written.clear()
        return taken

    def _write_done(self) -> None:
        self._writing -= 1
        if not self._writing:
            self._written.set()

    def stored(self, entries: Sequence[Entry]) -> None:
        """``entries`` are committed to the database: they are settled."""
        if entries:
            self._write_done()
        for entry in entries:
            entry.settle()
            size = len(entry.parcel.text)
            self._memory_bytes -= size
            self._stored_bytes += size
            self._stored_sizes.append((entry.dseq, size, sender_of(entry.parcel.origin)))
        if entries:
            self._stored_through = max(self._stored_through, entries[-1].dseq)
            if self._acked >= entries[0].dseq:
                self.delete_through = min(self._acked, self._stored_through)
                self._on_dirty(self)

    def not_stored(self, entries: Sequence[Entry]) -> None:
        """Writing ``entries`` failed: keep them for the next checkpoint."""
        if entries:
            self._write_done()
        if self.discarded:
            for entry in entries:
                entry.settle()
            return
        self._kept[:0] = entries
        self._on_dirty(self)

    def deleted(self, through: int) -> None:
        self._forget_stored(through)
        if self.delete_through <= through:
            self.delete_through = 0
        if through >= self._stored_through:
            self._stored_through = 0

    # -- attaching ----------------------------------------------------------------------------

    def attach(self, link: Link, acking: bool) -> None:
        """A connection takes over; deliveries wait until ``resume`` has replayed what was kept."""
        if self._link is not None:
            self._requeue_inflight()
        self._link = link
        self._acking = acking
        self._replaying = True

    async def resume(self, store: DeliveryStore, received: int) -> None:
        """Replay what the runtime has not received (after ``received``, for an acknowledging
        stub), oldest first, then go live. Returns early if the link is replaced meanwhile."""
        link = self._link
        if link is None:
            return
        if self._acking:
            self.on_ack(received)
            self._drop_received(received)
        after = max(received, self._acked) if self._acking else 0
        # Store what is in memory, so the replay reads one ordered source.
        await self.store_all(store)
        await self._written.wait()
        while self._link is link:
            rows = await store.after(self.session_id, after, 500)
            if not rows:
                break
            for row in rows:
                parcel = Parcel(row.text, row.origin, row.oseq)
                data = parcel.frame(row.dseq) if self._acking else parcel.payload()
                if not await link.send(data):
                    return
            after = rows[-1].dseq
            if not self._acking:
                # A plain stub has it once it is written; an acknowledging one says so.
                await store.remove_through(self.session_id, after)
                self._forget_stored(after)
        while self._kept and self._link is link:
            entry = self._kept.pop(0)
            if self._acking:
                if not self._inflight:
                    self._on_dirty(self)
                self._inflight.append(entry)
                await link.send(entry.parcel.frame(entry.dseq))
            elif await link.send(entry.parcel.payload()):
                self._done_with(entry)
            else:
                self._kept.insert(0, entry)
                return
        if self._link is link:
            self._replaying = False

    def _drop_received(self, received: int) -> None:
        kept = []
        for entry in self._kept:
            if entry.dseq <= received:
                self._done_with(entry)
            else:
                kept.append(entry)
        self._kept = kept

    def detach(self, link: Link) -> bool:
        """The connection is gone; what it had not acknowledged is kept. False if ``link`` was
        not the attached one (it had been replaced)."""
        if self._link is not link:
            return False
        self._link = None
        self._replaying = False
        self._requeue_inflight()
        return True

    def _requeue_inflight(self) -> None:
        if self._inflight:
            self._kept[:0] = self._inflight
            self._inflight.clear()
        if self._kept:
            self._on_dirty(self)

    def discard(self) -> list[Parcel]:
        """The session is released: nothing more will be delivered or kept. Returns the routed
        messages it had not received (their senders may be told)."""
        self.discarded = True
        unreceived = [e.parcel for e in (*self._inflight, *self._kept) if e.parcel.origin]
        for entry in (*self._inflight, *self._kept):
            entry.settle()
        self._inflight.clear()
        self._kept.clear()
        self._link = None
        self._memory_bytes = self._stored_bytes = self._earlier_bytes = 0
        self._stored_sizes.clear()
        self._by_sender.clear()
        self._retally()
        return unreceived

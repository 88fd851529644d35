"""When a delivered lane event is safe to forget, and the checkpoints that record it.

A lane event's messages are delivered as soon as the homeserver has persisted it. A delivery is
*settled* once it cannot be lost with the node's memory: a stub acknowledged it, a plain stub's
socket took it, or it is stored in the database. Each lane keeps its events in order with a
``Ticket`` counting their unsettled deliveries; its recovery position (stored) is the last
event before the first unsettled one. After a crash the node reads its lanes from those positions
again (routing/recovery.py), so nothing a runtime had not confirmed is lost; what it had is
recognised by its number and dropped (the stub dedupes).

Every ``interval`` the checkpoint stores, in one transaction: what is kept for runtimes that
are away, what live stubs have left unacknowledged for ``slow_ack`` seconds, deletions of stored
rows stubs have since acknowledged, the lanes' positions, and the senders' marks as of those
positions (the highest number of each origin in the settled events).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Collection, Iterable, Iterator

import structlog

from ..observability import NodeMetrics
from ..retry import Backoff
from ..sessions.mailbox import Entry, Mailbox
from ..storage.checkpoints import CheckpointStore
from .marks import SenderMarks

log = structlog.get_logger(__name__)


class Ticket:
    """One delivered lane event: how many of its deliveries are not settled yet, and its
    messages' marks (written by SenderMarks: the event's share of the settled marks)."""

    __slots__ = ("event_id", "marks", "pending", "sealed")

    def __init__(self, event_id: str) -> None:
        self.event_id: str | None = event_id
        self.pending = 0
        self.sealed = False  # all its messages have been handed to their mailboxes
        self.marks: dict[str, int] = {}  # origin -> highest number in this event

    def hold(self) -> None:
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1

    def seal(self) -> None:
        """Every message of the event has been handed on (or, for an event that kept failing,
        given up on): it is settled once the deliveries it holds are. The one place a ticket
        is sealed; delivery, the lanes' give-up and the relay of peers' events call it."""
        self.sealed = True

    @property
    def settled(self) -> bool:
        return self.sealed and self.pending <= 0


class LaneLedger:
    """A lane's delivered events, oldest first, until they are settled."""

    def __init__(self, room_id: str) -> None:
        self.room_id = room_id
        self._open: deque[Ticket] = deque()

    def open(self, event_id: str) -> Ticket:
        ticket = Ticket(event_id)
        self._open.append(ticket)
        return ticket

    @property
    def open_events(self) -> Iterable[Ticket]:
        return self._open

    def advance(self, marks: SenderMarks) -> str | None:
        """Forget the settled events at the front, their marks settled in ``marks``. Returns
        the new position (the last of them), None if it did not move."""
        position = None
        queue = self._open
        while queue and queue[0].settled:
            ticket = queue.popleft()
            marks.settle(ticket)
            position = ticket.event_id
        return position


class Settlement:
    def __init__(
        self,
        store: CheckpointStore,
        metrics: NodeMetrics,
        marks: SenderMarks,
        interval: float = 0.25,
        slow_ack: float = 0.5,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._interval = interval
        self._slow_ack = slow_ack
        self._mailboxes: set[Mailbox] = set()
        self._ledgers: dict[str, LaneLedger] = {}
        # The senders' marks, shared with delivery: settled here as the lanes' positions move.
        self._marks = marks
        self._positions_due: dict[str, str] = {}
        self._lock = asyncio.Lock()

    def drop(self, origins: Collection[str], rooms: Iterable[str] = ()) -> None:
        """Origins whose marks are let go for good (a peer's senders beyond its bound, or idle
        for long), routed and settled, and out of the open events of ``rooms`` (the only lanes
        that carry them), so neither memory nor the table keeps what a peer mints."""
        ledgers = [self._ledgers[room] for room in rooms if room in self._ledgers]
        self._marks.let_go(origins, self._open_events(ledgers))

    def let_go(self, origins: Collection[str]) -> None:
        """Origins of this domain's runtimes let go for good (their senders gone, or beyond a
        client's bound): as ``drop``, from every lane (any may carry them)."""
        self._marks.let_go(origins, self._open_events(list(self._ledgers.values())))

    @staticmethod
    def _open_events(ledgers: list[LaneLedger]) -> Iterator[Ticket]:
        for ledger in ledgers:
            yield from ledger.open_events

    def ledger(self, room_id: str) -> LaneLedger:
        ledger = self._ledgers.get(room_id)
        if ledger is None:
            ledger = self._ledgers[room_id] = LaneLedger(room_id)
        return ledger

    def mailbox_dirty(self, mailbox: Mailbox) -> None:
        """``mailbox`` has something to store, deletes to do, or deliveries in flight that are
        stored if their acknowledgement is slow (called by the mailbox)."""
        self._mailboxes.add(mailbox)

    async def run(self) -> None:
        """Checkpoint every ``interval`` while there is something to write; while the database
        fails, back off (up to 5 s) rather than hammer it."""
        backoff = Backoff(self._interval, max(self._interval, 5.0))
        while True:
            await backoff.wait()
            try:
                await self.checkpoint()
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - logged; the next round tries again
                log.warning("checkpoint failed; retrying", error=repr(exc), retry_in=backoff.delay)

    async def checkpoint(self, final: bool = False) -> None:
        """Write one checkpoint. ``final`` (at shutdown) stores everything not acknowledged."""
        async with self._lock:
            await self._checkpoint(final)

    async def _checkpoint(self, final: bool) -> None:
        for ledger in self._ledgers.values():
            position = ledger.advance(self._marks)
            if position is not None:
                self._positions_due[ledger.room_id] = position
        kept: list[tuple[Mailbox, list[Entry]]] = []
        deletes: list[tuple[Mailbox, int]] = []
        for mailbox in list(self._mailboxes):
            entries = mailbox.take_unstored(None if final else self._slow_ack)
            if entries:
                kept.append((mailbox, entries))
            if mailbox.delete_through:
                deletes.append((mailbox, mailbox.delete_through))
            if not mailbox.dirty:
                self._mailboxes.discard(mailbox)
        if not (kept or deletes or self._positions_due or self._marks.has_due()):
            return
        positions = dict(self._positions_due)
        marks, dropped = self._marks.due()
        try:
            await self._store.commit(
                [(m.session_id, entries) for m, entries in kept],
                [(m.session_id, through) for m, through in deletes],
                positions,
                marks,
                dropped,
            )
        except BaseException:
            self._metrics.checkpoints.labels("failed").inc()
            for mailbox, entries in kept:
                mailbox.not_stored(entries)
            raise
        self._metrics.checkpoints.labels("written").inc()
        for mailbox, entries in kept:
            mailbox.stored(entries)
            self._metrics.kept_deliveries.inc(len(entries))
        for mailbox, through in deletes:
            mailbox.deleted(through)
        for room, event in positions.items():
            if self._positions_due.get(room) == event:
                del self._positions_due[room]
        self._marks.stored(marks, dropped)

    def awaiting_acknowledgements(self) -> bool:
        """Whether a live stub has deliveries it has not acknowledged yet."""
        return any(mailbox.in_flight for mailbox in self._mailboxes)

"""Where a routed message leaves the node for Matrix: the lanes.

A lane is a room the node's bot writes into, one event in flight at a time, batching whatever
queued while the previous event was in flight; every runtime's messages go to one lane, chosen
by its session key, so its order is the room's order. A few lanes let the homeserver persist
several events at once. The moment the homeserver answers a send it has persisted the event:
the senders' numbered messages are acknowledged, and the event's messages are handed to delivery
in the order the lane sent them. docs/matrix-mapping.md explains the design and its numbers.

Before a lane sends anything after a start it reads its room from its recovery position
(routing/recovery.py): what the previous run sent but did not settle is delivered again, and the
senders' marks tell resent messages from new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from appservice.intent import Intent

from ..carrier import LaneEncoder, Routed
from ..observability import NodeMetrics
from ..retry import Backoff, retry
from ..sessions.session import Session
from ..sessions.upstream import Pending, Upstream
from .delivery import Delivery, passing
from .numbering import RoomNumbering
from .settlement import LaneLedger, Ticket
from .stream import BatchStream, OnRefused, StreamLimits, Traffic

log = structlog.get_logger(__name__)

# Delivering one lane event is tried this many times before it is given up (counted), unless
# what fails is a condition that passes (delivery.passing): that is waited out, backing off to
# this many seconds between tries.
DELIVERY_ATTEMPTS = 3
PASSING_WAIT_MAX = 5.0


@dataclass(slots=True)
class Outgoing:
    """One routed message waiting in an outbox."""

    routed: Routed
    session_id: int
    # The sender's numbering state and this message's place in it, when its stub numbers
    # messages: done (acknowledgeable) once the message is durable.
    upstream: Upstream | None = None
    pending: Pending | None = None
    # Shared by the copies of a message going to several outboxes (this domain's lane and peer
    # domains' links): how many of them are not persisted yet.
    parts: list[int] | None = None
    arrived: float = field(default_factory=time.monotonic)
    # A delivered event whose settling waits for this copy to be durable (a message sent on to
    # a peer domain, a peer's message relayed to the domain's lanes).
    settles: Ticket | None = None

    def done(self) -> None:
        if self.settles is not None:
            self.settles.release()
            self.settles = None
        if self.parts is not None:
            self.parts[0] -= 1
            if self.parts[0] > 0:
                return
        if self.upstream is not None and self.pending is not None:
            self.upstream.done(self.pending)


class Outbox(Protocol):
    def has_room_for(self, size: int) -> bool: ...

    async def wait_for_room(self, size: int, timeout: float) -> bool: ...

    def push(self, item: Outgoing) -> None: ...


class StreamOutbox:
    """An outbox that is a batch stream into one room (a lane, a link to a peer domain)."""

    stream: BatchStream[Outgoing]

    def has_room_for(self, size: int) -> bool:
        return self.stream.has_room_for(size)

    async def wait_for_room(self, size: int, timeout: float) -> bool:
        return await self.stream.wait_for_room(size, timeout)

    def push(self, item: Outgoing) -> None:
        self.stream.push(item)


class Outboxes(Protocol):
    """The outbound seam: where the ingress puts a session's routed messages, and the node
    its own."""

    def for_session(self, session: Session) -> Outbox: ...

    def for_node(self) -> Outbox: ...


# Provisions the lane's room: (the intent that writes, the room id); ``refresh`` after a refusal.
LaneTarget = Callable[[int, bool], Awaitable[tuple[Intent, str]]]
# Reads the lane's room after its recovery position, delivering what it finds; returns the
# number of the last event the room holds (0 for an empty room).
Recover = Callable[["Lane", str], Awaitable[int]]


class Lane(StreamOutbox):
    def __init__(
        self,
        index: int,
        target: LaneTarget,
        delivery: Delivery,
        ledger_for: Callable[[str], LaneLedger],
        metrics: NodeMetrics,
        limits: StreamLimits,
        traffic: Traffic,
        on_refused: OnRefused | None = None,
    ) -> None:
        self.index = index
        self._target = target
        self._delivery = delivery
        self._ledger_for = ledger_for
        self._metrics = metrics
        self.room_id: str | None = None
        self.ready = asyncio.Event()
        self._numbers = RoomNumbering()  # the lane's events: consecutive in its room
        # The last event whose delivery is complete (a session handed to another process is
        # read again from there).
        self.delivered_through: str | None = None
        # ... and its number: a reader of another process's lane that names this one waits
        # for it (cluster/sibling_lanes.py), as it waits for the other lanes it names.
        self.delivered_number = 0
        self._deliveries: deque[tuple[list[Outgoing], Ticket, float, int]] = deque()
        # Rooms (other processes' lanes) that readers must have read up to these numbers
        # before this lane's next event: this process took sessions from their writers, and
        # what those runtimes send now must reach a third process after what they sent there.
        self._after: dict[str, int] = {}
        self._after_carried: dict[str, int] | None = None
        self._delivering: asyncio.Task[None] | None = None
        self._delivered = asyncio.Event()  # set whenever an event's delivery is complete
        self.stream: BatchStream[Outgoing] = BatchStream(
            f"lane-{index}",
            LaneEncoder(),
            self._header,
            self._send_target,
            metrics,
            limits,
            on_sent=self._on_sent,
            traffic=traffic,
            admit=self._admit,
            ready=self.ready,
            on_refused=on_refused,
        )

    @property
    def last_number(self) -> int:
        """The number of the lane's last persisted event."""
        return self._numbers.last

    # -- sending --------------------------------------------------------------------------------

    def require_after(self, rooms: dict[str, int]) -> None:
        """Have the lane's next event tell its readers to read ``rooms`` up to these event
        numbers first. Called before the moved runtimes' connections go on, so that nothing
        they send now travels in an event without it."""
        merged = dict(self._after)
        for room, n in rooms.items():
            if n > 0 and room != self.room_id:
                merged[room] = max(n, merged.get(room, 0))
        self._after = merged

    def _header(self) -> dict[str, Any]:
        header: dict[str, Any] = {"lane": self.index, "n": self._numbers.next}
        if self._after:
            header["after"] = self._after
            self._after_carried = self._after
        return header

    async def _send_target(self, refresh: bool) -> tuple[Intent, str]:
        intent, room_id = await self._target(self.index, refresh)
        self.room_id = room_id
        return intent, room_id

    def _admit(self, item: Outgoing) -> bool:
        # A resend of something a previous run of the node already carried (its stub did not
        # get the acknowledgement before the crash) is durable: acknowledge it, do not send.
        if item.routed.oseq <= self._delivery.routed_through(item.routed.sender.origin):
            self._metrics.duplicates.labels("lane").inc()
            item.done()
            return False
        return True

    def _on_sent(self, batch: list[Outgoing], event_id: str) -> None:
        n = self._numbers.persisted()
        if self._after_carried is not None:
            # Sent: what this event named is behind every later one. A requirement added
            # while it was on its way is a new dict, and goes with the next.
            if self._after is self._after_carried:
                self._after = {}
            self._after_carried = None
        for item in batch:
            item.done()
        assert self.room_id is not None
        ticket = self._ledger_for(self.room_id).open(event_id)
        self._deliveries.append((batch, ticket, batch[0].arrived, n))
        if self._delivering is None:
            self._delivering = asyncio.create_task(
                self._deliver(), name=f"deliver:lane-{self.index}"
            )

    async def _deliver(self) -> None:
        """Deliver events in the order they were sent, while the next one is being sent."""
        try:
            while self._deliveries:
                batch, ticket, sent_at, n = self._deliveries.popleft()
                await self._deliver_event([i.routed for i in batch], ticket, sent_at)
                self.delivered_through = ticket.event_id
                self.delivered_number = n
                self._delivered.set()
        finally:
            self._delivering = None

    async def _deliver_event(self, routed: list[Routed], ticket: Ticket, sent_at: float) -> None:
        """A message that fails is answered to its sender inside the delivery, and the event's
        others go on (delivery.py). What reaches here failed for the event as a whole: a
        condition that passes (the database away) is waited out, and delivery goes on from the
        message it stopped at (what was handed on before it is not handed on again). Anything
        else is a bug: tried again a few times, then the event is settled as it stands, so
        that it does not hold the lane's position back for ever (a restart of the node
        replays it from the room), and counted."""
        attempt = 0
        waiting = Backoff(0.2, PASSING_WAIT_MAX)
        while True:
            attempt += 1
            try:
                await self._delivery.deliver(routed, ticket, sent_at)
                return
            except Exception as exc:
                if passing(exc):
                    log.warning("delivery of a lane event waits", lane=self.index, error=repr(exc))
                    await waiting.wait()
                    continue
                log.exception("delivery of a lane event failed", lane=self.index, attempt=attempt)
                if attempt >= DELIVERY_ATTEMPTS:
                    break
                await asyncio.sleep(0.1 * attempt)
        ticket.seal()
        self._metrics.matrix_events_in.labels("delivery_failed").inc()

    # -- start and stop -------------------------------------------------------------------------

    async def start(self, recover: Recover) -> None:
        """Find the room, deliver what a previous run left unsettled, then open for sending."""

        async def recovered() -> None:
            _intent, room_id = await self._send_target(False)
            self._numbers.continue_from(await recover(self, room_id))
            self.delivered_number = self._numbers.last

        def not_ready(exc: Exception, _delay: float) -> None:
            # The homeserver may not be up yet.
            log.warning("lane not ready; retrying", lane=self.index, error=str(exc))

        await retry(recovered, Backoff(0.25, 2.0), on_retry=not_ready)
        self.ready.set()
        log.info("lane ready", lane=self.index, room=self.room_id, last_event=self._numbers.last)

    async def deliver_recovered(self, routed: list[Routed], event_id: str) -> None:
        """Recovery hands over an event read from the room again."""
        assert self.room_id is not None
        await self._delivery.deliver(
            routed, self._ledger_for(self.room_id).open(event_id), recovered=True
        )
        self.delivered_through = event_id

    async def flush(self, timeout: float) -> bool:
        """Wait until what was pushed so far is sent and delivered here (not for what is
        pushed meanwhile); False if either took longer than ``timeout`` seconds."""
        sent = await self.stream.flush(timeout)
        through = self._numbers.last
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.delivered_number < through:
                    self._delivered.clear()
                    await self._delivered.wait()
        return sent and self.delivered_number >= through

    async def close(self) -> int:
        left = await self.stream.close()
        if self._delivering is not None:
            self._delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._delivering
        return left


class Lanes:
    """The node's lanes, and which one carries a session."""

    def __init__(self, lanes: list[Lane]) -> None:
        self._lanes = lanes

    def __iter__(self) -> Iterator[Lane]:
        return iter(self._lanes)

    def for_session(self, session: Session) -> Lane:
        if len(self._lanes) == 1:
            return self._lanes[0]
        # The key is random hex: its value spreads sessions evenly over the lanes, and it never
        # changes, so a session's messages stay in one room, in order.
        return self._lanes[int(session.key, 16) % len(self._lanes)]

    def for_node(self) -> Lane:
        return self._lanes[0]

"""Where routed messages leave the node for runtimes.

A lane hands over each event's messages once the homeserver has persisted it (recovery does the
same for events it reads again after a restart). For each message, in order: drop it if its
sender's number is not above the highest already routed from that origin (a resend the lane
carried twice), find its destinations in the routing table as it is now, and hand it to every
destination session's mailbox: to its socket if connected, else kept for its resume. Receipts of
how many runtimes each message reached go to the journal.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from ..access import AccessMonitor
from ..carrier import Routed
from ..envelope import InvalidMessage, answer, control_error, parse
from ..observability import NodeMetrics
from ..sessions.mailbox import Parcel
from ..sessions.registry import SessionRegistry
from ..sessions.session import Session
from .journal import Journal
from .settlement import Ticket

# Sends a delivered message on to the peer domains it is for (routing/abroad.py ``Onward``).
SendOn = Callable[[Routed, Ticket | None], Awaitable[None]]


class Delivery:
    def __init__(
        self,
        monitor: AccessMonitor,
        sessions: SessionRegistry,
        journal: Journal,
        metrics: NodeMetrics,
        marks: dict[str, int],
        waiting_limit: int = 64 * 1024 * 1024,
        foreign: Callable[[str], str | None] | None = None,
        send_on: SendOn | None = None,
    ) -> None:
        self._monitor = monitor
        self._sessions = sessions
        self._journal = journal
        self._metrics = metrics
        # Bound once: they count every message.
        self._live = metrics.messages_out.labels("live")
        self._queued = metrics.messages_out.labels("queued")
        self._events_delivered = metrics.matrix_events_in.labels("delivered")
        # Per origin, the highest message number routed so far (restored from the settled
        # marks at start, then kept up to date here).
        self.marks = marks
        self._waiting_limit = waiting_limit
        # The peer domain of an address of another domain (None: this node routes inside its
        # domain): a message for one that has no destination here is not a lost one.
        self._foreign = foreign
        # The federation process of a domain on several sends on what its lanes carry for peers.
        self._send_on = send_on

    def routed_through(self, origin: str) -> int:
        return self.marks.get(origin, 0)

    async def deliver(
        self,
        messages: Sequence[Routed],
        ticket: Ticket | None,
        arrived: float | None = None,
        admit: Callable[[Routed], Routed | None] | None = None,
    ) -> None:
        """Deliver one event's messages (``ticket`` None for the relay baseline, which has no
        events); ``arrived`` is when the first of them reached the node (time.monotonic), for
        the routing-latency metric. ``admit`` judges each new message first (a peer domain's:
        the node answers or acts on some itself) and gives what is delivered, or None; the
        sender's mark moves only for what it admitted."""
        delivered: list[int] = []
        marks = self.marks
        for routed in messages:
            origin = routed.sender.origin
            if routed.oseq <= marks.get(origin, 0):
                self._metrics.duplicates.labels("delivery").inc()
                delivered.append(0)
                continue
            if admit is not None:
                admitted = admit(routed)
                if admitted is None:
                    delivered.append(0)
                    continue
                routed = admitted
            # Marked once handed to its mailboxes: an event delivered again after a failure
            # here skips what was handed on before it, and no more.
            delivered.append(await self._deliver_one(routed, ticket))
            if self._send_on is not None:
                await self._send_on(routed, ticket)
            marks[origin] = routed.oseq
            if ticket is not None:
                ticket.marks[origin] = routed.oseq
        if ticket is not None:
            ticket.sealed = True
            if ticket.event_id is not None:
                self._journal.receipt(ticket.event_id, delivered)
        self._events_delivered.inc()
        if arrived is not None:
            self._metrics.route_seconds.observe(time.monotonic() - arrived)

    def _abroad(self, to: tuple[str, ...]) -> bool:
        foreign = self._foreign
        return foreign is not None and any(foreign(address) is not None for address in to)

    async def _gone(self, sender: Session, text: str, reason: str) -> None:
        """Its destination left between the sender's message being taken and its delivery (the
        runtime disconnected): the sender is told, as it would have been a moment earlier."""
        try:
            message = parse(text)
        except InvalidMessage:
            return
        if message.type == "response":
            return  # answering a response would start a loop of error answers
        refusal = answer(message, 404, desc=reason)
        await sender.mailbox.deliver(Parcel(refusal))
        self._journal.rejected(sender.runtime_url, text, refusal)

    async def unreceived(self, parcels: Sequence[Parcel]) -> None:
        """A released session had not received these: their senders are told (404)."""
        for parcel in parcels:
            sender = self._sessions.by_origin(parcel.origin or "")
            if sender is not None and not sender.released:
                await self._gone(sender, parcel.text, "its destination left before receiving it")

    async def _deliver_one(self, routed: Routed, ticket: Ticket | None) -> int:
        sender = self._sessions.by_origin(routed.sender.origin)
        destinations = self._monitor.receivers(routed.to, sender.id if sender is not None else None)
        targets = destinations.sessions
        if not targets:
            self._metrics.messages_out.labels("no_destination").inc()
            # Known with nobody to reach (a stream without subscribers) is no error, nor is a
            # message for another domain (its lane carries it there: routing/abroad.py).
            if sender is not None and not destinations.known and not self._abroad(routed.to):
                await self._gone(sender, routed.text, f"no route to {' '.join(routed.to)} any more")
            return 0
        parcel = Parcel(routed.text, routed.sender.origin, routed.oseq)
        live = queued = 0
        for session_id in targets:
            session = self._sessions.get(session_id)
            if session is None:
                continue
            if session.mailbox.waiting_bytes > self._waiting_limit:
                # A subscriber that stays away with its backlog full (a direct destination's
                # sender is refused 413 at the ingress instead): the message is not kept for
                # it, and the journal says so (the audit trail names what it missed).
                self._metrics.quota_refusals.labels("waiting_bytes").inc()
                self._journal.rejected(
                    session.runtime_url,
                    routed.text,
                    control_error(507, "not kept for this runtime: too much is waiting for it"),
                )
                continue
            outcome = await session.mailbox.deliver(parcel, ticket)
            if outcome == "live":
                live += 1
            elif outcome == "queued":
                queued += 1
        if live:
            self._live.inc(live)
        if queued:
            self._queued.inc(queued)
        return live + queued

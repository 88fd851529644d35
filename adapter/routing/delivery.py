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
from collections.abc import Awaitable, Callable, Mapping, Sequence

import aiohttp
import structlog

from appservice.api import HomeserverUnreachable

from ..access import AccessMonitor
from ..carrier import Routed
from ..envelope import InvalidMessage, answer, control_error, parse
from ..observability import NodeMetrics
from ..sessions.mailbox import Parcel, WaitingBounds, sender_of, waiting_refusal
from ..sessions.registry import SessionRegistry
from ..sessions.session import Session
from ..storage.database import unavailable as database_unavailable
from .journal import Journal
from .marks import SenderMarks
from .settlement import Ticket

log = structlog.get_logger(__name__)

# Sends a delivered message on to the peer domains it is for (federation/abroad.py ``Onward``).
SendOn = Callable[[Routed, Ticket | None], Awaitable[None]]


def passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a condition of the node's surroundings that passes (the database or
    the homeserver away a moment), not something about the message being handled: the shared
    unit waits and goes on from that message, instead of giving the message up."""
    return database_unavailable(exc) or isinstance(
        exc, HomeserverUnreachable | ConnectionError | TimeoutError | aiohttp.ClientError
    )


class Delivery:
    def __init__(
        self,
        monitor: AccessMonitor,
        sessions: SessionRegistry,
        journal: Journal,
        metrics: NodeMetrics,
        marks: SenderMarks,
        waiting_bounds: WaitingBounds | None = None,
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
        # The senders' marks (shared with settlement): a message not above its sender's
        # routed mark is a resend; one handed on moves it. Bound once: every message reads
        # and moves a mark.
        self._routed_marks = marks.routed
        self._route = marks.route
        self.routed_through: Callable[[str], int] = marks.routed_through
        # What may wait for a runtime (None: no bound, for tests of other things).
        self._waiting_bounds = waiting_bounds
        # The peer domain of an address of another domain (None: this node routes inside its
        # domain): a message for one that has no destination here is not a lost one.
        self._foreign = foreign
        # The federation process of a domain on several sends on what its lanes carry for peers.
        self._send_on = send_on

    @property
    def marks(self) -> Mapping[str, int]:
        """The routed marks, by origin."""
        return self._routed_marks

    async def deliver(
        self,
        messages: Sequence[Routed],
        ticket: Ticket | None,
        arrived: float | None = None,
        admit: Callable[[Routed], Routed | None] | None = None,
        recovered: bool = False,
    ) -> None:
        """Deliver one event's messages (``ticket`` None for the relay baseline, which has no
        events); ``arrived`` is when the first of them reached the node (time.monotonic), for
        the routing-latency metric. ``admit`` judges each new message first (a peer domain's:
        the node answers or acts on some itself) and gives what is delivered, or None; the
        sender's mark moves only for what it admitted. ``recovered``: the event was read again
        after a start (routing/recovery.py): see ``_deliver_one``."""
        delivered: list[int] = []
        marks = self._routed_marks
        route = self._route
        for routed in messages:
            origin = routed.sender.origin
            if routed.oseq <= marks.get(origin, 0):
                self._metrics.duplicates.labels("delivery").inc()
                delivered.append(0)
                continue
            # A failure belongs to its message: the event's other messages, of any runtime,
            # go on. Only a condition that passes (the database away) stops the event here,
            # and its lane goes on from this message once it has passed.
            try:
                reached = await self._deliver_item(routed, ticket, admit, recovered)
            except Exception as exc:
                if passing(exc):
                    raise
                reached = await self._item_failed(routed, exc)
            if reached is None:
                delivered.append(0)
                continue
            delivered.append(reached)
            # Marked once handed to its mailboxes: an event delivered again after a failure
            # here skips what was handed on before it, and no more.
            route(origin, routed.oseq, ticket)
        if ticket is not None:
            ticket.seal()
            if ticket.event_id is not None:
                self._journal.receipt(ticket.event_id, delivered)
        self._events_delivered.inc()
        if arrived is not None:
            self._metrics.route_seconds.observe(time.monotonic() - arrived)

    async def _deliver_item(
        self,
        routed: Routed,
        ticket: Ticket | None,
        admit: Callable[[Routed], Routed | None] | None,
        recovered: bool = False,
    ) -> int | None:
        """How many runtimes one message reached; None when ``admit`` did not admit it."""
        if admit is not None:
            admitted = admit(routed)
            if admitted is None:
                return None
            routed = admitted
        reached = await self._deliver_one(routed, ticket, recovered)
        if self._send_on is not None:
            await self._send_on(routed, ticket)
        return reached

    async def _item_failed(self, routed: Routed, exc: Exception) -> int:
        """One message failed inside the node (a bug its content reached): logged and counted,
        and its sender, when it is a runtime of this node, answered 500. It counts as handled:
        handing it over again would fail again, and hold back everything behind it."""
        self._metrics.failed_items.labels("delivery").inc()
        log.error(
            "delivering one message failed; the others go on",
            origin=routed.sender.origin,
            oseq=routed.oseq,
            error=repr(exc)[:300],
        )
        sender = self._sessions.by_origin(routed.sender.origin)
        if sender is None or sender.released:
            return 0
        try:
            await self._gone(sender, routed.text, "internal error in the node delivering it", 500)
        except Exception as again:  # noqa: BLE001 - counted above; the answer is a courtesy
            log.error("answering a failed message failed", error=repr(again)[:300])
        return 0

    def _abroad(self, to: tuple[str, ...]) -> bool:
        foreign = self._foreign
        return foreign is not None and any(foreign(address) is not None for address in to)

    def _too_much_waiting(self, session: Session, routed: Routed) -> str | None:
        """Why ``routed`` may not wait for ``session``'s runtime (mailbox.waiting_refusal)."""
        if self._waiting_bounds is None:
            return None
        sender = sender_of(routed.sender.origin)
        refused = waiting_refusal(
            self._sessions.waiting(session, sender), len(routed.text), self._waiting_bounds
        )
        return refused[1] if refused is not None else None

    async def _gone(self, sender: Session, text: str, reason: str, code: int = 404) -> None:
        """Its destination left between the sender's message being taken and its delivery (the
        runtime disconnected): the sender is told, as it would have been a moment earlier.
        The message is read with the parser and bounds it entered through (envelope.parse),
        and answered with the id it was read with."""
        try:
            message = parse(text)
        except InvalidMessage:
            return
        if message.type == "response":
            return  # answering a response would start a loop of error answers
        refusal = answer(message, code, desc=reason)
        await sender.mailbox.deliver(Parcel(refusal))
        self._journal.rejected(sender.runtime_url, text, refusal)

    async def unreceived(self, parcels: Sequence[Parcel]) -> None:
        """A released session had not received these: their senders are told (404). Each is
        answered on its own: one that fails is logged and counted, and the rest are told."""
        for parcel in parcels:
            sender = self._sessions.by_origin(parcel.origin or "")
            if sender is None or sender.released:
                continue
            try:
                await self._gone(sender, parcel.text, "its destination left before receiving it")
            except Exception as exc:  # noqa: BLE001 - counted; the other senders are told
                self._metrics.failed_items.labels("unreceived").inc()
                log.error("telling a sender its message was not received failed", error=repr(exc))

    async def _deliver_one(self, routed: Routed, ticket: Ticket | None, recovered: bool) -> int:
        sender = self._sessions.by_origin(routed.sender.origin)
        destinations = self._monitor.receivers(routed.to, sender.id if sender is not None else None)
        targets = destinations.sessions
        if not targets:
            self._metrics.messages_out.labels("no_destination").inc()
            # Known with nobody to reach (a stream without subscribers) is no error, nor is a
            # message for another domain (its lane carries it there: federation/abroad.py).
            if sender is None or destinations.known or self._abroad(routed.to):
                return 0
            if recovered:
                # Read again after a stop that kept nothing (its lane's position is from the
                # last checkpoint before it): the lane routed it as soon as the homeserver had
                # it, so its sender already has its outcome. It was delivered, and its
                # receiver has gone since (and took it, or its sender was answered 404 when the
                # receiver went: Delivery.unreceived), or it had no destination then and was
                # answered then. A 404 now would tell the sender of a delivered message that it
                # was not. The price: a message whose destination went while the homeserver
                # was taking it, the node stopping before its answer came back, is answered by
                # nobody (the one case where a 404 now would have been right).
                log.info(
                    "a message read again has no destination any more; its sender had its answer",
                    origin=routed.sender.origin,
                    oseq=routed.oseq,
                )
                return 0
            await self._gone(sender, routed.text, f"no route to {' '.join(routed.to)} any more")
            return 0
        parcel = Parcel(routed.text, routed.sender.origin, routed.oseq)
        parcel.shared = len(targets) > 1
        live = queued = 0
        for session_id in targets:
            session = self._sessions.get(session_id)
            if session is None:
                continue
            full = self._too_much_waiting(session, routed)
            if full is not None:
                # The same bounds as at the ingress, for every runtime reached: a subscriber
                # (which the ingress does not check), and a destination filled since. The
                # message is not kept for it, and the journal says so (the audit trail names
                # what it missed). So one client's runtimes, subscribed to what its own
                # runtimes publish, hold at most its client's share of the node's bytes, and
                # never the node's total that every other runtime's messages need.
                self._metrics.quota_refusals.labels("waiting_bytes").inc()
                self._journal.rejected(
                    session.runtime_url,
                    routed.text,
                    control_error(507, f"not kept for this runtime: {full}"),
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

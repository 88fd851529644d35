"""The lanes the domain's other node processes write, read by this one.

Every process delivers the routed messages of every lane to the sessions it holds: its own
lanes' when the homeserver answers their sends (routing/lanes.py), the other processes' lanes
here. The same appservice bot writes every process's lanes; one /sync loop of the lane reader
(a user of the appservice every lane admits: Synapse serves no /sync to an appservice's own
user) brings their events; each room is an ordered feed (federation/peer_feed.py) that
hands them over strictly in the writer's numbering, reading the room for what /sync skipped.
Each room's recovery position is this process's own, stored with its checkpoints like a lane's:
after a restart, each feed reads its room from there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from appservice.intent import Intent

from .. import carrier
from ..federation.peer_feed import PeerFeed
from ..federation.peers import Peer
from ..observability import NodeMetrics
from ..retry import Backoff
from ..routing.delivery import Delivery
from ..routing.numbering import event_number
from ..routing.settlement import Settlement

log = structlog.get_logger(__name__)

SYNC_TIMEOUT_MS = 20_000
# Events per room one /sync answer carries at most; beyond, the feed reads the room for the rest.
SYNC_TIMELINE_LIMIT = 100
RETRY_MAX_SECONDS = 5.0
# The longest a lane event waits for the rooms it names to be read (see _read_before).
AFTER_SECONDS = 30.0


class SiblingLanes:
    def __init__(
        self,
        bot: Intent,
        reader: Intent,
        delivery: Delivery,
        settlement: Settlement,
        metrics: NodeMetrics,
        own_delivered: Callable[[str], int | None] = lambda _room: None,
    ) -> None:
        self._bot = bot
        # The number of the last event of this process's own lane ``room`` delivered here
        # (None for a room that is not one of its lanes).
        self._own_delivered = own_delivered
        self._reader = reader
        self._delivery = delivery
        self._settlement = settlement
        self._metrics = metrics
        self._feeds: dict[str, PeerFeed] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def rooms(self) -> list[str]:
        return list(self._feeds)

    def positions(self) -> dict[str, str]:
        """Each room's last event handed over."""
        return {room: f.position for room, f in self._feeds.items() if f.position is not None}

    def handled_through(self, room_id: str) -> int:
        """The number of the last event of ``room_id`` handed over (0 for none or unknown)."""
        feed = self._feeds.get(room_id)
        return feed.last_n if feed is not None else 0

    async def newest_number(self, room_id: str) -> int:
        """The writer's number of the newest lane event in ``room_id`` (0 for none)."""
        page = await self._bot.messages(
            room_id,
            direction="b",
            limit=1,
            event_filter={"types": [carrier.BATCH_EVENT], "senders": [self._bot.user_id]},
        )
        for event in page["chunk"]:
            return event_number(event.get("content"))
        return 0

    async def catch_up(self, room_id: str, timeout: float, through: int | None = None) -> bool:
        """Wait until ``room_id`` is read here up to event number ``through`` (its newest when
        None); whether it was within ``timeout`` seconds."""
        target = await self.newest_number(room_id) if through is None else through
        try:
            async with asyncio.timeout(timeout):
                while self.handled_through(room_id) < target:  # noqa: ASYNC110 - polled
                    await asyncio.sleep(0.02)
        except TimeoutError:
            log.warning("a lane of another process not read to its end", room=room_id)
            return False
        return True

    def follow(self, room_id: str, writer: str, position: str | None, start_n: int) -> None:
        """Read ``room_id`` (a lane of process ``writer``) from ``position`` (the last event
        this process handled), or, without one, from the event after number ``start_n``."""
        if room_id in self._feeds:
            return
        feed = PeerFeed(
            room_id,
            Peer(f"process {writer}", "", self._bot.user_id),
            position,
            # The domain's own processes' lanes: no peer's media to bound (see peer_traffic.py).
            lambda event, _deadline: self._deliver(room_id, event),
            self._bot,
            self._metrics,
            last_n=start_n if position is None else 0,
            confirm=False,
        )
        self._feeds[room_id] = feed
        feed.start()
        self._changed.set()
        if self._task is None:
            self._task = asyncio.create_task(self._sync(), name="sibling-lanes-sync")
        log.info("reading another process's lane", process=writer, room=room_id)

    async def _deliver(self, room_id: str, event: dict[str, Any]) -> None:
        event_id = event.get("event_id")
        if not isinstance(event_id, str):
            return
        await self._read_before(carrier.read_after(event.get("content")))
        try:
            routed = await carrier.decode_batch(
                event.get("content"), self._bot.download, relayed=True
            )
        except carrier.CarrierError as exc:
            log.warning("unreadable lane event of another process skipped", error=str(exc))
            self._metrics.matrix_events_in.labels("undecodable").inc()
            return
        await self._delivery.deliver(routed, self._settlement.ledger(room_id).open(event_id))

    async def _read_before(self, after: dict[str, int]) -> None:
        """Hold this event until the rooms it names are delivered here up to its numbers: its
        writer took runtimes from their writers, and a runtime's messages there must be
        delivered (and its sender mark moved, and, at the federation process, sent on to peers)
        before its later ones here, or they would be dropped as routed. One of them may be this
        process's own lane, whose events are delivered as they are sent, by a task of their
        own. A room neither read nor written here is one of a process struck before this one
        started (nothing of it to wait for). A wait is bounded: a lane that does not move
        stalls this one for ``AFTER_SECONDS`` at most."""
        for room, n in after.items():
            if room in self._feeds:
                if self.handled_through(room) < n:
                    self._metrics.lane_waits.inc()
                    await self.catch_up(room, AFTER_SECONDS, n)
                continue
            own = self._own_delivered(room)
            if own is not None and own < n:
                self._metrics.lane_waits.inc()
                await self._own_caught_up(room, n)

    async def _own_caught_up(self, room: str, n: int) -> None:
        try:
            async with asyncio.timeout(AFTER_SECONDS):
                while (self._own_delivered(room) or 0) < n:  # noqa: ASYNC110 - polled
                    await asyncio.sleep(0.02)
        except TimeoutError:
            log.warning("this process's own lane not delivered to the number named", room=room)

    def _filter(self) -> dict[str, Any]:
        nothing: dict[str, Any] = {"types": []}
        return {
            "presence": nothing,
            "account_data": nothing,
            "room": {
                "rooms": list(self._feeds),
                "timeline": {
                    "types": [carrier.BATCH_EVENT],
                    "senders": [self._bot.user_id],
                    "limit": SYNC_TIMELINE_LIMIT,
                },
                "state": nothing,
                "ephemeral": nothing,
                "account_data": nothing,
            },
        }

    async def _sync(self) -> None:
        """Long-poll /sync and push each room's events into its feed. The first answer (no
        ``since``) carries each room's latest events, which its feed drops or holds by number."""
        since: str | None = None
        backoff = Backoff(0.25, RETRY_MAX_SECONDS)
        while True:
            self._changed.clear()
            # A room followed meanwhile changes the filter: the poll in flight is dropped and
            # asked again with it, from the same point.
            request = asyncio.ensure_future(
                self._reader.sync(since, self._filter(), SYNC_TIMEOUT_MS)
            )
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({request, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                if not request.done():
                    request.cancel()
            if not request.done() or request.cancelled():
                continue  # dropped for a new filter (its cancellation may still be under way)
            try:
                answer = request.result()
            except Exception as exc:  # noqa: BLE001 - the homeserver may be away: try again
                log.warning("reading the other processes' lanes failed", error=str(exc))
                await backoff.wait()
                continue
            backoff.reset()
            since = answer["next_batch"]
            joined = answer.get("rooms", {}).get("join", {})
            if isinstance(joined, dict):
                for room_id, room in joined.items():
                    feed = self._feeds.get(room_id)
                    events = _timeline(room)
                    if feed is not None and events:
                        feed.push(events)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for feed in self._feeds.values():
            await feed.close()


def _timeline(room: Any) -> list[dict[str, Any]]:
    timeline = room.get("timeline") if isinstance(room, dict) else None
    events = timeline.get("events") if isinstance(timeline, dict) else None
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []

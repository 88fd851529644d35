"""One peer domain's room for this node: its events handled strictly in the order of the
writer's numbers ``n`` (consecutive), however they arrive, within bounds a peer cannot push.

The push brings most events. An event that arrives early (its predecessors are missing: the push
lost them at a restart of the homeserver, or the homeserver has not fetched them over federation
yet) is held; the missing ones are looked for in the room, reading it backwards from its newest
event (which makes Synapse fetch what it lacks from the peer's server), with back-off.

What a peer can do to this node is bounded:
- held events: at most ``MAX_HELD_EVENTS`` and ``MAX_HELD_BYTES``; beyond, the events furthest
  from the gap are let go (they stay in the room and are read again once the gap is closed);
- a gap: declared lost after ``GAP_DEADLINE_SECONDS`` (logged, counted), and the feed goes on
  with the next event it has;
- an event that cannot be handled (its media cannot be fetched): retried with back-off for
  ``EVENT_RETRY_SECONDS``, then skipped (logged, counted); the feed never dies of it. That
  deadline holds across every attempt and every retry inside one (the handler is given it and
  stops its waits there), so one event never holds the room longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog

from appservice.intent import Intent

from .. import carrier
from ..observability import NodeMetrics
from ..retry import Backoff, retry
from ..routing.flow import CONFIRM_NOW, LEGACY_CONFIRM_EVERY, confirm_interval
from ..routing.numbering import event_number
from .peers import Peer

log = structlog.get_logger(__name__)

PAGE = 100
MAX_HELD_EVENTS = 256
MAX_HELD_BYTES = 4 * 1024 * 1024
GAP_DEADLINE_SECONDS = 30.0
EVENT_RETRY_SECONDS = 30.0
RETRY_MAX_SECONDS = 5.0


class PeerFeed:
    def __init__(
        self,
        room_id: str,
        peer: Peer,
        position: str | None,
        handle: Callable[[dict[str, Any], float], Awaitable[None]],
        bot: Intent,
        metrics: NodeMetrics,
        last_n: int = 0,
        confirm: bool = True,
    ) -> None:
        self.room_id = room_id
        self._confirm_handled = confirm  # read receipts for the peer's flow control
        self.peer = peer
        self._position = position  # the last event handled (recovery starts after it)
        self._handle = handle
        self._bot = bot
        self._metrics = metrics
        self._filter = {"types": [carrier.BATCH_EVENT], "senders": [peer.bot]}
        self._last_n = last_n
        # The highest number seen: above ``_last_n`` with nothing held, events were let go
        # (beyond the bounds) and are read again from the room.
        self._seen = last_n
        self._queue: deque[dict[str, Any]] = deque()
        self._held: dict[int, tuple[dict[str, Any], int]] = {}  # n -> (event, its size)
        self._held_bytes = 0
        self._gap_since: float | None = None
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._confirmed: str | None = None  # the last event the peer was told is handled
        self._confirming: asyncio.Task[None] | None = None
        self._last_receipt = 0.0  # when the last receipt was sent (monotonic)
        # How often the peer wants confirmations while it keeps up (its last event says).
        self._confirm_every = LEGACY_CONFIRM_EVERY
        # Whether an event handled since asked to be confirmed at once (flow.py).
        self._confirm_now = False
        self._asked = asyncio.Event()

    @property
    def held_bytes(self) -> int:
        return self._held_bytes

    @property
    def position(self) -> str | None:
        """The last event handed over."""
        return self._position

    @property
    def last_n(self) -> int:
        """The writer's number of the last event handed over."""
        return self._last_n

    def push(self, events: list[dict[str, Any]]) -> None:
        self._queue.extend(events)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"peer-feed-{self.peer.domain}")

    def start_here(self) -> None:
        """Take pushed events from now on, without reading what the room held before (a room
        this node's database did not know: its history was for another database's sessions)."""
        self._ready.set()

    def start(self) -> None:
        self._starting = asyncio.create_task(self._start(), name=f"peer-feed-start-{self.room_id}")

    async def _start(self) -> None:
        """Read what the room holds after the last event handled (everything, for a room just
        joined), then take pushed events."""

        async def catch_up() -> None:
            if self._position is None:
                # Just joined: what the peer sent before the join is not on this server
                # yet, and reading backwards is what makes it fetch that history.
                await self._read_backward()
            else:
                await self._read_forward()
            await self._deliver_held()

        def not_ready(exc: Exception, _delay: float) -> None:
            # The homeserver may not be up yet.
            log.warning("peer feed not ready; retrying", peer=self.peer.domain, error=str(exc))

        await retry(catch_up, Backoff(0.25, 2.0), on_retry=not_ready)
        self._ready.set()
        self.push([])

    async def close(self) -> None:
        for task in (self._starting, self._task, self._confirming):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # -- holding ------------------------------------------------------------------------------

    def _hold(self, event: dict[str, Any]) -> None:
        if event.get("sender") != self.peer.bot:
            return
        n = event_number(event.get("content"))
        if n <= self._last_n or n in self._held:
            return
        self._seen = max(self._seen, n)
        # The next event is handled at once; only those after a gap cost memory while held.
        size = 0 if n == self._last_n + 1 else len(orjson.dumps(event))
        while self._held and (
            len(self._held) >= MAX_HELD_EVENTS or self._held_bytes + size > MAX_HELD_BYTES
        ):
            furthest = max(self._held)
            if furthest < n:
                self._metrics.peer_events.labels("not_held").inc()
                return  # further from the gap than everything held: read again later
            self._held_bytes -= self._held.pop(furthest)[1]
            self._metrics.peer_events.labels("not_held").inc()
        self._held[n] = (event, size)
        self._held_bytes += size

    async def _read_forward(self) -> None:
        """What the room holds after the position, into the held events."""
        start: str | None = None
        if self._position is not None:
            found = await self._bot.context(self.room_id, self._position)
            if found is not None:
                start = found.get("end")
                self._last_n = max(
                    self._last_n, event_number(found.get("event", {}).get("content"))
                )
        while True:
            page = await self._bot.messages(
                self.room_id, start=start, direction="f", limit=PAGE, event_filter=self._filter
            )
            for event in page["chunk"]:
                self._hold(event)
            end = page.get("end")
            if not page["chunk"] or not isinstance(end, str) or end == start or self._full():
                break
            start = end

    def _full(self) -> bool:
        return len(self._held) >= MAX_HELD_EVENTS or self._held_bytes >= MAX_HELD_BYTES

    async def _read_backward(self) -> None:
        """Hold what the room has after the last event delivered, reading from its newest.
        Paginating backwards is what makes Synapse fetch events it lacks from the server that
        sent them."""
        start: str | None = None
        while True:
            page = await self._bot.messages(
                self.room_id, start=start, direction="b", limit=PAGE, event_filter=self._filter
            )
            lowest = None
            for event in page["chunk"]:
                self._hold(event)
                n = event_number(event.get("content"))
                lowest = n if lowest is None else min(lowest, n)
            end = page.get("end")
            if (
                not page["chunk"]
                or not isinstance(end, str)
                or (lowest is not None and lowest <= self._last_n + 1)
            ):
                return
            start = end

    # -- handling -----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._ready.wait()
            while self._queue:
                self._take_queue()
                await self._deliver_held()
                backoff = Backoff(0.25, RETRY_MAX_SECONDS)
                while self._held or self._seen > self._last_n:
                    # A gap: the events before the held ones are not here yet, or were let go.
                    if self._gap_since is None:
                        self._gap_since = time.monotonic()
                    if time.monotonic() - self._gap_since > GAP_DEADLINE_SECONDS:
                        self._declare_gap_lost()
                    else:
                        await self._find_missing()
                    if not await self._deliver_held():
                        await backoff.wait()
                    self._take_queue()
                    await self._deliver_held()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("peer feed failed", peer=self.peer.domain)
        finally:
            self._task = None

    def _take_queue(self) -> None:
        while self._queue:
            self._hold(self._queue.popleft())

    def _declare_gap_lost(self) -> None:
        if not self._held:
            # Seen, let go, and not found again in the room: no number to go on from.
            log.error("events of a peer could not be read again", peer=self.peer.domain)
            self._seen = self._last_n
            self._gap_since = None
            return
        first_held = min(self._held)
        lost = first_held - self._last_n - 1
        log.error(
            "events of a peer never arrived; going on without them",
            peer=self.peer.domain,
            missing=f"{self._last_n + 1}..{first_held - 1}",
            waited_s=GAP_DEADLINE_SECONDS,
        )
        self._metrics.peer_events.labels("lost").inc(lost)
        self._last_n = first_held - 1
        self._gap_since = None

    async def _find_missing(self) -> None:
        """Read forward from the last event handled (what this server has: events let go
        beyond the bounds), then, if the next one is still missing, backwards from the newest
        (which makes Synapse fetch from the peer what it lacks)."""
        first_held = min(self._held) if self._held else self._seen + 1
        log.info(
            "events missing; reading the room for them",
            peer=self.peer.domain,
            missing=f"{self._last_n + 1}..{first_held - 1}",
        )
        try:
            # Reading only holds events: cut short at the gap's own deadline, whatever the
            # homeserver client's retries inside would take.
            async with asyncio.timeout(GAP_DEADLINE_SECONDS):
                if self._position is not None:
                    await self._read_forward()
                    if self._last_n + 1 in self._held:
                        return
                await self._read_backward()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the homeserver may be away: try again later
            log.warning("reading a peer's room failed", peer=self.peer.domain, error=str(exc))

    async def _deliver_held(self) -> bool:
        """Handle the held events that follow on; whether any was."""
        delivered = False
        while (self._last_n + 1) in self._held:
            event, size = self._held.pop(self._last_n + 1)
            self._held_bytes -= size
            self._observe_age(event)
            await self._handle_with_retry(event)
            self._last_n += 1
            self._gap_since = None
            event_id = event.get("event_id")
            if isinstance(event_id, str):
                self._position = event_id
            content = event.get("content")
            if isinstance(content, dict):
                self._confirm_every = confirm_interval(content)
                if content.get(CONFIRM_NOW) is True:
                    self._confirm_now = True
                    self._asked.set()
            delivered = True
        if delivered and self._confirm_handled and self._confirming is None:
            self._confirming = asyncio.create_task(
                self._confirm(), name=f"peer-feed-confirm-{self.peer.domain}"
            )
        return delivered

    def _observe_age(self, event: dict[str, Any]) -> None:
        """How old the event is as it is handled, from its homeserver's stamp. The peer's side
        stamps it: a clock far off only skews the figure, and a stamp outside what an event may
        hold (one beyond a float would raise) is not counted."""
        stamped = event.get("origin_server_ts")
        if type(stamped) is int and 0 < stamped <= carrier.MAX_NUMBER:
            self._metrics.peer_event_age_seconds.observe(max(0.0, time.time() - stamped / 1000))

    async def _confirm(self) -> None:
        """Tell the peer's node how far its events are handled: a read receipt on the last one,
        which its flow control waits for (flow.py). One receipt in flight; the next one is for
        whatever was handled meanwhile, at most as often as the peer's events ask (flow.py's
        ``CONFIRM_EVERY``; 0.2 s for a node that does not say), unless an event asked for it at
        once (the peer is holding what it sends until it hears). A failed one is not retried:
        the next event handled sends another, and the peer does not wait for ever without."""
        try:
            while self._position is not None and self._position != self._confirmed:
                wait = self._last_receipt + self._confirm_every - time.monotonic()
                if wait > 0 and not self._confirm_now:
                    self._asked.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait):
                            await self._asked.wait()
                    continue
                position, self._confirm_now = self._position, False
                self._last_receipt = time.monotonic()
                try:
                    await self._bot.send_receipt(self.room_id, position)
                except Exception as exc:  # noqa: BLE001 - advisory; see above
                    log.info("confirming to a peer failed", peer=self.peer.domain, error=str(exc))
                    return
                self._confirmed = position
        finally:
            self._confirming = None

    async def _handle_with_retry(self, event: dict[str, Any]) -> None:
        """Handle one event; a failure (its media cannot be fetched, the database is away) is
        retried with back-off, then the event is skipped: later events must not wait for ever.
        Retrying is safe: what was delivered before the failure is not delivered again. The
        handler gets the deadline (the loop's clock) and ends its waits there."""
        deadline = asyncio.get_running_loop().time() + EVENT_RETRY_SECONDS

        def retrying(exc: Exception, delay: float) -> None:
            log.warning(
                "handling a peer's event failed; retrying",
                peer=self.peer.domain,
                error=repr(exc),
                retry_in=delay,
            )

        try:
            await retry(
                lambda: self._handle(event, deadline),
                Backoff(0.5, RETRY_MAX_SECONDS),
                deadline=deadline,
                on_retry=retrying,
            )
        except Exception as exc:  # noqa: BLE001 - retried until the deadline, then skipped
            log.error(
                "a peer's event could not be handled; skipped",
                peer=self.peer.domain,
                event_id=event.get("event_id"),
                error=repr(exc),
            )
            self._metrics.peer_events.labels("skipped").inc()

"""An ordered stream of items sent into one room as batch events, with adaptive batching.

Where a routed message leaves the node for Matrix. The first item goes out at once; whatever
queues while a send is in flight goes together in the next event. Light load thus keeps the
latency of a single event, and heavy load gets large batches (inline up to an event's size, then
through the media repository) instead of one event per message.

One event is in flight per stream, so the room's order is the order items were pushed. A failed
send is retried, with the same transaction id (the homeserver deduplicates), until it succeeds or
the stream is closed; items never skip ahead of a failed batch.

What the homeserver refuses for good is never retried for ever: a refusal about the content (a
4xx other than rate limiting or the room being unavailable) splits the batch in halves, sent
one after the other, until the one item that causes it is alone; that item is handed to
``on_refused`` (its sender gets an error answer) and the stream goes on with the rest.

The header of an event (the room's event number, for streams that number them) is asked for
when a batch is encoded and counts only once the homeserver persisted the event: a retry sends
the same content, and the halves of a split batch are numbered as if it had never been sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from appservice.api import HomeserverUnreachable, MatrixError
from appservice.intent import Intent

from .. import carrier
from ..observability import NodeMetrics
from ..retry import Backoff

log = structlog.get_logger(__name__)

# Resolves where the stream sends: the acting user and the room. ``refresh`` asks to provision
# again (e.g. after the homeserver refused a send because the room is gone).
Target = Callable[[bool], Awaitable[tuple[Intent, str]]]
# Told, in order, of every batch the homeserver has persisted: the items and the event's id.
OnSent = Callable[[list[Any], str], None]
# Told of an item the homeserver refused to carry, with the refusal.
OnRefused = Callable[[Any, "MatrixError"], Awaitable[None]]

# The homeserver refuses a send because of the room, not of what is sent: provision the room
# again and retry. 408 and 429 are the homeserver's own state: retry.
_ROOM_REFUSALS = frozenset({403, 404})
_RETRIED_4XX = frozenset({408, 429})


def refused_for_content(exc: MatrixError) -> bool:
    """Whether the same content would be refused again, whenever it is sent."""
    return 400 <= exc.status < 500 and exc.status not in _ROOM_REFUSALS | _RETRIED_4XX


class Traffic:
    """When a runtime last handed the node a message for the homeserver.

    Synapse persists one event at a time, so an audit event being written when a message
    arrives delays that message by the write. Background streams (the journal) therefore send
    in the gaps of routed traffic, and only past a deadline when there is no gap."""

    def __init__(self) -> None:
        self.last = 0.0

    def touch(self) -> None:
        self.last = time.monotonic()

    async def gap(self, quiet: float, deadline: float) -> None:
        """Return once routed traffic paused for ``quiet`` seconds, or at ``deadline``."""
        while True:
            now = time.monotonic()
            wait = min(self.last + quiet, deadline) - now
            if wait <= 0:
                return
            await asyncio.sleep(wait)


@dataclass(frozen=True, slots=True)
class StreamLimits:
    max_batch_bytes: int = 16 * 1024 * 1024
    max_queued_bytes: int = 64 * 1024 * 1024
    retry_initial: float = 0.25
    # Short enough that routing resumes within seconds of the homeserver answering again.
    retry_max: float = 2.0
    # Least time between two events of the stream. 0 for outboxes (latency matters); the journal
    # waits a little to gather entries, since every event costs the homeserver a write and a
    # transaction back to the node.
    min_interval: float = 0.0
    # For a background stream: the pause in routed traffic it waits for, and the longest an
    # item may wait for one.
    quiet: float = 0.1
    max_delay: float = 5.0
    # Below this much queued, a batch is what fits one event, inline or packed (for an encoder
    # that can tell): an event through the media repository costs an upload and, for every
    # reader, a download, and at a few thousand small messages a second carries fewer per
    # second than events holding their messages do; so it is left for a backlog (an outage's),
    # which it drains fastest. Without this a hiccup made one batch too big for an event, its
    # slower send let the next grow as big, and the lane stayed on media at several times the
    # latency. 0: off.
    one_event_below_bytes: int = 0


T = TypeVar("T")


class BatchStream(Generic[T]):
    def __init__(
        self,
        name: str,
        encoder: carrier.Encoder[T],
        header: Callable[[], dict[str, Any]],
        target: Target,
        metrics: NodeMetrics,
        limits: StreamLimits = StreamLimits(),
        on_sent: OnSent | None = None,
        traffic: Traffic | None = None,
        background: bool = False,
        admit: Callable[[T], bool] | None = None,
        ready: asyncio.Event | None = None,
        on_refused: OnRefused | None = None,
        pace: Callable[[], Awaitable[None]] | None = None,
        drop_when_full: bool = True,
    ) -> None:
        self.name = name
        # A background stream that must keep everything (the journal: what took effect is
        # recorded) never drops; its producers wait for room instead (``wait_for_room``).
        self._drop_when_full = drop_when_full
        self._encoder = encoder
        self._header = header
        self._target = target
        self._metrics = metrics
        self._limits = limits
        self._on_sent = on_sent
        # A routed stream marks the traffic; a background stream waits for its gaps.
        self._traffic = traffic
        self._background = background
        # Items that turn out not to need sending when their batch is taken (resends of what
        # was already carried) are dropped then.
        self._admit = admit
        # Nothing is sent before this is set (a lane waits for its recovery).
        self._ready = ready
        self._on_refused = on_refused
        # Awaited before each batch is taken: the far side may ask the stream to wait, and what
        # queues meanwhile leaves in that one batch (flow.py).
        self._pace = pace
        self._refused = metrics.refused_items.labels(name)
        self._dropped = metrics.stream_dropped.labels(name)
        self._oldest = 0.0  # when the oldest queued item arrived
        self._queue: deque[T] = deque()
        self._queued_bytes = 0
        self._task: asyncio.Task[None] | None = None
        self._in_flight: list[T] = []
        self._last_sent = 0.0
        self._closed = False
        self._drained = asyncio.Event()  # set whenever a batch leaves the queue
        # Items ever queued, and ever done with (sent, refused or not to be sent): ``flush``
        # waits for the second to reach what the first was when it was called.
        self._pushed = 0
        self._done = 0
        self._progress = asyncio.Event()  # set whenever items are done with

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def has_room_for(self, size: int) -> bool:
        return self._queued_bytes + size <= self._limits.max_queued_bytes

    async def wait_for_room(self, size: int, timeout: float | None) -> bool:
        """Wait until ``size`` more bytes fit in the queue; False if they did not within
        ``timeout`` seconds (the homeserver is down or far behind; None: no end)."""
        try:
            async with asyncio.timeout(timeout):
                while not self.has_room_for(size):
                    self._drained.clear()
                    await self._drained.wait()
        except TimeoutError:
            return False
        return True

    def push(self, item: T) -> None:
        if (
            self._background
            and self._drop_when_full
            and not self.has_room_for(self._encoder.size(item))
        ):
            # The homeserver has been away long enough to fill the queue: the entry is not
            # kept (counted), rather than the node's memory growing without end.
            self._dropped.inc()
            return
        if not self._queue:
            self._oldest = time.monotonic()
        if self._traffic is not None and not self._background:
            self._traffic.touch()
        self._queue.append(item)
        self._pushed += 1
        self._queued_bytes += self._encoder.size(item)
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._drain(), name=f"stream:{self.name}")

    async def _drain(self) -> None:
        try:
            if self._ready is not None and not self._ready.is_set():
                await self._ready.wait()
            while self._queue and not self._closed:
                wait = self._last_sent + self._limits.min_interval - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if self._pace is not None:
                    await self._pace()
                if self._background and self._traffic is not None:
                    limits = self._limits
                    await self._traffic.gap(limits.quiet, self._oldest + limits.max_delay)
                queued = len(self._queue)
                self._in_flight = self._take_batch()
                taken = queued - len(self._queue)
                self._oldest = time.monotonic()
                if self._in_flight:
                    await self._send_until_done(self._in_flight)
                self._in_flight = []
                self._last_sent = time.monotonic()
                self._done += taken
                self._progress.set()
        finally:
            self._task = None

    def _take_batch(self) -> list[T]:
        batch: list[T] = []
        taken = 0
        limit = self._limits.max_batch_bytes
        queue, size = self._queue, self._encoder.size
        admit = self._admit
        one_event = self._queued_bytes < self._limits.one_event_below_bytes
        while queue and (not batch or taken + size(queue[0]) < limit):
            item = queue.popleft()
            taken += size(item)
            if admit is None or admit(item):
                batch.append(item)
        fit = getattr(self._encoder, "fit", None)
        if one_event and fit is not None and len(batch) > 1:
            keep = max(1, fit(batch))
            # The rest goes back to the front, in order, for the next event.
            for item in reversed(batch[keep:]):
                queue.appendleft(item)
                taken -= size(item)
            del batch[keep:]
        self._queued_bytes -= taken
        self._drained.set()
        return batch

    async def _send_until_done(self, batch: list[T]) -> None:
        """Send ``batch``; items the homeserver refuses for good are isolated and handed to
        ``on_refused``, the rest is sent in order."""
        parts = [batch]
        while parts:
            part = parts.pop()
            refusal = await self._send_part(part)
            if refusal is None:
                continue
            if len(part) > 1:
                half = len(part) // 2
                parts += [part[half:], part[:half]]
                continue
            self._refused.inc()
            log.warning("item refused by the homeserver", stream=self.name, error=str(refusal))
            if self._on_refused is not None:
                try:
                    await self._on_refused(part[0], refusal)
                except Exception:
                    log.exception("answering a refused item failed", stream=self.name)

    async def _send_part(self, batch: list[T]) -> MatrixError | None:
        """Send ``batch`` as one event, retrying until the homeserver persists it (None) or
        refuses its content (the refusal). Returns None too when the stream is closed."""
        encoded = self._encoder.encode(self._header(), batch)
        backoff = Backoff(self._limits.retry_initial, self._limits.retry_max, jitter=True)
        refresh = False
        txn_id: str | None = None
        uploaded: str | None = None
        while True:
            started = time.monotonic()
            try:
                intent, room_id = await self._target(refresh)
                txn_id = txn_id or intent.new_txn_id()
                if encoded.inline is None and uploaded is None:
                    assert encoded.blob is not None
                    uploaded = await intent.upload(
                        encoded.blob, "application/octet-stream", f"{self.name}.bin"
                    )
                kind, event_id = await self._send(intent, room_id, encoded, uploaded, txn_id)
                self._metrics.matrix_events_out.labels(kind).inc()
                self._metrics.send_seconds.observe(time.monotonic() - started)
                if self._on_sent is not None:
                    self._on_sent(batch, event_id)
                return None
            except asyncio.CancelledError:
                raise
            except MatrixError as exc:
                if refused_for_content(exc):
                    return exc
                # The room is gone or we are no longer in it: provision it again.
                refresh = exc.status in _ROOM_REFUSALS
                log.warning(
                    "batch send refused; retrying",
                    stream=self.name,
                    error=str(exc),
                    retry_in=round(backoff.delay, 2),
                    items=len(batch),
                )
            except HomeserverUnreachable as exc:
                log.warning(
                    "homeserver unreachable; retrying",
                    stream=self.name,
                    error=str(exc),
                    retry_in=round(backoff.delay, 2),
                    items=len(batch),
                )
            except Exception:
                log.exception("batch send failed; retrying", stream=self.name, items=len(batch))
            if self._closed:
                log.error("stream closed with an unsent batch", stream=self.name, items=len(batch))
                return None
            await backoff.wait()

    async def _send(
        self,
        intent: Intent,
        room_id: str,
        encoded: carrier.Encoded,
        uploaded: str | None,
        txn_id: str,
    ) -> tuple[str, str]:
        event_type = self._encoder.event_type
        if encoded.inline is not None:
            event_id = await intent.send_event(room_id, event_type, encoded.inline, txn_id)
            return encoded.kind, event_id
        assert uploaded is not None
        content = encoded.media_content(uploaded)
        return "media", await intent.send_event(room_id, event_type, content, txn_id)

    async def flush(self, timeout: float) -> bool:
        """Wait until everything pushed so far is sent; False if that took longer than
        ``timeout`` seconds. Not for what is pushed meanwhile: under steady traffic the stream
        is never idle, and a session moving to another process waits on this."""
        target = self._pushed
        try:
            async with asyncio.timeout(timeout):
                while self._done < target:
                    self._progress.clear()
                    await self._progress.wait()
            return True
        except TimeoutError:
            return False

    async def close(self) -> int:
        """Stop sending; returns how many items were left unsent (call ``flush`` first)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return len(self._queue) + len(self._in_flight)

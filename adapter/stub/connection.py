"""One stub's WebSocket, as the rest of the node sees it: send a text frame, close."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

import structlog
from aiohttp import WSMsgType, web

log = structlog.get_logger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_INTERNAL_ERROR = 1011
# The session was refused to this connection after the upgrade (a race the checks before it
# could not see): like HTTP 401, the stub must not simply reconnect with the same credentials.
CLOSE_UNAUTHORIZED = 4401
# The runtime's session is held by another node process of the domain: connect again (the
# load balancer may pick another process; the holder takes it).
CLOSE_TRY_AGAIN = 1013
# The most a WebSocket frame's header adds to its payload (a server's frames are not masked).
FRAME_HEADER_BYTES = 10
# Seconds a closing handshake may take before the socket is cut.
CLOSE_DEADLINE = 5.0


class StubConnection:
    """While the socket's buffer is full, frames wait in a backlog written by a task of this
    connection alone: a send never waits on a slow reader (the lane delivering to it delivers
    to everyone else too). A runtime that stays far behind (a quarter of its backlog allowance)
    for ``slow_seconds``, or whose backlog reaches the allowance, is disconnected and what it
    had not received is handed back (``on_overflow``, set once the connection is attached to a
    plain stub's session) to be kept for its resume; a stub that acknowledges deliveries gets
    them again from its mailbox."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        request: web.Request,
        max_backlog_bytes: int,
        slow_seconds: float = 10.0,
    ) -> None:
        self.ws = ws
        self._transport = request.transport
        self._protocol = request.protocol
        self._max_backlog = max_backlog_bytes
        self._soft_backlog = max_backlog_bytes // 4
        self._slow_seconds = slow_seconds
        self._behind: asyncio.TimerHandle | None = None
        self.on_overflow: Callable[[list[str]], None] | None = None
        self._backlog: deque[bytes] = deque()
        self._backlog_bytes = 0
        self._writer: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self.peer = request.remote
        # The host the connection counts against (clients.py); set by the endpoint.
        self.client = ""

    @property
    def open(self) -> bool:
        return not self.ws.closed

    async def send(self, data: str | bytes) -> bool:
        """Queue one text frame for the runtime (given as text, or as its UTF-8 bytes when the
        same message goes to many runtimes); False when the socket is already gone.

        Never waits for the socket: a frame is written at once only when it cannot fill the
        socket's buffer, else it goes through the connection's own writer. A write that fills
        the buffer makes aiohttp wait until the reader drains it, and a runtime that stops
        reading would hold that wait, and so the lane event delivering to it, for as long as
        it likes (one megabyte to a socket that does not read was enough)."""
        if self.ws.closed:
            return False
        payload = data.encode() if isinstance(data, str) else data
        if self._writer is None and self._fits_at_once(len(payload)):
            # Nothing queued, and the write cannot pause the socket, so it cannot wait: most
            # frames (a runtime reading along) are written here, without a task of their own.
            try:
                await self.ws.send_frame(payload, WSMsgType.TEXT)
                return True
            except (ConnectionError, RuntimeError):
                pass  # queued instead: the writer hands it back once the socket is closed
        self._add_backlog(payload)
        if self._backlog_bytes > self._soft_backlog and self._behind is None:
            self._behind = asyncio.get_running_loop().call_later(
                self._slow_seconds, self._still_behind
            )
        return True

    def _fits_at_once(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes can be written now without waiting: aiohttp's
        write waits only while the socket is paused, and the transport pauses it only when its
        buffer goes above the high-water mark. So the socket must not be paused now, and the
        frame must keep the buffer at or below that mark. (Not the low-water mark: uvloop's is
        16 bytes, which no frame fits under, so every frame went through the writer.)"""
        transport = self._transport
        if transport is None or self._backlog or self.ws.compress:
            return False
        if self._protocol.writing_paused:
            return False
        _low, high = transport.get_write_buffer_limits()
        return transport.get_write_buffer_size() + size + FRAME_HEADER_BYTES <= high

    def _still_behind(self) -> None:
        """``slow_seconds`` after it fell far behind: disconnected unless it caught up."""
        self._behind = None
        if self._backlog_bytes > self._soft_backlog // 2 and not self.ws.closed:
            self._too_slow()

    def _caught_up(self) -> None:
        if self._behind is not None:
            self._behind.cancel()
            self._behind = None

    def _too_slow(self) -> None:
        if not self._backlog:
            return
        log.warning(
            "stub too slow; disconnecting it", peer=self.peer, backlog_bytes=self._backlog_bytes
        )
        self._hand_back()
        self._closing = asyncio.create_task(
            self.close(CLOSE_POLICY, "too slow to read", flush=False)
        )

    def _add_backlog(self, payload: bytes) -> None:
        self._backlog.append(payload)
        self._backlog_bytes += len(payload)
        if self._backlog_bytes > self._max_backlog:
            self._too_slow()
            return
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_backlog())

    async def _write_backlog(self) -> None:
        try:
            while self._backlog and not self.ws.closed:
                payload = self._backlog[0]
                await self.ws.send_frame(payload, WSMsgType.TEXT)
                # A runtime found too slow meanwhile had its backlog handed back, this frame
                # with it (it may get it twice; a stub that acknowledges drops the second).
                if self._backlog and self._backlog[0] is payload:
                    self._backlog.popleft()
                    self._backlog_bytes -= len(payload)
                if self._backlog_bytes <= self._soft_backlog // 2:
                    self._caught_up()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._writer = None
            if self._backlog and self.ws.closed:
                self._hand_back()

    def _hand_back(self) -> None:
        left = list(self._backlog)
        self._backlog.clear()
        self._backlog_bytes = 0
        self._caught_up()
        if self.on_overflow is not None:
            self.on_overflow([p.decode() for p in left])

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "", flush: bool = True) -> None:
        """Close with ``code`` once the frames queued before it are written (an answer sent
        just before the close, e.g. to a `disconnect`, arrives first; ``flush`` False: what is
        queued was handed back already). A runtime that does not read gets no more than
        CLOSE_DEADLINE for both, then its socket is cut."""
        try:
            async with asyncio.timeout(CLOSE_DEADLINE):
                writer = self._writer
                if writer is not None and flush:
                    # Shielded: at the deadline the socket is cut, which ends the writer too.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(writer)
                await self.ws.close(code=code, message=reason.encode())
        except (ConnectionError, RuntimeError):
            pass
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()

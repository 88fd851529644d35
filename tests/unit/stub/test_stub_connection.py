"""StubConnection's flow control, against a fake socket whose reader we control."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from adapter.stub import connection as connection_module
from adapter.stub.connection import CLOSE_POLICY, StubConnection


class FakeTransport:
    """An empty socket buffer with a high-water mark of 512 bytes: a larger frame is what will
    fill it (one large frame to a runtime that stopped reading, say)."""

    def __init__(self) -> None:
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 512)

    def abort(self) -> None:
        self.aborted = True


class FakeWebSocket:
    """Writes a frame only when the test lets the reader read one."""

    compress = False

    def __init__(self) -> None:
        self.closed = False
        self.sent: list[bytes] = []
        self.reader = asyncio.Semaphore(0)
        self.close_code: int | None = None

    async def send_frame(self, payload: bytes, _opcode: Any) -> None:
        await self.reader.acquire()
        self.sent.append(payload)

    async def close(self, code: int, message: bytes) -> None:
        self.closed = True
        self.close_code = code


class FakeProtocol:
    writing_paused = False


class FakeRequest:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.protocol = FakeProtocol()
        self.remote = "127.0.0.1"


def at_once(awaitable: Any) -> Any:
    """The result of an awaitable that completes without waiting at all (no clock involved:
    a slow machine cannot change the answer); fails if it would wait."""
    step = awaitable.__await__()
    try:
        next(step)
    except StopIteration as done:
        return done.value
    step.close()
    raise AssertionError("it waited")


async def settle() -> None:
    """Let the tasks started run until they wait for something."""
    for _ in range(5):
        await asyncio.sleep(0)


def connection(ws: FakeWebSocket, handed_back: list[str], slow: float) -> StubConnection:
    conn = StubConnection(
        ws,
        FakeRequest(),  # type: ignore[arg-type]
        max_backlog_bytes=4000,
        slow_seconds=slow,
    )
    conn.on_overflow = handed_back.extend
    return conn


async def test_a_send_never_waits_even_when_the_socket_seemed_free() -> None:
    """The socket's buffer had room, and the frame's write is what fills it: the write waits
    for the reader (as aiohttp's does past its buffer limit), the send does not."""
    ws, back = FakeWebSocket(), []
    conn = connection(ws, back, slow=5)
    assert at_once(conn.send("a" * 1000))
    assert at_once(conn.send("b" * 10))
    ws.reader.release()
    ws.reader.release()
    await settle()
    assert ws.sent == [b"a" * 1000, b"b" * 10] and back == []


class RoomyTransport(FakeTransport):
    """A socket buffer with 64 KiB below its high-water mark (asyncio's and uvloop's default),
    and uvloop's low-water mark of 16 bytes."""

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16, 64 * 1024)


class ReadingWebSocket(FakeWebSocket):
    """A runtime reading along: every write goes straight into the socket."""

    async def send_frame(self, payload: bytes, _opcode: Any) -> None:
        self.sent.append(payload)


async def test_a_frame_that_cannot_fill_the_buffer_is_written_in_the_senders_step() -> None:
    ws, request = ReadingWebSocket(), FakeRequest()
    request.transport = RoomyTransport()
    conn = StubConnection(ws, request, max_backlog_bytes=1 << 20)  # type: ignore[arg-type]
    assert at_once(conn.send("small"))
    assert at_once(conn.send("y" * 20_000))
    # Written before any other task ran: no writer task.
    assert ws.sent == [b"small", b"y" * 20_000]
    # One that would take the buffer past its high-water mark goes to the writer instead.
    assert at_once(conn.send("x" * 70_000))
    assert ws.sent == [b"small", b"y" * 20_000]
    assert at_once(conn.send("after"))  # queued behind it, never ahead
    await settle()
    assert ws.sent == [b"small", b"y" * 20_000, b"x" * 70_000, b"after"]


async def test_a_paused_socket_gets_nothing_but_through_the_writer() -> None:
    """Paused, the socket's buffer is above its high-water mark, or was and has not drained to
    its low one yet: aiohttp's write would wait for it."""
    ws, request = ReadingWebSocket(), FakeRequest()
    request.transport = RoomyTransport()
    request.protocol.writing_paused = True
    conn = StubConnection(ws, request, max_backlog_bytes=1 << 20)  # type: ignore[arg-type]
    assert at_once(conn.send("small"))
    assert ws.sent == []
    await settle()
    assert ws.sent == [b"small"]


async def test_what_was_sent_before_a_close_is_written_before_it() -> None:
    ws, back = FakeWebSocket(), []
    conn = connection(ws, back, slow=5)
    answer = "the answer " * 100  # more than the buffer takes: the reader must read it
    await conn.send(answer)
    closing = asyncio.create_task(conn.close(CLOSE_POLICY, "bye"))
    await settle()
    assert not ws.closed  # the answer is not written yet: the close waits for it
    ws.reader.release()
    await asyncio.wait_for(closing, 5)
    assert ws.sent == [answer.encode()] and ws.closed and back == []


class StuckWebSocket(FakeWebSocket):
    """A closing handshake that never ends (the close frame waits behind what the runtime
    does not read)."""

    async def close(self, code: int, message: bytes) -> None:
        await asyncio.Event().wait()


async def test_a_close_the_runtime_does_not_read_cuts_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection_module, "CLOSE_DEADLINE", 0.05)
    request = FakeRequest()
    conn = StubConnection(StuckWebSocket(), request, max_backlog_bytes=4000)  # type: ignore[arg-type]
    await asyncio.wait_for(conn.close(CLOSE_POLICY, "too slow to read"), 5)
    assert request.transport.aborted


async def test_a_send_never_waits_for_a_reader_far_behind_and_one_catching_up_stays() -> None:
    """The lane delivering to a slow reader delivers to everyone else too: it never waits."""
    ws, back = FakeWebSocket(), []
    conn = connection(ws, back, slow=0.2)
    assert await conn.send("a" * 600)  # below the soft limit (1,000)
    assert at_once(conn.send("b" * 600))  # over it: still at once
    ws.reader.release()  # the reader catches up within slow_seconds
    ws.reader.release()
    # Past slow_seconds: a sleep lasts at least as long as asked, and the check for a reader
    # still behind, due earlier, has run by then (had it not been called off).
    await asyncio.sleep(0.3)
    assert ws.sent == [b"a" * 600, b"b" * 600]
    assert back == [] and not ws.closed


async def test_a_reader_that_stays_behind_is_disconnected_and_nothing_is_lost() -> None:
    ws, back = FakeWebSocket(), []
    conn = connection(ws, back, slow=0.1)
    await conn.send("x" * 600)
    assert at_once(conn.send("y" * 600))
    await asyncio.sleep(0.2)  # still behind after slow_seconds (a sleep is never shorter)
    assert ws.closed and ws.close_code == CLOSE_POLICY
    # What it had not received is handed back to be kept for its resume, in order.
    assert back == ["x" * 600, "y" * 600]


async def test_the_hard_limit_disconnects_at_once() -> None:
    ws, back = FakeWebSocket(), []
    conn = connection(ws, back, slow=5)
    sends = [asyncio.create_task(conn.send(str(i) * 900)) for i in range(5)]  # 4,500 > 4,000
    await asyncio.gather(*sends)
    await settle()  # no time passes: not slow_seconds (5 s) later
    assert ws.closed
    assert "".join(back) == "".join(str(i) * 900 for i in range(5))


# A real socket, on the event loop the node runs on (uvloop: conftest.py): the fakes above
# carry the limits the code reads, and only a real transport says what they are. uvloop's
# low-water mark is 16 bytes, which a check against it let no frame pass.


@contextlib.asynccontextmanager
async def served_socket(reading: bool) -> AsyncIterator[StubConnection]:
    """A StubConnection on a real aiohttp WebSocket over loopback, its client reading along
    or not reading at all."""
    ready: asyncio.Future[StubConnection] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        ready.set_result(StubConnection(ws, request, max_backlog_bytes=64 << 20))
        await done.wait()
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    async def read_along(client: aiohttp.ClientWebSocketResponse) -> None:
        async for _frame in client:
            pass

    try:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"http://127.0.0.1:{port}/") as client,
        ):
            reader = asyncio.create_task(read_along(client)) if reading else None
            try:
                yield await ready
            finally:
                done.set()
                if reader is not None:
                    reader.cancel()
    finally:
        await runner.cleanup()


async def test_frames_to_a_runtime_reading_along_are_written_without_a_task() -> None:
    async with served_socket(reading=True) as conn:
        for i in range(200):
            tasks = len(asyncio.all_tasks())
            assert at_once(conn.send(f"{i:0300d}"))
            assert len(asyncio.all_tasks()) == tasks, f"frame {i} went through a writer task"
            if i % 20 == 0:
                await asyncio.sleep(0.01)  # the reader reads


async def test_sends_to_a_runtime_that_does_not_read_never_wait() -> None:
    """Far more than the kernel's socket buffers and the transport's high-water mark take: each
    send returns at once, and what does not fit waits in the connection's backlog."""
    async with served_socket(reading=False) as conn:
        for i in range(16_000):
            assert at_once(conn.send(f"{i:01000d}"))
        assert conn._backlog_bytes > 0  # where the rest waits

"""The test runtime (tests/support/runtime.py) counts every duplicate it sees: a numbered
delivery its filter drops (``duplicates``) and a message handed on to the runtime a second
time (``delivered_twice``); tests/integration/conftest.py fails a test on the second kind."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.runtime import PyRuntime

MESSAGE = {"id": 1, "type": "update", "from": "hyperty://d/a", "to": "hyperty://d/b", "body": {}}


async def runtime_fed(frames: list[Any], acked: bool) -> PyRuntime:
    """A runtime connected to a stand-in node that sends it ``frames`` after the handshake."""

    async def endpoint(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if acked:
            await ws.receive()  # the connect
            await ws.send_json(
                {
                    "cmd": "connect",
                    "response": 200,
                    "data": {"token": "t", "session": "new", "ack": {"v": 1, "seq": 0}},
                }
            )
        for frame in frames:
            await ws.send_str(json.dumps(frame))
        async for _ in ws:
            pass
        return ws

    app = web.Application()
    app.router.add_get("/stub/connect", endpoint)
    server = TestServer(app)
    await server.start_server()
    runtime = PyRuntime(str(server.make_url("/stub/connect")), "runtime://d/r", acked=acked)
    runtime._server = server  # type: ignore[attr-defined] # closed with the runtime below
    return await runtime.connect()


async def close(runtime: PyRuntime) -> None:
    await runtime.close()
    await runtime._server.close()  # type: ignore[attr-defined]


async def test_a_numbered_delivery_sent_again_is_dropped_and_counted() -> None:
    rt = await runtime_fed([[1, "o", 1, MESSAGE], [1, "o", 1, MESSAGE]], acked=True)
    try:
        assert await rt.receive() == MESSAGE
        assert await rt.nothing_within(0.2)
        assert (rt.duplicates, rt.delivered_twice) == (1, 0)
    finally:
        await close(rt)


async def test_a_message_routed_twice_reaches_the_runtime_twice_and_is_counted() -> None:
    """Under new delivery and origin numbers the filter cannot tell: the runtime gets it twice,
    and the count says so."""
    rt = await runtime_fed([[1, "o", 1, MESSAGE], [2, "o", 2, MESSAGE]], acked=True)
    try:
        assert [await rt.receive(), await rt.receive()] == [MESSAGE, MESSAGE]
        assert (rt.duplicates, rt.delivered_twice, rt.twice_sample) == (0, 1, [MESSAGE])
    finally:
        await close(rt)


async def test_a_plain_runtime_counts_a_message_handed_twice() -> None:
    other = {**MESSAGE, "id": 2}
    rt = await runtime_fed([MESSAGE, other, MESSAGE], acked=False)
    try:
        assert [await rt.receive() for _ in range(3)] == [MESSAGE, other, MESSAGE]
        assert rt.delivered_twice == 1
    finally:
        await close(rt)

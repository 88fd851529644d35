"""The floor baseline: what forwarding a crowd's frames costs on the node's own WebSocket stack.

The same server library, event loop and WebSocket settings as the node's stub endpoint, and
nothing else: each runtime's frame is parsed once, an allocation request gets an address, any
other message is written to the connection that holds its ``to``. No session, no policy, no
database, no Matrix, no acknowledgement. Its CPU per message is the least any node built on these
parts spends on the way in and out; what the node spends above it is its own (docs/benchmark.md,
"The floor under the node's CPU").

    python -m bench.ws_floor -c node-config.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
from pathlib import Path

import orjson
import uvloop
from aiohttp import WSMsgType, web

from adapter.config import load_config
from adapter.stub.endpoint import HARD_LIMIT_FACTOR

ALLOCATION_SUFFIX = "/hyperty-address-allocation"


class Forwarder:
    def __init__(self, domain: str, heartbeat: float, compress: bool, max_frame: int) -> None:
        self._domain = domain
        self._heartbeat = heartbeat
        self._compress = compress
        self._max_frame = max_frame
        self._holders: dict[str, web.WebSocketResponse] = {}
        self._numbers = itertools.count(1)

    async def connect(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            heartbeat=self._heartbeat,
            compress=self._compress,
            max_msg_size=self._max_frame * HARD_LIMIT_FACTOR,
        )
        await ws.prepare(request)
        held: list[str] = []
        try:
            async for frame in ws:
                if frame.type != WSMsgType.TEXT:
                    continue
                message = orjson.loads(frame.data)
                to = message.get("to", "")
                if message.get("type") == "create" and to.endswith(ALLOCATION_SUFFIX):
                    address = f"hyperty://{self._domain}/floor-{next(self._numbers)}"
                    self._holders[address] = ws
                    held.append(address)
                    answer = {
                        "id": message.get("id"),
                        "type": "response",
                        "from": to,
                        "to": message.get("from"),
                        "body": {"code": 200, "value": {"allocated": [address]}},
                    }
                    await ws.send_frame(orjson.dumps(answer), WSMsgType.TEXT)
                    continue
                holder = self._holders.get(to)
                if holder is not None and not holder.closed:
                    await holder.send_frame(frame.data.encode(), WSMsgType.TEXT)
        finally:
            for address in held:
                self._holders.pop(address, None)
        return ws


async def health(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def metrics(_request: web.Request) -> web.Response:
    return web.Response(text="")


async def main(config_path: Path) -> None:
    config = load_config(config_path)
    stub = config.stub
    forwarder = Forwarder(
        config.domain, stub.heartbeat_seconds, stub.compression, stub.max_frame_bytes
    )
    stub_app = web.Application()
    stub_app.router.add_get("/stub/connect", forwarder.connect)
    probe_app = web.Application()
    probe_app.router.add_get("/health", health)
    probe_app.router.add_get("/metrics", metrics)
    runners = [web.AppRunner(stub_app, access_log=None), web.AppRunner(probe_app, access_log=None)]
    listens = [stub.listen, config.appservice.listen]
    for runner, listen in zip(runners, listens, strict=True):
        await runner.setup()
        await web.TCPSite(runner, listen.host, listen.port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, required=True)
    uvloop.run(main(parser.parse_args().config))

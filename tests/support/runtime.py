"""A minimal reTHINK runtime for tests: one stub connection spoken from Python."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from typing import Any

import aiohttp
import orjson


def stub_url(node: Any) -> str:
    """Where a node started by the tests takes stub connections."""
    return f"ws://127.0.0.1:{node.stub_port}/stub/connect"


class PyRuntime:
    """Connects like a stub (v2 handshake by default), sends reTHINK messages and collects what
    the node delivers. ``requests`` answers the node's MN services return.

    With ``acked=True`` it speaks the acknowledged protocol as the bundled stub does: numbered
    messages kept until acknowledged and sent again on ``connect``, numbered deliveries
    acknowledged (unless ``hold_acks``) and deduplicated.

    Duplicates are counted, never dropped unseen: ``duplicates`` counts the numbered deliveries
    its filter dropped (the node sent again what the runtime had: allowed after a crash of the
    node, see docs/stub-protocol.md), and ``delivered_twice`` the reTHINK messages handed on to
    the runtime (its inbox) although it had been handed the same message before: what the node
    promises never happens. A test of "once" asserts ``delivered_twice == 0``, and
    ``duplicates == 0`` unless the node crashed."""

    _ids = itertools.count(1)
    # Every runtime alive: tests/integration/conftest.py checks after each test that none was
    # handed a message twice.
    alive: weakref.WeakSet[PyRuntime] = weakref.WeakSet()

    def __init__(self, stub_url: str, runtime_url: str, acked: bool = False) -> None:
        self.stub_url = stub_url
        self.runtime_url = runtime_url
        self.stub_address = runtime_url.replace("runtime://", "hyperty-runtime://") + "/protostub"
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.frames: list[str] = []
        self.connect_answer: dict[str, Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self.close_code: int | None = None
        self.acked = acked
        self.stub_id = f"py{next(self._ids):06d}stub"
        self.next_seq = 1
        self.unacked: list[tuple[int, str]] = []  # numbered messages the node has not confirmed
        self.node_acks: list[int] = []  # every {cmd: ack, seq} the node sent
        self.received = 0  # highest delivery number handed on
        self.origins: dict[str, int] = {}
        self.duplicates = 0
        self.handed: set[bytes] = set()  # every reTHINK message handed on, as canonical JSON
        self.delivered_twice = 0
        self.twice_sample: list[Any] = []
        self.hold_acks = False
        self.token: str | None = None
        # Set by a test where the same message may rightly reach this runtime twice (the
        # answer to a request its stub sent again, an attacker sending one message twice, a
        # plain stub's receiver across a crash of the node): that test checks what must hold.
        self.twice_allowed = False
        # Sent with the WebSocket upgrade (a test of a proxy's X-Forwarded-For).
        self.headers: dict[str, str] = {}
        PyRuntime.alive.add(self)

    async def connect(
        self,
        handshake: str = "v2",
        token: str | None = None,
        auth: dict[str, str] | None = None,
        hello: bool = False,
    ) -> PyRuntime:
        """``auth``: the credential presented ({type, token}). A runtime speaking the
        acknowledged protocol keeps the session token it was given and presents it again, as
        the bundled stub does."""
        self.session = self.session or aiohttp.ClientSession()
        if self.acked:
            handshake = "v1"
            token = token or self.token
        if handshake == "v2":
            params = {"runtimeURL": self.runtime_url}
            if token:
                params["token"] = token
            if hello:
                params["hello"] = "1"
            if auth:
                params["auth_type"], params["auth_token"] = auth["type"], auth["token"]
            self.ws = await self.session.ws_connect(
                self.stub_url, params=params, headers=self.headers
            )
            if hello:
                self.connect_answer = await self.ws.receive_json(timeout=10)
        else:
            self.ws = await self.session.ws_connect(self.stub_url, headers=self.headers)
            data: dict[str, Any] = {"runtimeURL": self.runtime_url}
            if token:
                data["token"] = token
            if auth:
                data["auth"] = auth
            if self.acked:
                data["ack"] = {"v": 1, "stub": self.stub_id, "received": self.received}
            await self.ws.send_str(orjson.dumps({"cmd": "connect", "data": data}).decode())
            answer = await self.ws.receive_json(timeout=10)
            self.connect_answer = answer
            if answer.get("response") != 200:
                return self
            if self.acked:
                self.token = answer["data"]["token"]
                assert answer["data"]["ack"]["v"] == 1, answer
                if answer["data"]["session"] == "new":
                    self.received = 0
                self._acknowledged(answer["data"]["ack"]["seq"])
        self._reader = asyncio.create_task(self._read())
        for seq, text in list(self.unacked):
            await self.ws.send_str(f"[{seq},{text}]")
        return self

    def kept(self) -> dict[str, Any]:
        """What the bundled stub keeps across a reload, where the runtime keeps its runtimeURL
        (docs/stub-protocol.md, "A runtime that reloads"): the token, the delivery number and
        each origin's highest number handed on (this runtime acknowledges what it hands on at
        once, so both are as of what it acknowledged); ``restore`` gives it to the new
        instance."""
        return {"token": self.token, "received": self.received, "origins": dict(self.origins)}

    def restore(self, kept: dict[str, Any]) -> None:
        self.token = kept["token"]
        self.received = kept["received"]
        self.origins = dict(kept["origins"])

    def _acknowledged(self, seq: int) -> None:
        self.node_acks.append(seq)
        self.unacked = [(s, t) for s, t in self.unacked if s > seq]

    async def _read(self) -> None:
        assert self.ws is not None
        async for frame in self.ws:
            if frame.type == aiohttp.WSMsgType.TEXT:
                self.frames.append(frame.data)
                parsed = orjson.loads(frame.data)
                if isinstance(parsed, list) and self.acked:
                    await self._numbered(*parsed)
                elif isinstance(parsed, dict) and parsed.get("cmd") == "ack" and self.acked:
                    self._acknowledged(parsed["seq"])
                else:
                    await self._hand_on(parsed)
        self.close_code = self.ws.close_code

    async def _hand_on(self, message: Any) -> None:
        if isinstance(message, dict) and "type" in message:
            key = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
            if key in self.handed:
                self.delivered_twice += 1
                if len(self.twice_sample) < 5:
                    self.twice_sample.append(message)
            self.handed.add(key)
        await self.inbox.put(message)

    async def _numbered(self, dseq: int, origin: str | None, oseq: int, message: Any) -> None:
        fresh = dseq > self.received
        if fresh:
            self.received = dseq
        if fresh and origin is not None:
            if oseq <= self.origins.get(origin, 0):
                fresh = False
            else:
                self.origins[origin] = oseq
        if fresh:
            await self._hand_on(message)
        else:
            self.duplicates += 1
        if not self.hold_acks and self.ws is not None and not self.ws.closed:
            await self.ws.send_str(orjson.dumps({"cmd": "ack", "received": self.received}).decode())

    async def send(self, message: dict[str, Any] | str) -> None:
        assert self.ws is not None
        text = message if isinstance(message, str) else orjson.dumps(message).decode()
        if self.acked:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            self.unacked.append((seq, text))
            if not self.ws.closed:
                await self.ws.send_str(f"[{seq},{text}]")
            return
        await self.ws.send_str(text)

    async def receive(self, timeout: float = 10.0) -> Any:
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def receive_n(self, n: int, timeout: float = 20.0) -> list[Any]:
        async with asyncio.timeout(timeout):
            return [await self.inbox.get() for _ in range(n)]

    async def nothing_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.inbox.get(), seconds)
        except TimeoutError:
            return True
        return False

    async def request(
        self,
        to: str,
        type_: str,
        body: dict[str, Any] | None = None,
        from_: str | None = None,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        msg_id = next(self._ids)
        message: dict[str, Any] = {
            "id": msg_id,
            "type": type_,
            "from": from_ or f"{self.stub_address}/registry/allocation",
            "to": to,
        }
        if body is not None:
            message["body"] = body
        await self.send(message)
        async with asyncio.timeout(timeout):
            while True:
                answer = await self.inbox.get()
                if answer.get("id") == msg_id and answer.get("type") == "response":
                    return dict(answer)

    async def allocate(
        self,
        domain: str,
        number: int = 1,
        scheme: str = "hyperty",
        endpoint: str = "hyperty-address-allocation",
        key: str | None = None,
    ) -> list[str]:
        value: dict[str, Any] = {"number": number}
        if key:
            value["allocationKey"] = key
        answer = await self.request(
            f"domain://msg-node.{domain}/{endpoint}", "create", {"scheme": scheme, "value": value}
        )
        assert answer["body"]["code"] == 200, answer
        return list(answer["body"]["value"]["allocated"])

    async def disconnect(self) -> None:
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_str(
                orjson.dumps(
                    {"cmd": "disconnect", "data": {"runtimeURL": self.runtime_url}}
                ).decode()
            )
            with _suppress():
                await asyncio.wait_for(self._reader or asyncio.sleep(0), 5)
        await self.close()

    async def drop(self) -> None:
        """Close the socket without `disconnect` (a network loss, as the node sees it)."""
        if self.ws is not None:
            await self.ws.close()
        # Already done when `disconnect` gave up waiting for it (wait_for cancelled it then).
        if self._reader is not None and not self._reader.done():
            with _suppress():
                await asyncio.wait_for(self._reader, 5)

    async def close(self) -> None:
        await self.drop()
        if self.session is not None:
            await self.session.close()
            self.session = None


def _suppress() -> contextlib.suppress:
    return contextlib.suppress(Exception)

"""`/stub/connect`: where a runtime's stub connects and every frame it sends enters the node.

The protocol (handshakes, control frames, close codes) is in docs/stub-protocol.md. This module
owns the socket: it authenticates the handshake, keeps frames within limits, tells control frames
from reTHINK messages and hands the latter to the Ingress. Bad frames are answered and the
connection stays usable; nothing a runtime sends can affect another runtime's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
import structlog
from aiohttp import WSMsgType, web

from ..config import StubConfig
from ..messages import InvalidMessage, control_error, dumps
from ..observability import NodeMetrics
from ..routing.ingress import Ingress
from ..sessions import Session, SessionManager
from .connection import CLOSE_GOING_AWAY, CLOSE_NORMAL, StubConnection
from .tokens import TokenRejected

log = structlog.get_logger(__name__)

# Frames above the configured limit are answered 413; frames above this multiple of it are cut
# off by the WebSocket layer itself (close 1009) so no one can make the node buffer gigabytes.
HARD_LIMIT_FACTOR = 4


class StubEndpoint:
    def __init__(
        self,
        config: StubConfig,
        domain: str,
        sessions: SessionManager,
        ingress: Ingress,
        metrics: NodeMetrics,
        max_backlog_bytes: int,
    ) -> None:
        self._config = config
        self._domain = domain
        self._sessions = sessions
        self._ingress = ingress
        self._metrics = metrics
        self._max_backlog = max_backlog_bytes
        self._open: set[StubConnection] = set()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/stub/connect", self.handle)
        app.on_shutdown.append(self._close_all)

    async def _close_all(self, _app: web.Application) -> None:
        await asyncio.gather(
            *(c.close(CLOSE_GOING_AWAY, "node shutting down") for c in list(self._open)),
            return_exceptions=True,
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if len(self._open) >= self._config.max_connections:
            raise web.HTTPServiceUnavailable(text="too many stub connections; retry later")
        runtime_url = request.query.get("runtimeURL")
        token = request.query.get("token") or None
        if runtime_url is not None:
            if not runtime_url.strip():
                raise web.HTTPBadRequest(text="runtimeURL is empty")
            if token is not None:
                try:
                    self._sessions.check_token(runtime_url, token)
                except TokenRejected as exc:
                    raise web.HTTPUnauthorized(text=str(exc)) from None

        ws = web.WebSocketResponse(
            heartbeat=self._config.heartbeat_seconds,
            compress=self._config.compression,
            max_msg_size=self._config.max_frame_bytes * HARD_LIMIT_FACTOR,
        )
        await ws.prepare(request)
        session: Session | None = None
        holder: dict[str, Session] = {}
        conn = StubConnection(
            ws, request, self._max_backlog, on_overflow=lambda texts: self._give_back(holder, texts)
        )
        self._open.add(conn)
        try:
            if runtime_url is not None:
                session = await self._attach(
                    conn, runtime_url, token, holder, answer=request.query.get("hello") == "1"
                )
            async for frame in ws:
                if frame.type == WSMsgType.TEXT:
                    session = await self._on_text(conn, session, holder, frame.data)
                    if session is not None and session.released:
                        break
                elif frame.type == WSMsgType.BINARY:
                    await conn.send(
                        control_error(415, "binary frames are not supported; send JSON text frames")
                    )
                elif frame.type == WSMsgType.ERROR:
                    log.info("stub connection error", error=str(ws.exception()))
                    break
        finally:
            self._open.discard(conn)
            if session is not None and not session.released:
                await self._sessions.detach(session, conn)
            await conn.close()
        return ws

    def _give_back(self, holder: dict[str, Session], texts: list[str]) -> None:
        session = holder.get("session")
        if session is not None:
            self._sessions.give_back(session, texts)

    async def _attach(
        self,
        conn: StubConnection,
        runtime_url: str,
        token: str | None,
        holder: dict[str, Session],
        answer: bool,
    ) -> Session:
        session, resumed = await self._sessions.attach(runtime_url, conn, token)
        holder["session"] = session
        log.info("runtime connected", runtime=runtime_url, resumed=resumed, peer=conn.peer)
        if answer:
            await conn.send(
                dumps(
                    {
                        "cmd": "connect",
                        "response": 200,
                        "data": {
                            "runtimeURL": runtime_url,
                            "session": "resumed" if resumed else "new",
                            "token": self._sessions.token_for(session),
                            "domain": self._domain,
                        },
                    }
                )
            )
        return session

    async def _on_text(
        self, conn: StubConnection, session: Session | None, holder: dict[str, Session], text: str
    ) -> Session | None:
        limit = self._config.max_frame_bytes
        if len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit):
            await self._refuse_oversize(conn, session, text, limit)
            return session
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            await self._ingress.refuse_frame(
                session, conn, text, InvalidMessage(400, f"malformed JSON: {exc}")
            )
            return session
        if isinstance(parsed, dict) and "cmd" in parsed and "type" not in parsed:
            return await self._on_command(conn, session, holder, parsed)
        if session is None:
            await conn.send(
                control_error(
                    400,
                    "send {cmd:'connect', data:{runtimeURL}} first, or connect with ?runtimeURL=",
                    cmd="connect",
                )
            )
            return None
        if not isinstance(parsed, dict):
            await self._ingress.refuse_frame(
                session,
                conn,
                text,
                InvalidMessage(
                    400, f"a message must be a JSON object, not {type(parsed).__name__}"
                ),
            )
            return session
        await self._ingress.on_message(session, conn, text, parsed)
        return session

    async def _refuse_oversize(
        self, conn: StubConnection, session: Session | None, text: str, limit: int
    ) -> None:
        reason = f"message of {len(text.encode())} bytes exceeds the limit of {limit}"
        partial: dict[str, Any] | None = None
        with contextlib.suppress(orjson.JSONDecodeError):
            candidate = orjson.loads(text)
            partial = candidate if isinstance(candidate, dict) else None
        await self._ingress.refuse_frame(session, conn, None, InvalidMessage(413, reason, partial))

    async def _on_command(
        self,
        conn: StubConnection,
        session: Session | None,
        holder: dict[str, Session],
        frame: dict[str, Any],
    ) -> Session | None:
        cmd = frame.get("cmd")
        data = frame.get("data") if isinstance(frame.get("data"), dict) else frame.get("body")
        data = data if isinstance(data, dict) else {}
        if cmd == "connect":
            if session is not None:
                await conn.send(
                    control_error(409, f"already connected as {session.runtime_url}", cmd="connect")
                )
                return session
            runtime_url = data.get("runtimeURL")
            if not isinstance(runtime_url, str) or not runtime_url.strip():
                await conn.send(control_error(400, "connect needs data.runtimeURL", cmd="connect"))
                return None
            token = data.get("token")
            try:
                return await self._attach(
                    conn,
                    runtime_url,
                    token if isinstance(token, str) and token else None,
                    holder,
                    answer=True,
                )
            except TokenRejected as exc:
                await conn.send(control_error(401, str(exc), cmd="connect"))
                return None
        if cmd == "disconnect":
            if session is None:
                await conn.send(control_error(400, "not connected", cmd="disconnect"))
                return None
            named = data.get("runtimeURL")
            if named is not None and named != session.runtime_url:
                await conn.send(
                    control_error(
                        400, f"this connection is {session.runtime_url}", cmd="disconnect"
                    )
                )
                return session
            await self._sessions.release(session)
            log.info("runtime disconnected", runtime=session.runtime_url)
            await conn.send(dumps({"cmd": "disconnect", "response": 200}))
            await conn.close(CLOSE_NORMAL, "disconnected")
            return session
        await conn.send(control_error(400, f"unknown command {cmd!r}", cmd=str(cmd)))
        return session

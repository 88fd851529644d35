"""`/stub/connect`: where a runtime's stub connects and every frame it sends enters the node.

The protocol (handshakes, numbered messages and acknowledgements, control frames, close codes)
is in docs/stub-protocol.md. This module owns the socket: it authenticates the handshake, keeps
frames within limits, tells control frames from reTHINK messages and hands the latter to the
Ingress. Bad frames are answered and the connection stays usable; nothing a runtime sends can
affect another runtime's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson
import structlog
from aiohttp import WSMessage, WSMsgType, web

from ..addresses import runtime_url_problem
from ..bounds import Bound, BoundRefused
from ..clients import ClientKeys
from ..config import StubConfig
from ..envelope import InvalidMessage, control_error, dumps
from ..identity.authenticator import Authenticator, parse_credential
from ..identity.model import Identity, IdentityRejected, IdentityUnavailable
from ..observability import NodeMetrics
from ..routing.ingress import Ingress
from ..routing.journal import Journal
from ..sessions.link import CLOSE_REPLACED
from ..sessions.registry import SessionRefused, SessionRegistry, SessionsFull
from ..sessions.session import AckHello, Attachment
from ..sessions.tokens import TokenRejected
from ..storage.sessions import HeldElsewhere
from ..tasks import BackgroundTasks
from .acks import AckSender
from .connection import (
    CLOSE_GOING_AWAY,
    CLOSE_INTERNAL_ERROR,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    CLOSE_UNAUTHORIZED,
    StubConnection,
)
from .origins import OriginCheck
from .pacing import ClientPaces, Pace
from .protocol import (
    BadFrame,
    BadHello,
    connect_answer,
    hello_from_query,
    parse_hello,
    split_numbered,
    wire_number,
)

log = structlog.get_logger(__name__)
# An acknowledgement frame is tiny; anything longer is a message.
ACK_FRAME_MAX = 256

# Frames above the configured limit are answered 413; frames above this multiple of it are cut
# off by the WebSocket layer itself (close 1009) so no one can make the node buffer gigabytes.
HARD_LIMIT_FACTOR = 4
# The frames a runtime's rate counts: all it sends but its closing handshake.
PACED_FRAMES = frozenset({WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.PING, WSMsgType.PONG})


class StubEndpoint:
    def __init__(
        self,
        config: StubConfig,
        domain: str,
        sessions: SessionRegistry,
        ingress: Ingress,
        authenticator: Authenticator,
        journal: Journal,
        acks: AckSender,
        metrics: NodeMetrics,
        max_backlog_bytes: int,
    ) -> None:
        self._config = config
        self._domain = domain
        self._sessions = sessions
        self._ingress = ingress
        self._authenticator = authenticator
        self._journal = journal
        self._acks = acks
        self._metrics = metrics
        self._max_backlog = max_backlog_bytes
        self._origins = OriginCheck(config.allowed_origins, config.known_hosts)
        self._open: set[StubConnection] = set()
        # Who each connection is (clients.py), and the sockets each client holds (bounds.py).
        self._clients = ClientKeys(config.trusted_proxies)
        self._sockets = Bound(
            "connections",
            config.max_connections_per_client,
            config.max_connections,
            metrics.bound_refused,
            "stub connections",
        )
        # What all the connections of one client send together is paced too (pacing.py).
        self._client_paces = ClientPaces(
            config.client_messages_per_second,
            config.client_messages_burst,
            config.client_bytes_per_second,
            config.client_bytes_burst,
        )
        # Open sockets that have not completed their handshake, each with its deadline.
        self._handshaking: dict[StubConnection, asyncio.TimerHandle] = {}
        self._handshaking_gauge = metrics.stub_connections.labels("handshaking")
        # Set while the node stops: frames are no longer read (a numbered message not taken in
        # is sent again by its stub to the next run).
        self.closing = False
        # Frames being decided now: a stop waits for them, so that what they did is
        # acknowledged to their stubs before the sockets close (else a stub sends a service
        # request again to the next run, which would execute it twice).
        self._deciding = 0
        self._decided = asyncio.Event()
        self._decided.set()
        self._closing = BackgroundTasks(
            "stub_endpoint", metrics.background_failures.labels("stub_endpoint").inc
        )

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def stop_reading(self, timeout: float) -> None:
        """Read no more frames, and wait (at most ``timeout``) for those being decided."""
        self.closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._decided.wait(), timeout)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/stub/connect", self.handle)

    async def close_all(self) -> None:
        await asyncio.gather(
            *(c.close(CLOSE_GOING_AWAY, "node shutting down") for c in list(self._open)),
            return_exceptions=True,
        )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        if self.closing:
            raise web.HTTPServiceUnavailable(text="the node is shutting down; retry later")
        host = self._clients.host(request.remote, request.headers)
        early = self._sockets.refusal(host)
        if early is not None:
            self._metrics.bound_refused("connections", early.scope)
            raise _http_refusal(early)
        refusal = self._origins.refusal(request)
        if refusal is not None:
            self._metrics.messages_in.labels("refused_origin").inc()
            raise web.HTTPForbidden(text=refusal)
        query = request.query
        runtime_url = query.get("runtimeURL")
        token = query.get("token") or None
        try:
            hello = hello_from_query(query)
        except BadHello as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        identity: Identity | None = None
        answer = query.get("hello") == "1" or hello is not None
        if runtime_url is not None:
            # v2: everything is in the query, so a refusal is the upgrade's HTTP status.
            problem = runtime_url_problem(runtime_url, self._domain)
            if problem is not None:
                raise web.HTTPBadRequest(text=problem)
            if not answer and self._config.tokenless_sessions == "refuse":
                raise web.HTTPUnauthorized(
                    text="this node hands every stub a session token: connect with hello=1 "
                    "(or the v1 handshake)"
                )
            try:
                identity = await self._authenticate(query.get("auth_type"), query.get("auth_token"))
                await self._sessions.admit(runtime_url, token, identity)
                holder = await self._sessions.held_elsewhere(runtime_url, token, identity)
            except (TokenRejected, IdentityRejected, SessionRefused) as exc:
                raise web.HTTPUnauthorized(text=str(exc)) from None
            except IdentityUnavailable as exc:
                raise web.HTTPServiceUnavailable(text=exc.reason) from None
            except HeldElsewhere as exc:  # moving here took too long
                holder = exc.holder or ""
            if holder is not None:
                raise web.HTTPServiceUnavailable(
                    text=_held_elsewhere(holder), headers={"Retry-After": "1"}
                )
            full = self._sessions.place_refusal(runtime_url, _client(host, identity))
            if full is not None:
                self._metrics.bound_refused("sessions", full.scope)
                raise _http_refusal(full)

        # The socket counts against its client from here (taken in one step with the check:
        # the authentication above waited, and others may have connected meanwhile).
        client = _client(host, identity)
        taken = self._sockets.take(client)
        if taken is not None:
            raise _http_refusal(taken)
        try:
            return await self._serve(
                request, arrived, host, client, runtime_url, token, hello, identity, answer
            )
        finally:
            self._sockets.give(client)

    async def _serve(
        self,
        request: web.Request,
        arrived: float,
        host: str,
        client: str,
        runtime_url: str | None,
        token: str | None,
        hello: AckHello | None,
        identity: Identity | None,
        answer: bool,
    ) -> web.StreamResponse:
        """One stub socket from its upgrade to its close: attached at once (v2, everything in
        the query) or by its first frame (v1 handshake), then read frame by frame."""
        ws = await self._upgrade(request)
        conn = StubConnection(ws, request, self._max_backlog)
        conn.client = host
        attachment: Attachment | None = None
        self._open.add(conn)
        if runtime_url is None:
            self._await_handshake(conn)
        config = self._config
        pace = Pace(
            config.messages_per_second,
            config.messages_burst,
            config.bytes_per_second,
            config.bytes_burst,
        )
        shared = self._client_paces.join(client)
        try:
            if runtime_url is not None:
                attachment = await self._attach_upgraded(
                    conn, runtime_url, token, hello, identity, answer, arrived
                )
                if attachment is None:
                    return ws
            attachment = await self._read_frames(conn, attachment, pace, shared)
        except Exception:
            # Attaching failed inside the node (the database away, a bug): the stub
            # reconnects and resumes (a failure while reading is logged by _read_frames).
            log.exception("stub connection failed inside the node", peer=conn.peer)
        finally:
            await self._hang_up(conn, client, attachment)
        return ws

    async def _upgrade(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            heartbeat=self._config.heartbeat_seconds,
            compress=self._config.compression,
            max_msg_size=self._config.max_frame_bytes * HARD_LIMIT_FACTOR,
            # Pings are answered below, paced like every other frame: aiohttp's own answer
            # would come before any pacing, and a flood of pings cost the node what it cost
            # the sender.
            autoping=False,
        )
        await ws.prepare(request)
        return ws

    async def _attach_upgraded(
        self,
        conn: StubConnection,
        runtime_url: str,
        token: str | None,
        hello: AckHello | None,
        identity: Identity | None,
        answer: bool,
        arrived: float,
    ) -> Attachment | None:
        """Attaches a v2 socket to its session; None when that is refused now (the socket is
        closed with why), though the checks before the upgrade let it through."""
        try:
            return await self._attach(conn, runtime_url, token, hello, identity, answer, arrived)
        except SessionRefused as exc:
            # Checked again under the session's lock: the upgrade is done by now.
            await conn.close(CLOSE_UNAUTHORIZED, exc.reason[:120])
        except HeldElsewhere as exc:
            # Another process created the session since the check before the upgrade.
            await conn.close(CLOSE_TRY_AGAIN, _held_elsewhere(exc.holder)[:120])
        except SessionsFull as exc:
            # Others took the last places since the check before the upgrade.
            await conn.close(CLOSE_TRY_AGAIN, f"{exc.code} {exc.reason}"[:120])
        return None

    async def _read_frames(
        self, conn: StubConnection, attachment: Attachment | None, pace: Pace, shared: Pace
    ) -> Attachment | None:
        """Reads the socket until it closes, its session is released or it fails; returns the
        session it is attached to by then (a v1 stub attaches with its first frame). A failure
        inside the node is logged here, so that the session is still detached after it."""
        try:
            async for frame in conn.ws:
                if self.closing:
                    # Stopping: the stub's acknowledgements are still taken (the node waits
                    # for them), its messages are not (a numbered one comes again to the next
                    # run). The sockets are closed once the deliveries are settled.
                    if frame.type == WSMsgType.TEXT and attachment is not None:
                        await self._take_ack(conn, attachment, frame.data)
                    continue
                if frame.type in PACED_FRAMES:
                    # The sender's rate and its client's: until both allow the next frame
                    # (of any kind), this socket is not read (the sender waits; nothing is
                    # dropped).
                    size = len(frame.data or b"")
                    wait = max(pace.take(size), shared.take(size))
                    if wait > 0:
                        self._metrics.paced_seconds.inc(wait)
                        await asyncio.sleep(wait)
                if frame.type == WSMsgType.TEXT:
                    attachment = await self._decide_text(conn, attachment, frame.data)
                    if attachment is not None and attachment.session.released:
                        break
                elif not await self._on_other_frame(conn, frame):
                    break
        except Exception:
            # Not the stub's doing (the database away, a bug): it reconnects and resumes, and
            # what it had not seen acknowledged it sends again.
            log.exception("stub connection failed inside the node", peer=conn.peer)
        return attachment

    async def _decide_text(
        self, conn: StubConnection, attachment: Attachment | None, data: str
    ) -> Attachment | None:
        """A text frame (a message, an acknowledgement, a command), once the journal has room;
        counted as being decided while it is, so that a stop waits for it."""
        while not await self._journal.room(1.0) and not self.closing:
            pass
        if attachment is not None:
            self._sessions.mark_used(attachment.session)
        self._deciding += 1
        self._decided.clear()
        try:
            return await self._on_text(conn, attachment, data)
        finally:
            self._deciding -= 1
            if not self._deciding:
                self._decided.set()

    async def _on_other_frame(self, conn: StubConnection, frame: WSMessage) -> bool:
        """A frame that is not text; returns whether to read on."""
        if frame.type == WSMsgType.BINARY:
            await conn.send(
                control_error(415, "binary frames are not supported; send JSON text frames")
            )
        elif frame.type == WSMsgType.PING:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await conn.ws.pong(frame.data)
        elif frame.type == WSMsgType.ERROR:
            log.info("stub connection error", error=str(conn.ws.exception()))
            return False
        return True

    async def _hang_up(
        self, conn: StubConnection, client: str, attachment: Attachment | None
    ) -> None:
        """The socket is gone: its places are given back, its session detached, and the stub
        told to come back and resume (1000 is sent only after a processed `disconnect`, when
        the stub drops its session)."""
        self._client_paces.leave(client)
        self._open.discard(conn)
        self._handshake_done(conn)
        if attachment is not None:
            try:
                await self._sessions.detach(attachment)
            except Exception:
                log.exception("detaching a session failed", peer=conn.peer)
        await conn.close(CLOSE_GOING_AWAY if self.closing else CLOSE_INTERNAL_ERROR)

    async def _authenticate(self, kind: object, token: object) -> Identity | None:
        return await self._authenticator.authenticate(parse_credential(kind, token))

    async def _attach(
        self,
        conn: StubConnection,
        runtime_url: str,
        token: str | None,
        hello: AckHello | None,
        identity: Identity | None,
        answer: bool,
        arrived: float,
    ) -> Attachment:
        attachment = await self._sessions.attach(
            runtime_url,
            conn,
            token,
            hello,
            identity,
            protect=answer,
            client=_client(conn.client, identity),
        )
        self._handshake_done(conn)
        session = attachment.session
        self._journal.session(runtime_url, "resumed" if attachment.resumed else "new", identity)
        if attachment.upstream is None:
            conn.on_overflow = session.mailbox.give_back
        log.info(
            "runtime connected",
            runtime=runtime_url,
            resumed=attachment.resumed,
            peer=conn.peer,
            acknowledged=hello is not None,
        )
        if answer:
            acked = attachment.upstream.acked if attachment.upstream is not None else None
            await conn.send(
                connect_answer(
                    runtime_url,
                    attachment.resumed,
                    self._sessions.token_for(session),
                    self._domain,
                    acked,
                )
            )
        self._metrics.connect_seconds.labels("resumed" if attachment.resumed else "new").observe(
            time.monotonic() - arrived
        )
        # What the stub says it received counts only for the session it received it in.
        received = hello.received if hello is not None and attachment.resumed else 0
        self._sessions.resume(attachment, received)
        return attachment

    async def _take_ack(self, conn: StubConnection, attachment: Attachment, text: str) -> None:
        if not text.startswith("{") or len(text) > ACK_FRAME_MAX:
            return
        with contextlib.suppress(orjson.JSONDecodeError):
            parsed = orjson.loads(text)
            if isinstance(parsed, dict) and parsed.get("cmd") == "ack" and "type" not in parsed:
                await self._on_command(conn, attachment, parsed)

    async def _on_text(
        self, conn: StubConnection, attachment: Attachment | None, text: str
    ) -> Attachment | None:
        limit = self._config.max_frame_bytes
        if len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit):
            await self._refuse_oversize(conn, attachment, text, limit)
            return attachment
        if attachment is not None and attachment.upstream is not None and text[:1] == "[":
            try:
                numbered = split_numbered(text)
            except BadFrame as bad:
                await self._ingress.refuse_frame(
                    attachment, conn, text, InvalidMessage(400, str(bad))
                )
                return attachment
            if numbered is not None:
                await self._on_numbered(attachment, *numbered)
                return attachment
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            await self._ingress.refuse_frame(
                attachment, conn, text, InvalidMessage(400, f"malformed JSON: {exc}")
            )
            return attachment
        if isinstance(parsed, dict) and "cmd" in parsed and "type" not in parsed:
            return await self._on_command(conn, attachment, parsed)
        if attachment is None:
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
                attachment, conn, text, InvalidMessage(400, _not_an_object(parsed))
            )
            return attachment
        await self._ingress.on_message(attachment, text, parsed)
        return attachment

    async def _on_numbered(self, attachment: Attachment, seq: int, text: str) -> None:
        upstream = attachment.upstream
        assert upstream is not None
        pending = upstream.take(seq)
        if pending is None:
            # Sent again after a reconnect: taken before, so not routed twice. Its stub only
            # needs to hear (again) how far the node has got.
            self._metrics.duplicates.labels("stub").inc()
            self._acks.mark(attachment.session)
            return
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            parsed = InvalidMessage(400, f"malformed JSON: {exc}")
        if not isinstance(parsed, dict):
            problem = (
                parsed
                if isinstance(parsed, InvalidMessage)
                else InvalidMessage(400, _not_an_object(parsed))
            )
            await self._ingress.refuse_frame(attachment, attachment.link, text, problem)
            upstream.done(pending)
            return
        await self._ingress.on_message(attachment, text, parsed, pending)

    async def _refuse_oversize(
        self, conn: StubConnection, attachment: Attachment | None, text: str, limit: int
    ) -> None:
        reason = f"message of {len(text.encode())} bytes exceeds the limit of {limit}"
        partial: dict[str, Any] | None = None
        candidate: Any = None
        with contextlib.suppress(orjson.JSONDecodeError):
            candidate = orjson.loads(text)
        if isinstance(candidate, list) and len(candidate) == 2 and isinstance(candidate[1], dict):
            numbered_seq, candidate = candidate
            if attachment is not None and attachment.upstream is not None:
                # Refused is durable too: the stub must not send it again.
                seq = wire_number(numbered_seq)
                pending = attachment.upstream.take(seq) if seq else None
                if pending is not None:
                    attachment.upstream.done(pending)
        partial = candidate if isinstance(candidate, dict) else None
        await self._ingress.refuse_frame(
            attachment, conn, None, InvalidMessage(413, reason, partial)
        )

    async def _on_command(
        self, conn: StubConnection, attachment: Attachment | None, frame: dict[str, Any]
    ) -> Attachment | None:
        cmd = frame.get("cmd")
        data = frame.get("data") if isinstance(frame.get("data"), dict) else frame.get("body")
        data = data if isinstance(data, dict) else {}
        if cmd == "ack":
            received = wire_number(frame.get("received"))
            if attachment is not None and attachment.current and received is not None:
                attachment.session.mailbox.on_ack(received)
            return attachment
        if cmd == "connect":
            return await self._on_connect(conn, attachment, data)
        if cmd == "disconnect":
            if attachment is None:
                await conn.send(control_error(400, "not connected", cmd="disconnect"))
                return None
            session = attachment.session
            named = data.get("runtimeURL")
            if named is not None and named != session.runtime_url:
                await conn.send(
                    control_error(
                        400, f"this connection is {session.runtime_url}", cmd="disconnect"
                    )
                )
                return attachment
            if not await self._sessions.disconnect(attachment):
                # A newer connection took the session meanwhile: it is that one's now.
                await conn.send(
                    control_error(409, "the session moved to a newer connection", cmd="disconnect")
                )
                await conn.close(CLOSE_REPLACED, "replaced by a newer connection")
                return attachment
            log.info("runtime disconnected", runtime=session.runtime_url)
            await conn.send(dumps({"cmd": "disconnect", "response": 200}))
            await conn.close(CLOSE_NORMAL, "disconnected")
            return attachment
        if cmd == "auth":
            # A fresh credential for the session's identity (docs/stub-protocol.md, "Credentials").
            if attachment is None or not attachment.current:
                await conn.send(control_error(400, "not connected", cmd="auth"))
                return attachment
            if data.get("type") is None and data.get("token") is None:
                await conn.send(control_error(400, "auth needs data {type, token}", cmd="auth"))
                return attachment
            try:
                fresh = await self._authenticate(data.get("type"), data.get("token"))
                if fresh is None:
                    raise IdentityRejected("no credential")
                await self._sessions.reauthenticate(attachment, fresh)
            except IdentityRejected as exc:
                await conn.send(control_error(401, exc.reason, cmd="auth"))
                return attachment
            except SessionRefused as exc:
                await conn.send(control_error(403, exc.reason, cmd="auth"))
                return attachment
            except IdentityUnavailable as exc:
                await conn.send(control_error(503, exc.reason, cmd="auth"))
                return attachment
            self._journal.session(attachment.session.runtime_url, "reauthenticated", fresh)
            expires = int(fresh.expires_at) if fresh.expires_at is not None else None
            await conn.send(dumps({"cmd": "auth", "response": 200, "data": {"expires": expires}}))
            return attachment
        await conn.send(control_error(400, f"unknown command {cmd!r}", cmd=str(cmd)))
        return attachment

    async def _on_connect(
        self, conn: StubConnection, attachment: Attachment | None, data: dict[str, Any]
    ) -> Attachment | None:
        arrived = time.monotonic()
        if attachment is not None:
            await conn.send(
                control_error(
                    409, f"already connected as {attachment.session.runtime_url}", cmd="connect"
                )
            )
            return attachment
        runtime_url = data.get("runtimeURL")
        problem = runtime_url_problem(runtime_url, self._domain)
        if problem is not None:
            await conn.send(
                control_error(400, f"connect needs data.runtimeURL: {problem}", cmd="connect")
            )
            return None
        assert isinstance(runtime_url, str)
        try:
            hello = parse_hello(data.get("ack"))
        except BadHello as exc:
            await conn.send(control_error(400, str(exc), cmd="connect"))
            return None
        token = data.get("token")
        auth = data.get("auth")
        if not isinstance(auth, dict):
            auth = {}
        try:
            identity = await self._authenticate(auth.get("type"), auth.get("token"))
            holder = await self._sessions.held_elsewhere(
                runtime_url, token if isinstance(token, str) and token else None, identity
            )
            if holder is not None:
                raise HeldElsewhere(holder)
            return await self._attach(
                conn,
                runtime_url,
                token if isinstance(token, str) and token else None,
                hello,
                identity,
                answer=True,
                arrived=arrived,
            )
        except (TokenRejected, IdentityRejected, SessionRefused) as exc:
            await conn.send(control_error(401, str(exc), cmd="connect"))
            return None
        except IdentityUnavailable as exc:
            await conn.send(control_error(503, exc.reason, cmd="connect"))
            return None
        except HeldElsewhere as exc:
            await conn.send(control_error(503, _held_elsewhere(exc.holder), cmd="connect"))
            await conn.close(CLOSE_TRY_AGAIN, "connect again")
            return None
        except SessionsFull as exc:
            await conn.send(control_error(exc.code, exc.reason, cmd="connect"))
            return None

    def _await_handshake(self, conn: StubConnection) -> None:
        """A socket opened without a handshake gets ``stub.handshake_seconds`` to send one."""
        self._handshaking_gauge.inc()
        self._handshaking[conn] = asyncio.get_running_loop().call_later(
            self._config.handshake_seconds, self._handshake_missed, conn
        )

    def _handshake_done(self, conn: StubConnection) -> None:
        timer = self._handshaking.pop(conn, None)
        if timer is not None:
            timer.cancel()
            self._handshaking_gauge.dec()

    def _handshake_missed(self, conn: StubConnection) -> None:
        if self._handshaking.pop(conn, None) is None:
            return
        self._handshaking_gauge.dec()
        self._metrics.handshake_timeouts.inc()
        log.info("stub socket closed: no handshake in time", peer=conn.peer)
        self._closing.spawn(
            conn.close(
                CLOSE_POLICY,
                f"no {{cmd:'connect'}} within {self._config.handshake_seconds:g} s",
            )
        )


def _client(host: str, identity: Identity | None) -> str:
    """The client a connection counts against: its verified identity, else its host."""
    verified = identity is not None and identity.authenticated
    return ClientKeys.of(host, identity.key if verified and identity is not None else None)


def _http_refusal(refused: BoundRefused) -> web.HTTPException:
    if refused.code == 429:
        return web.HTTPTooManyRequests(text=refused.reason)
    return web.HTTPServiceUnavailable(text=refused.reason, headers={"Retry-After": "5"})


def _held_elsewhere(holder: str | None) -> str:
    if not holder:
        return "this runtime's session is being moved between node processes: connect again"
    return f"this runtime's session is held by node process {holder}: connect again"


def _not_an_object(parsed: Any) -> str:
    return f"a message must be a JSON object, not {type(parsed).__name__}"

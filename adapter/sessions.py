"""Runtime sessions: who is connected, what is kept for whom, and delivery to a runtime.

A session outlives its connection. Closing the socket without `disconnect` only detaches it:
its allocations and subscriptions stay, and messages routed to it are kept in the database and
delivered, in order, when the same runtimeURL connects again. `disconnect` releases everything.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import UTC
from typing import Any

import structlog

from .observability import NodeMetrics
from .routing.carrier import Outgoing
from .routing.stream import BatchStream
from .routing.table import RoutingTable
from .storage.clock import utcnow
from .storage.models import SessionState
from .storage.pending import PendingStore
from .storage.sessions import SessionStore
from .stub.connection import CLOSE_REPLACED, StubConnection
from .stub.tokens import SessionTokens, TokenRejected

log = structlog.get_logger(__name__)


class Session:
    __slots__ = (
        "connection",
        "detached_at",
        "id",
        "lock",
        "outbox",
        "released",
        "resume_buffer",
        "resuming",
        "runtime_url",
        "to_persist",
        "user_id",
    )

    def __init__(self, session_id: int, runtime_url: str, user_id: str) -> None:
        self.id = session_id
        self.runtime_url = runtime_url
        self.user_id = user_id
        self.connection: StubConnection | None = None
        # While queued messages are replayed after a reconnect, new ones wait here behind them.
        self.resuming = False
        self.resume_buffer: deque[tuple[str, str | None]] = deque()
        # Messages for a detached runtime, written to the database at the end of the transaction.
        self.to_persist: list[tuple[str, str | None]] = []
        self.lock = asyncio.Lock()
        self.outbox: BatchStream[Outgoing] | None = None
        self.detached_at: float | None = time.monotonic()
        self.released = False

    @property
    def live(self) -> bool:
        return self.connection is not None and not self.resuming

    def park(self, text: str, event_id: str | None) -> None:
        if self.resuming:
            self.resume_buffer.append((text, event_id))
        else:
            self.to_persist.append((text, event_id))


class SessionManager:
    def __init__(
        self,
        store: SessionStore,
        pending: PendingStore,
        table: RoutingTable,
        tokens: SessionTokens,
        virtual_user: Callable[[str], str],
        metrics: NodeMetrics,
        ttl_seconds: int,
        on_release: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._pending = pending
        self._table = table
        self._tokens = tokens
        self._virtual_user = virtual_user
        self._metrics = metrics
        self._ttl = ttl_seconds
        self._on_release = on_release
        self._by_id: dict[int, Session] = {}
        self._by_runtime: dict[str, Session] = {}
        self._by_user: dict[str, Session] = {}
        self._attach_locks: dict[str, asyncio.Lock] = {}
        self._dirty: set[Session] = set()  # sessions with messages to persist
        self._background: set[asyncio.Task[None]] = set()

    # -- lookups ------------------------------------------------------------------------------

    def get(self, session_id: int) -> Session | None:
        return self._by_id.get(session_id)

    def by_user(self, user_id: str) -> Session | None:
        return self._by_user.get(user_id)

    def by_runtime(self, runtime_url: str) -> Session | None:
        return self._by_runtime.get(runtime_url)

    def __len__(self) -> int:
        return len(self._by_id)

    # -- lifecycle ----------------------------------------------------------------------------

    async def load(self) -> None:
        """Sessions from the database, all detached: after a restart nobody is connected."""
        await self._store.detach_all()
        now = utcnow()
        for row in await self._store.all():
            session = Session(row.id, row.runtime_url, row.user_id)
            last_seen = row.last_seen if row.last_seen.tzinfo else row.last_seen.replace(tzinfo=UTC)
            # The session's lifetime keeps counting from when it was last seen, across restarts.
            session.detached_at = time.monotonic() - max((now - last_seen).total_seconds(), 0)
            self._add(session)

    def _add(self, session: Session) -> None:
        self._by_id[session.id] = session
        self._by_runtime[session.runtime_url] = session
        self._by_user[session.user_id] = session
        self._table.add_runtime(session.id, session.runtime_url)

    def token_for(self, session: Session) -> str:
        return self._tokens.issue(session.id, session.runtime_url)

    def check_token(self, runtime_url: str, token: str) -> None:
        """Raise TokenRejected unless ``token`` names the live session of ``runtime_url``."""
        claim = self._tokens.verify(token, runtime_url)
        current = self._by_runtime.get(runtime_url)
        if current is None or current.id != claim.session_id:
            raise TokenRejected("session token names a session that no longer exists")

    async def attach(
        self, runtime_url: str, connection: StubConnection, token: str | None
    ) -> tuple[Session, bool]:
        """Bind a new connection to the runtime's session (created if none). Returns the
        session and whether it was resumed. A live older connection is replaced (close 4409)."""
        lock = self._attach_locks.setdefault(runtime_url, asyncio.Lock())
        async with lock:
            if token is not None:
                self.check_token(runtime_url, token)
            session = self._by_runtime.get(runtime_url)
            resumed = session is not None
            if session is None:
                user_id = self._virtual_user(runtime_url)
                session = Session(
                    await self._store.create(runtime_url, user_id), runtime_url, user_id
                )
                self._add(session)
            else:
                await self._store.set_state(session.id, SessionState.CONNECTED)
            previous = session.connection
            session.connection = connection
            session.detached_at = None
            self._metrics.stub_connections.inc()
            if previous is not None and previous is not connection:
                self._metrics.stub_connections.dec()
                log.info("connection replaced", runtime=runtime_url, old_peer=previous.peer)
                self._spawn(previous.close(CLOSE_REPLACED, "replaced by a newer connection"))
            if resumed:
                session.resuming = True
                self._spawn(self._resume(session, connection))
        if not lock.locked():
            self._attach_locks.pop(runtime_url, None)
        return session, resumed

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def detach(self, session: Session, connection: StubConnection) -> None:
        """The socket closed without `disconnect`: keep the session for a resume."""
        if session.connection is not connection or session.released:
            return
        session.connection = None
        session.detached_at = time.monotonic()
        self._metrics.stub_connections.dec()
        if session.resuming:
            session.resuming = False
            session.to_persist[:0] = session.resume_buffer
            session.resume_buffer.clear()
        if session.to_persist:
            self._dirty.add(session)
        await self.persist_pending()
        await self._store.set_state(session.id, SessionState.DETACHED)

    async def release(self, session: Session) -> None:
        """`disconnect`, or expiry: forget the session and everything it owned."""
        if session.released:
            return
        session.released = True
        if session.connection is not None:
            session.connection = None
            self._metrics.stub_connections.dec()
        self._by_id.pop(session.id, None)
        self._by_runtime.pop(session.runtime_url, None)
        self._by_user.pop(session.user_id, None)
        self._dirty.discard(session)
        self._table.remove_session(session.id)
        if self._on_release is not None:
            self._on_release(session.id)
        # Its outbox keeps draining on its own: what the runtime sent before leaving is routed.
        await self._store.delete(session.id)

    async def expire(self) -> int:
        """Release sessions detached for longer than the configured lifetime."""
        cutoff = time.monotonic() - self._ttl
        stale = [
            s
            for s in self._by_id.values()
            if s.connection is None and s.detached_at is not None and s.detached_at < cutoff
        ]
        for session in stale:
            log.info("session expired", runtime=session.runtime_url)
            await self.release(session)
        return len(stale)

    # -- delivery -----------------------------------------------------------------------------

    async def deliver(
        self, session_id: int, text: str, event_id: str | None, payload: bytes | None = None
    ) -> str | None:
        """Hand one message to a runtime: to its socket when live ("live"), else kept for its
        resume ("queued"); None when the session no longer exists. ``payload`` is the text's
        UTF-8 bytes, encoded once by a caller sending the same message to many runtimes."""
        session = self._by_id.get(session_id)
        if session is None:
            return None
        connection = session.connection
        if (
            connection is not None
            and not session.resuming
            and await connection.send(payload if payload is not None else text)
        ):
            return "live"
        session.park(text, event_id)
        if not session.resuming:
            self._dirty.add(session)
        return "queued"

    def give_back(self, session: Session, texts: list[str]) -> None:
        """Frames a connection could not write (it was dropped as too slow): keep them, ahead of
        anything newer, for the runtime's resume."""
        session.to_persist[:0] = [(t, None) for t in texts]
        self._dirty.add(session)

    async def persist_pending(self) -> None:
        """Write kept messages to the database; called before a transaction is acknowledged."""
        while self._dirty:
            session = self._dirty.pop()
            async with session.lock:
                if session.to_persist and not session.released:
                    batch, session.to_persist = session.to_persist, []
                    await self._pending.append(session.id, batch)

    async def _resume(self, session: Session, connection: StubConnection) -> None:
        """Replay what was kept for the runtime, oldest first, then go live."""
        try:
            async with session.lock:
                if session.to_persist:
                    batch, session.to_persist = session.to_persist, []
                    await self._pending.append(session.id, batch)
                while session.connection is connection:
                    rows = await self._pending.next_batch(session.id)
                    if not rows:
                        break
                    for _, text in rows:
                        if not await connection.send(text):
                            return
                    await self._pending.remove_through(session.id, rows[-1][0])
                    self._metrics.messages_out.labels("replayed").inc(len(rows))
            while session.resume_buffer and session.connection is connection:
                text, _ = session.resume_buffer[0]
                if not await connection.send(text):
                    return
                session.resume_buffer.popleft()
            if session.connection is connection:
                session.resuming = False
        except Exception:
            log.exception("resume failed", runtime=session.runtime_url)
            await connection.close(1011, "resume failed")

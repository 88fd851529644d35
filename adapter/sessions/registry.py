"""The sessions the node knows, and their life.

A session outlives its connection. Closing the socket without `disconnect` only detaches it: its
allocations and subscriptions stay, and what is routed to it is kept and delivered, in order,
when the same runtimeURL connects again. `disconnect`, or a detachment longer than the session
lifetime, releases it and everything it owned.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Protocol

import structlog

from ..bounds import Bound, BoundRefused
from ..identity.model import Identity
from ..retry import Backoff, retry
from ..storage.clock import utcnow
from ..storage.models import SessionState
from ..storage.sessions import ClaimRow, HeldElsewhere
from ..tasks import BackgroundTasks
from .eviction import EvictionOrder
from .link import CLOSE_REPLACED, Link
from .mailbox import DeliveryStore, Mailbox, Parcel, Tally, Ticket, Waiting
from .serial import Serial, Turn
from .session import AckHello, Attachment, Session
from .tokens import SessionTokens, TokenRejected
from .upstream import Upstream

log = structlog.get_logger(__name__)


# How long a `disconnect` keeps trying to release its session while the database fails.
RELEASE_RETRY_SECONDS = 60.0
# How long a connection waits for its session to be moved here from another node process
# before it is sent to connect again.
TAKE_OVER_WAIT_SECONDS = 30.0
# What a move's turn in the runtimes' lines is marked with (``Serial.ahead``).
MOVE = "move"

# Takes the runtime's session (named second) from the node process holding it (named first):
# all its sessions if it is gone, this one handed over if it is alive. Whether it did.
TakeOver = Callable[[str, str], Coroutine[Any, Any, bool]]


class SessionRefused(Exception):
    """A connection may not have this runtime's session (answer 401)."""

    code = 401

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SessionsFull(Exception):
    """No session for this connection: its client (429) or the node (503) holds its most."""

    def __init__(self, refused: BoundRefused) -> None:
        super().__init__(refused.reason)
        self.code = refused.code
        self.reason = refused.reason


class Move:
    """Sessions coming to this node process: taken over from another one, or read again after
    a restart. The runtimes' lines are the move's from ``SessionRegistry.moving`` until
    ``SessionRegistry.adopted``: whatever else would touch those sessions (a connection, a
    handover on, an expiry) waits in the lines for it; nothing waits for a move otherwise."""

    __slots__ = ("sessions", "turn")

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        # Those now here and held (what is delivered to them waits until ``adopted``).
        self.sessions: list[Session] = []

    async def ready(self) -> None:
        """Until the move holds its lines (whatever was in them before it is done)."""
        await self.turn.wait()


class SessionRows(Protocol):
    """The sessions table (storage/sessions.py)."""

    async def create(
        self,
        runtime_url: str,
        user_id: str,
        key: str,
        protected: bool,
        identity: str | None,
        claim: str,
        kept: ClaimRow | None = None,
        client: str = "",
    ) -> int: ...

    async def set_state(
        self, session_id: int, state: SessionState, protect: bool = False, used: bool = True
    ) -> None: ...

    async def claim_of(self, runtime_url: str) -> ClaimRow | None: ...

    async def release(self, session_id: int, kept: ClaimRow | None) -> None: ...

    async def held(self, runtime_url: str) -> tuple[str, Any] | None: ...

    async def detach_all(self) -> None: ...

    async def all(self) -> list[Any]: ...


class Gauge(Protocol):
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


@dataclass
class Lifecycle:
    """Who else must know when a session appears, goes away, or its runtime comes and goes
    (the routing table, the message gate, the registry's presence)."""

    added: list[Callable[[Session], None]] = field(default_factory=list)
    released: list[Callable[[Session], None]] = field(default_factory=list)
    detached: list[Callable[[Session], None]] = field(default_factory=list)
    attached: list[Callable[[Session], None]] = field(default_factory=list)
    # An origin that carries no more messages (a replaced stub instance's, a released
    # session's): what is kept per origin can go.
    retired: list[Callable[[str], None]] = field(default_factory=list)

    def retire(self, origins: list[str]) -> None:
        for origin in origins:
            for listener in self.retired:
                try:
                    listener(origin)
                except Exception:
                    log.exception("origin listener failed", origin=origin)

    @staticmethod
    def _tell(listeners: list[Callable[[Session], None]], session: Session) -> None:
        for listener in listeners:
            try:
                listener(session)
            except Exception:
                log.exception("session listener failed", runtime=session.runtime_url)


class SessionRegistry:
    def __init__(
        self,
        rows: SessionRows,
        deliveries: DeliveryStore,
        tokens: SessionTokens,
        virtual_user: Callable[[str], str],
        connections: Gauge,
        ttl_seconds: int,
        lifecycle: Lifecycle,
        on_mailbox_dirty: Callable[[Mailbox], None],
        on_upstream_progress: Callable[[Session], None],
        max_detached: int = 100_000,
        on_evicted: Callable[[], None] = lambda: None,
        on_unreceived: Callable[[list[Parcel]], None] = lambda _parcels: None,
        process: str | None = None,
        take_over: TakeOver | None = None,
        claim_in_use: Callable[[str], Coroutine[Any, Any, bool]] | None = None,
        bound: Bound | None = None,
        tally: Tally | None = None,
    ) -> None:
        self._rows = rows
        # Bytes waiting for this process's runtimes, node-wide and by client.
        self.tally = tally if tally is not None else Tally()
        # Sessions per client and in total (attached and detached alike).
        self._bound = bound if bound is not None else Bound("sessions", 1 << 62, 1 << 62)
        # Whether anything is still registered under a claim (the built-in registry): while
        # it is, the runtimeURL stays the claim's after its session ends. None: nothing is.
        self._claim_in_use = claim_in_use
        # This node process's name when the domain runs several: each holds its own sessions.
        self._process = process
        self._take_over = take_over
        self._deliveries = deliveries
        self._tokens = tokens
        self._virtual_user = virtual_user
        self._connections = connections
        self._ttl = ttl_seconds
        self._lifecycle = lifecycle
        self._on_mailbox_dirty = on_mailbox_dirty
        self._on_upstream_progress = on_upstream_progress
        self._epoch = 0
        # The node is stopping (``closing``): its own closing of every socket evicts nobody.
        self._closing = False
        self._by_id: dict[int, Session] = {}
        self._by_runtime: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        # Every operation on a runtime's session that waits in its middle (for the database,
        # the homeserver, another node process) runs in the runtime's line, one after the
        # other: attach, detach, disconnect and release, expiry and eviction, admission and
        # re-authentication, where the session is held, a handover on, a move here (from
        # ``moving`` to ``adopted``) and the resume's replay. Inside, only the ``..._on_line``
        # variants: taking the same line again would wait for itself. What never waits
        # (``mark_used``, an acknowledgement, ``place_refusal``) runs whole, between two steps
        # of whatever holds the line, and needs no more.
        self._serial = Serial()
        # Sessions without a connection, longest detached first (expiry walks them so); bounded,
        # beyond ``max_detached`` released early in the order of eviction.py.
        self._detached: OrderedDict[int, Session] = OrderedDict()
        # Sessions being released whose place in the bound was given back already.
        self._placeless: set[int] = set()
        self._eviction: EvictionOrder[Session] = EvictionOrder(
            self._detached.get, lambda: len(self._detached), lambda c: self._bound.held(c)
        )
        self._max_detached = max_detached
        self._on_evicted = on_evicted
        # Told of the routed messages a released session had not received.
        self._on_unreceived = on_unreceived
        # States to write (latest per session), by one background writer.
        self._states: dict[int, SessionState] = {}
        self._state_writer: asyncio.Task[None] | None = None
        # Failures are logged; this registry has no metrics to count them in.
        self._background = BackgroundTasks("sessions")

    # -- lookups ------------------------------------------------------------------------------

    def get(self, session_id: int) -> Session | None:
        return self._by_id.get(session_id)

    def by_runtime(self, runtime_url: str) -> Session | None:
        return self._by_runtime.get(runtime_url)

    def by_origin(self, origin: str) -> Session | None:
        """The session whose messages are numbered in ``origin`` (``<key>.<numbering>``)."""
        return self._by_key.get(origin.split(".", 1)[0])

    def waiting(self, session: Session, sender: str) -> Waiting:
        """What waits for ``session``'s runtime, as ``sender``'s next message to it is held to
        (mailbox.waiting_refusal): for it, from that sender, for its client, node-wide."""
        mailbox = session.mailbox
        return Waiting(
            mailbox.waiting_bytes,
            mailbox.waiting_from(sender),
            self.tally.of(session.client),
            self.tally.total,
        )

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    # -- lifecycle ----------------------------------------------------------------------------

    async def load(self, epoch: int, stored: dict[int, tuple[int, int]]) -> None:
        """Sessions from the database, all detached: after a restart nobody is connected.
        ``epoch`` counts the node's starts; ``stored`` is each session's highest kept delivery
        number in the database and the bytes kept there."""
        self._epoch = epoch
        await self._rows.detach_all()
        now = utcnow()
        for row in await self._rows.all():
            self._add(self._from_row(row, epoch, stored, now))
        for session in sorted(self._by_id.values(), key=lambda s: s.detached_at or 0.0):
            # Whether it was used is stored with it: a flood of sessions never used, made
            # before the restart, still goes before an honest runtime's.
            self._detached[session.id] = session
            self._eviction.push(session)
            # Read back: held already, so counted whatever the bounds, under its client.
            self._bound.force(session.client)

    def _from_row(
        self, row: Any, epoch: int, stored: dict[int, tuple[int, int]], now: Any
    ) -> Session:
        session = self._new_session(
            row.id,
            row.key,
            row.runtime_url,
            row.user_id,
            *stored.get(row.id, (0, 0)),
            epoch=epoch,
            claim=row.claim or row.key,
        )
        session.protected = row.protected
        # Who its client is and whether it was used, as stored (a row from before these were
        # kept: nobody's, used).
        session.client = row.client
        session.used = row.used
        session.mailbox.join(self.tally, row.client)
        if row.identity is not None:
            session.identity = Identity.from_record(row.identity)
        last_seen = row.last_seen if row.last_seen.tzinfo else row.last_seen.replace(tzinfo=UTC)
        # The session's lifetime keeps counting from when it was last seen, across restarts.
        session.detached_at = time.monotonic() - max((now - last_seen).total_seconds(), 0)
        return session

    # -- moves between node processes ---------------------------------------------------------

    def moving(self, runtime_urls: Iterable[str]) -> Move:
        """A move of the runtimes' sessions here: its turn in their lines is placed now,
        without waiting, so call it in the same step as the take-over learns them (before
        asking a live holder; as a gone one's transaction returns): a connection that then
        finds the session this process's waits in the line until it is here. End it with
        ``adopted``, whatever happens."""
        return Move(self._serial.reserve(runtime_urls, MOVE))

    async def adopt(
        self, move: Move, rows: list[Any], epoch: int, stored: dict[int, tuple[int, int]]
    ) -> list[Session]:
        """Sessions taken over from another node process, detached, once the move holds their
        lines. ``epoch`` is a fresh start count, so their delivery numbers stay above the old
        holder's. What is delivered to them is held until ``adopted``."""
        await move.ready()
        now = utcnow()
        added = []
        for row in rows:
            if row.runtime_url in self._by_runtime:
                continue
            session = self._from_row(row, epoch, stored, now)
            self._add(session)
            self._bound.force(session.client)
            self._detached[session.id] = session
            self._eviction.push(session)
            added.append(session)
        self._hold_on_line(move, added)
        self._evict_beyond_bound()
        return added

    async def hold(self, session_ids: list[int]) -> Move:
        """Sessions already here that are to be read again (after a restart, a handover not
        finished): a move of their own, held as adopted ones are until ``adopted``."""
        sessions = [s for i in session_ids if (s := self._by_id.get(i)) is not None]
        move = self.moving(session.runtime_url for session in sessions)
        try:
            await move.ready()
        except BaseException:
            move.turn.release()
            raise
        # Released while the move waited for its lines: nothing to read again for it.
        self._hold_on_line(move, [s for s in sessions if self._by_id.get(s.id) is s])
        return move

    @staticmethod
    def _hold_on_line(move: Move, sessions: list[Session]) -> None:
        for session in sessions:
            session.mailbox.hold()
        move.sessions.extend(sessions)

    def adopted(
        self,
        move: Move,
        before: dict[int, list[Parcel]],
        tickets: Mapping[int, Ticket] | None = None,
    ) -> None:
        """The move's sessions' deliveries read again from the rooms (``before``, per session,
        each holding the session's ticket in ``tickets`` until settled) come first, then what
        was held; the move leaves the lines, and their runtimes may connect."""
        try:
            for session in move.sessions:
                ticket = tickets.get(session.id) if tickets is not None else None
                session.mailbox.unhold(before.get(session.id, []), ticket)
        finally:
            move.turn.release()

    async def hand_over(
        self, runtime_url: str, at_removal: Callable[[], Any]
    ) -> tuple[Session, Any] | None:
        """The runtime reached another node process, which takes its session: the connection
        here (if any) is closed as replaced, what is kept for the runtime is stored, and the
        session leaves this process without being released (its routes stay the domain's).
        ``at_removal`` is called the moment nothing is delivered to it here any more; its
        result comes back with the session. None when this process does not hold it.

        A session this process is still taking (reading the rooms again for it) is handed on
        once that is done, what was read again with it: the move holds its line till then."""
        async with self._serial.line(runtime_url):
            return await self._hand_over_on_line(runtime_url, at_removal)

    async def _hand_over_on_line(
        self, runtime_url: str, at_removal: Callable[[], Any]
    ) -> tuple[Session, Any] | None:
        session = self._by_runtime.get(runtime_url)
        if session is None:
            return None
        attachment = session.attachment
        if attachment is not None:
            session.attachment = None
            session.mailbox.detach(attachment.link)
            self._connections.dec()
            self._spawn(attachment.link.close(CLOSE_REPLACED, "taken by another node process"))
        self._detached.pop(session.id, None)
        self._by_id.pop(session.id, None)
        self._by_runtime.pop(session.runtime_url, None)
        self._by_key.pop(session.key, None)
        self._give_place(session)
        self._placeless.discard(session.id)
        snapshot = at_removal()
        await session.mailbox.store_all(self._deliveries)
        session.mailbox.leave()
        # What still reaches it here (an event being delivered right now) is not kept: the
        # new holder reads that event again.
        session.mailbox.discarded = True
        return session, snapshot

    def _new_session(
        self,
        session_id: int,
        key: str,
        runtime_url: str,
        user_id: str,
        stored_through: int = 0,
        stored_bytes: int = 0,
        epoch: int | None = None,
        claim: str = "",
    ) -> Session:
        start = self._epoch if epoch is None else epoch
        mailbox = Mailbox(session_id, start, self._on_mailbox_dirty, stored_through, stored_bytes)
        mailbox.join(self.tally, "")
        session = Session(session_id, key, runtime_url, user_id, mailbox, start)
        session.claim = claim or key
        return session

    def _add(self, session: Session) -> None:
        self._by_id[session.id] = session
        self._by_runtime[session.runtime_url] = session
        self._by_key[session.key] = session
        Lifecycle._tell(self._lifecycle.added, session)

    @contextlib.asynccontextmanager
    async def _connection_turn(self, runtime_url: str) -> AsyncIterator[None]:
        """The runtime's line, for a connection: behind a move of its session here it waits
        only so long (then raises HeldElsewhere: it is sent to connect again)."""
        turn = self._serial.reserve((runtime_url,))
        try:
            if self._serial.ahead(runtime_url, MOVE):
                try:
                    async with asyncio.timeout(TAKE_OVER_WAIT_SECONDS):
                        await turn.wait()
                except TimeoutError:
                    raise HeldElsewhere("") from None
            else:
                await turn.wait()
            yield
        finally:
            turn.release()

    async def held_elsewhere(
        self, runtime_url: str, token: str | None, identity: Identity | None
    ) -> str | None:
        """The node process that holds the runtime's session when another one does ("" for a
        session nobody holds); None when this process may take the runtime. Raises
        HeldElsewhere when a move of the session here takes too long."""
        if self._process is None:
            return None
        async with self._connection_turn(runtime_url):
            holder = await self._holder_on_line(runtime_url, token, identity)
        # Out of the line: the take-over is a move, which takes the line (and others) itself.
        if holder is None or (
            self._take_over is not None and await self._take_over(holder, runtime_url)
        ):
            return None
        return holder

    async def _holder_on_line(
        self, runtime_url: str, token: str | None, identity: Identity | None
    ) -> str | None:
        if runtime_url in self._by_runtime:
            return None
        found = await self._rows.held(runtime_url)
        if found is None:
            return None
        holder, row = found
        if holder == self._process:
            # This process took it a moment ago (a take-over committed, its sessions not yet
            # in memory): that move placed its turn in the line as its transaction returned,
            # so the connection's attach waits in the line until the session is here.
            return None
        # Only a connection that may have the session moves it: taking it over closes the
        # runtime's connection at its holder, which no one else may do to it.
        session = self._from_row(row, self._epoch, {}, utcnow())
        if token is not None:
            if not self._tokens.verify(token, runtime_url).names(row.id, row.claim):
                raise TokenRejected("session token names a session that no longer exists")
            self._admit_with_token(session, identity)
        else:
            self._admit_without_token(session, identity)
        return holder

    def token_for(self, session: Session) -> str:
        return self._tokens.issue(session.id, session.runtime_url, session.claim)

    def check_token(self, runtime_url: str, token: str) -> None:
        """Raise TokenRejected unless ``token`` names the live session of ``runtime_url``. A
        runtime with no session now gets a new one, token or not: a stale token (its session was
        released or expired) names nothing anybody holds."""
        current = self._by_runtime.get(runtime_url)
        if current is None:
            return
        if not self._tokens.verify(token, runtime_url).names(current.id, current.claim):
            raise TokenRejected("session token names a session that no longer exists")

    async def attach(
        self,
        runtime_url: str,
        link: Link,
        token: str | None,
        hello: AckHello | None,
        identity: Identity | None = None,
        protect: bool = False,
        client: str = "",
    ) -> Attachment:
        """Bind a new connection to the runtime's session (created if none). A live older
        connection is replaced (closed with 4409). Deliveries wait until ``resume``.

        ``protect``: the connection will be handed a session token, so from now on only a
        connection presenting it (or proving the same identity) gets the session. Raises
        TokenRejected or SessionRefused (401) and leaves the live connection alone.

        ``client``: who the connection is (clients.py); a new session counts against its
        bound and the node's, and raises SessionsFull beyond them. HeldElsewhere: another
        process holds the session, or moving it here takes too long."""
        async with self._connection_turn(runtime_url):
            if token is not None:
                self.check_token(runtime_url, token)
            session = self._by_runtime.get(runtime_url)
            resumed = session is not None
            if session is None:
                session = await self._create_on_line(runtime_url, token, identity, protect, client)
            else:
                await self._readmit_on_line(session, token, identity, protect)
            return self._bind_on_line(session, link, hello, resumed)

    async def _create_on_line(
        self,
        runtime_url: str,
        token: str | None,
        identity: Identity | None,
        protect: bool,
        client: str,
    ) -> Session:
        """A new session for the runtime: its row written, its place in the bounds taken."""
        kept = await self._rows.claim_of(runtime_url)
        claim = secrets.token_hex(8)
        if kept is not None and await self._in_use(kept.claim):
            self._admit_to_claim(kept, token, identity)
            claim = kept.claim
        user_id = self._virtual_user(runtime_url)
        key = secrets.token_hex(8)
        record = identity.to_record() if identity is not None else None
        # Taken in this step, with no wait since the check: nothing else can take the last
        # place meanwhile. Given back if the row cannot be written.
        self._take_place(client, identity)
        try:
            session_id = await self._rows.create(
                runtime_url, user_id, key, protect, record, claim, kept, client
            )
        except BaseException:
            self._bound.give(client)
            raise
        session = self._new_session(session_id, key, runtime_url, user_id, claim=claim)
        session.client = client
        session.mailbox.join(self.tally, client)
        session.identity = identity
        session.protected = protect
        self._add(session)
        return session

    async def _readmit_on_line(
        self, session: Session, token: str | None, identity: Identity | None, protect: bool
    ) -> None:
        """Whether the connection may have the runtime's session (raises otherwise), and what
        it brings to it: a fresher credential, the protection of a token."""
        if token is None:
            self._admit_without_token(session, identity)
        else:
            self._admit_with_token(session, identity)
        proved = session.identity
        if identity is not None and proved is not None and proved.authenticated:
            # The same identity (or, with the token, one for a record that kept no key): its
            # latest credential sets how long the node vouches for it.
            session.identity = identity
        if protect and not session.protected:
            # Stored before the token is handed out: a restart must not unprotect it.
            await self._rows.set_state(session.id, SessionState.CONNECTED, protect=True, used=True)
            session.protected = True
        else:
            self._note_state(session.id, SessionState.CONNECTED)

    def _bind_on_line(
        self, session: Session, link: Link, hello: AckHello | None, resumed: bool
    ) -> Attachment:
        """The connection becomes the session's: an older one is closed as replaced."""
        previous = session.attachment
        upstream: Upstream | None = None
        if hello is not None:
            upstream, retired = session.upstream_for(
                hello.stub, lambda _up: self._on_upstream_progress(session)
            )
            if retired is not None:
                self._lifecycle.retire([retired])
        if resumed:
            session.used = True
        attachment = Attachment(session, link, upstream, resumed)
        session.attachment = attachment
        session.detached_at = None
        self._detached.pop(session.id, None)
        session.mailbox.attach(link, acking=hello is not None)
        self._connections.inc()
        if previous is not None:
            self._connections.dec()
            log.info(
                "connection replaced", runtime=session.runtime_url, old_peer=previous.link.peer
            )
            self._spawn(previous.link.close(CLOSE_REPLACED, "replaced by a newer connection"))
        Lifecycle._tell(self._lifecycle.attached, session)
        return attachment

    def _take_place(self, client: str, identity: Identity | None) -> None:
        """Take a place for a new session of ``client``, or raise SessionsFull. When the node
        is full, a session that proved an identity displaces the newest detached one never
        used; an anonymous one displaces none (a flood of them could otherwise push out every
        runtime briefly away)."""
        refused = self._bound.refusal(client)
        if refused is not None and refused.scope == "total" and _verified(identity):
            victim = self._eviction.pick_unused()
            if victim is not None:
                self._evict(victim, "displaced by a new session that proved an identity")
                # Its place is free from now on; its release (in its runtime's line, later)
                # gives nothing back again.
                self._give_place(victim)
        refused = self._bound.take(client)
        if refused is not None:
            raise SessionsFull(refused)

    def _give_place(self, session: Session) -> None:
        if session.id not in self._placeless:
            self._placeless.add(session.id)
            self._bound.give(session.client)

    def place_refusal(self, runtime_url: str, client: str) -> BoundRefused | None:
        """Why a connection of ``client`` would not get a session for ``runtime_url`` now (for
        an answer before the upgrade; ``attach`` decides again when it takes the place)."""
        if runtime_url in self._by_runtime:
            return None
        refused = self._bound.refusal(client)
        if refused is not None and refused.scope == "total":
            return None  # may displace an unused session if it proves an identity: attach says
        return refused

    async def admit(self, runtime_url: str, token: str | None, identity: Identity | None) -> None:
        """Raise TokenRejected or SessionRefused unless a connection with ``token`` and
        ``identity`` may have the runtime's session (checked again by ``attach``); after any
        move of the session here (HeldElsewhere when that takes too long)."""
        async with self._connection_turn(runtime_url):
            self._admit_on_line(runtime_url, token, identity)

    def _admit_on_line(
        self, runtime_url: str, token: str | None, identity: Identity | None
    ) -> None:
        if token is not None:
            self.check_token(runtime_url, token)
            session = self._by_runtime.get(runtime_url)
            if session is not None:
                self._admit_with_token(session, identity)
            return
        session = self._by_runtime.get(runtime_url)
        if session is not None:
            self._admit_without_token(session, identity)

    async def _in_use(self, claim: str) -> bool:
        return self._claim_in_use is not None and await self._claim_in_use(claim)

    def _admit_to_claim(self, kept: ClaimRow, token: str | None, identity: Identity | None) -> None:
        """Whether a connection may take up the runtimeURL its ended session left to its
        credential: by the token of that session, or by proving the same identity. Raises
        TokenRejected or SessionRefused (401)."""
        proved = Identity.from_record(kept.identity) if kept.identity is not None else None
        if proved is not None and proved.authenticated and proved.key is not None:
            if proved.same_as(identity):
                return
        elif not kept.protected:
            return  # a stub that never had a token: its runtimeURL was anybody's to take
        if token is not None:
            if not self._tokens.verify(token, kept.runtime_url).names(kept.session_id, kept.claim):
                raise TokenRejected("session token names a session that no longer exists")
            return
        raise SessionRefused(
            "this runtimeURL's registrations belong to another runtime's credential: present "
            "its session token (or identity), or connect with a runtimeURL of your own"
        )

    @staticmethod
    def _admit_without_token(session: Session, identity: Identity | None) -> None:
        """Whether a connection presenting no session token may have ``session``: only by
        proving the identity the session has, i.e. the same key ((issuer, subject) for OpenID
        Connect; an e-mail address is no key)."""
        proved = session.identity
        if proved is not None and proved.authenticated:
            if not proved.same_as(identity):
                raise SessionRefused(
                    "this runtime's session belongs to another identity: present its session "
                    "token or that identity's credential"
                )
            return
        if session.protected:
            raise SessionRefused("this runtime's session is protected: present its session token")

    @staticmethod
    def _admit_with_token(session: Session, identity: Identity | None) -> None:
        """The session token names ``session``; the connection may still not prove another
        identity than the session's (a session's identity does not change hands)."""
        proved = session.identity
        if identity is None or proved is None or not proved.authenticated:
            return
        if proved.key is not None and not proved.same_as(identity):
            raise SessionRefused(
                "this runtime's session belongs to another identity: present that identity's "
                "credential"
            )

    async def reauthenticate(self, attachment: Attachment, identity: Identity) -> None:
        """A fresh credential presented on the session's open connection (``{cmd: 'auth'}``):
        it must prove the identity the session already has (same key), and then sets how long
        the node vouches for it. Raises SessionRefused (answer 403), changing nothing; so too
        when a newer connection took the session meanwhile (it brought its own credential)."""
        async with self._serial.line(attachment.session.runtime_url):
            if not attachment.current:
                raise SessionRefused("the session moved to a newer connection")
            self._reauthenticate_on_line(attachment.session, identity)

    @staticmethod
    def _reauthenticate_on_line(session: Session, identity: Identity) -> None:
        proved = session.identity
        if proved is None or not proved.authenticated:
            raise SessionRefused(
                "this session proved no identity when it connected: connect again with the "
                "credential"
            )
        if not proved.same_as(identity):
            raise SessionRefused(
                "the credential is for another identity than this session's: connect again "
                "as that identity"
            )
        session.identity = identity

    def resume(self, attachment: Attachment, received: int) -> None:
        """Replay what was kept for the runtime, then go live (in the background: the
        connection's frames are read meanwhile)."""
        self._spawn(self._resume(attachment, received))

    async def _resume(self, attachment: Attachment, received: int) -> None:
        session = attachment.session
        try:
            async with self._serial.line(session.runtime_url):
                # Replaced, detached or gone while this waited: the newer connection's own
                # resume replays (what this one's stub said it received says nothing of it).
                if attachment.current and not session.released:
                    await session.mailbox.resume(self._deliveries, received)
        except Exception:
            log.exception("resume failed", runtime=session.runtime_url)
            await attachment.link.close(1011, "resume failed")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    async def detach(self, attachment: Attachment) -> None:
        """The socket closed without `disconnect`: keep the session for a resume."""
        async with self._serial.line(attachment.session.runtime_url):
            self._detach_on_line(attachment)

    def _detach_on_line(self, attachment: Attachment) -> None:
        session = attachment.session
        if not attachment.current:
            return
        session.attachment = None
        session.detached_at = time.monotonic()
        self._detached[session.id] = session
        self._eviction.push(session)
        self._evict_beyond_bound()
        session.mailbox.detach(attachment.link)
        self._connections.dec()
        Lifecycle._tell(self._lifecycle.detached, session)
        self._note_state(session.id, SessionState.DETACHED)

    def mark_used(self, session: Session) -> None:
        """The runtime used its session (sent a frame): stored, so that after a restart
        eviction still tells it from a flood of sessions never used."""
        if not session.used:
            session.used = True
            self._note_state(
                session.id,
                SessionState.CONNECTED if session.attachment is not None else SessionState.DETACHED,
            )

    def _note_state(self, session_id: int, state: SessionState) -> None:
        """The session's state and last sighting, written behind the connection's back: a
        reconnect waits for no database round trip (the states only tell the next start how
        long a session has been away; the start marks every session detached anyway)."""
        self._states[session_id] = state
        if self._state_writer is None:
            self._state_writer = asyncio.create_task(self._write_states(), name="session-states")

    async def _write_states(self) -> None:
        try:
            while self._states:
                states, self._states = self._states, {}
                for session_id, state in states.items():
                    session = self._by_id.get(session_id)
                    used = session.used if session is not None else True
                    try:
                        await self._rows.set_state(session_id, state, used=used)
                    except Exception as exc:  # noqa: BLE001 - kept for the next round
                        log.warning("session state not written; retrying", error=repr(exc))
                        self._states.setdefault(session_id, state)
                        await asyncio.sleep(1.0)
        finally:
            self._state_writer = None

    async def stop_writing_states(self, timeout: float = 2.0) -> None:
        """At the end of a stop, before the database closes: the states still to write get
        ``timeout`` seconds (they only tell the next start how long a session has been away),
        then the writer stops rather than retrying against a closed database for good."""
        writer = self._state_writer
        if writer is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(writer), timeout)
        except TimeoutError:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    async def disconnect(self, attachment: Attachment) -> bool:
        """The runtime's ``disconnect`` on this connection: its session is released, unless a
        newer connection has taken the session meanwhile (then that one keeps it). Whether the
        session was released."""
        async with self._serial.line(attachment.session.runtime_url):
            if not attachment.current:
                return False
            # The stub has let the session go (its token dropped): if the database is away, the
            # release is tried again rather than left to the session's lifetime, during which a
            # tokenless connect of the runtime would be refused. Its next connect waits here.
            await retry(
                lambda: self._release_on_line(attachment.session),
                Backoff(0.25, 5.0),
                deadline=asyncio.get_running_loop().time() + RELEASE_RETRY_SECONDS,
                on_retry=lambda exc, _delay: log.warning(
                    "releasing a session failed; retrying", error=repr(exc)
                ),
            )
            return True

    async def release(self, session: Session) -> None:
        """`disconnect`, or expiry: forget the session and everything it owned. A connection
        of the same runtime attaching meanwhile waits until it is gone, then gets a new one."""
        async with self._serial.line(session.runtime_url):
            await self._release_on_line(session)

    async def _release_on_line(self, session: Session) -> None:
        if session.released:
            return
        # The row first: if the database refuses, the session stays whole (its caller hears of
        # it and the stub resumes) rather than gone from memory while its row, still holding
        # the runtimeURL, refuses every new session of that runtime. While anything is still
        # registered under its claim, the runtimeURL stays its credential's.
        kept = None
        if await self._in_use(session.claim):
            proved = session.identity
            kept = ClaimRow(
                session.runtime_url,
                session.claim,
                session.id,
                session.protected,
                proved.to_record() if proved is not None else None,
            )
        await self._rows.release(session.id, kept)
        session.released = True
        self._detached.pop(session.id, None)
        if session.attachment is not None:
            session.attachment = None
            self._connections.dec()
        unreceived = session.mailbox.discard()
        self._give_place(session)
        self._placeless.discard(session.id)
        self._by_id.pop(session.id, None)
        self._by_runtime.pop(session.runtime_url, None)
        self._by_key.pop(session.key, None)
        Lifecycle._tell(self._lifecycle.released, session)
        self._lifecycle.retire(session.origins())
        if unreceived:
            self._on_unreceived(unreceived)

    def closing(self) -> None:
        """The node closes every stub socket to stop: the sessions it detaches are of runtimes
        that were live a moment ago and reconnect to its next start, not a flood going away, so
        the bound on detached sessions lets none of them go (the newest never used would go
        first: a runtime that connected and has not sent yet)."""
        self._closing = True

    def _evict_beyond_bound(self) -> None:
        if self._closing:
            return
        while len(self._detached) > self._max_detached:
            victim = self._eviction.pick()
            if victim is None:
                break
            self._evict(victim, "too many detached")

    def _evict(self, session: Session, why: str) -> None:
        self._detached.pop(session.id, None)
        log.warning("detached session released early", runtime=session.runtime_url, why=why)
        self._on_evicted()
        self._spawn(self._release_if_detached(session))

    async def _release_if_detached(self, session: Session) -> None:
        async with self._serial.line(session.runtime_url):
            if session.attachment is None:
                try:
                    await self._release_on_line(session)
                except Exception:  # the database away: kept, the next expiry round retries
                    log.exception("releasing a session failed", runtime=session.runtime_url)
                    self._detached[session.id] = session
                    self._detached.move_to_end(session.id, last=False)
                    self._eviction.push(session)

    async def expire(self) -> int:
        """Release sessions detached for longer than the configured lifetime."""
        cutoff = time.monotonic() - self._ttl
        stale = []
        for session in self._detached.values():  # longest detached first
            if session.detached_at is None or session.detached_at >= cutoff:
                break
            stale.append(session)
        for session in stale:
            log.info("session expired", runtime=session.runtime_url)
            # Attached again while this waited for its line: not expired after all.
            await self._release_if_detached(session)
        return len(stale)


def _verified(identity: Identity | None) -> bool:
    return identity is not None and identity.authenticated and identity.key is not None

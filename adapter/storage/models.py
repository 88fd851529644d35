"""What the node keeps: SQLAlchemy 2.x typed declarative models.

The schema is owned by the Alembic migrations in ``migrations/``; these models must match them
(``tests/integration/test_migrations.py`` checks that autogenerate finds no difference).
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names keep migrations identical on SQLite and PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only autoincrements INTEGER PRIMARY KEY; BigInteger elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class SessionState(enum.StrEnum):
    CONNECTED = "connected"  # a live stub connection is attached
    DETACHED = "detached"  # socket closed without `disconnect`: resumable until it expires


class RuntimeSession(Base):
    """One reTHINK runtime known to the node, identified by its runtimeURL."""

    __tablename__ = "runtime_sessions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    runtime_url: Mapped[str] = mapped_column(String(2048), unique=True)
    # The Matrix virtual user this runtime acts as, e.g. @_rethink_<hash>:server.
    user_id: Mapped[str] = mapped_column(String(255), unique=True)
    # Random and never reused: the stem of the origins the session's messages are numbered in
    # (a database id can come back after a delete; an origin must not).
    key: Mapped[str] = mapped_column(String(32), unique=True)
    # Handed a session token: only a connection presenting it (or the same verified identity)
    # may resume or take over the session.
    protected: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # The identity the runtime proved when it connected (JSON), None for an anonymous one.
    identity: Mapped[str | None] = mapped_column(Text)
    state: Mapped[SessionState] = mapped_column(
        Enum(
            SessionState,
            name="session_state",
            native_enum=False,
            length=16,
            values_callable=lambda e: [m.value for m in e],
        )
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The node process that holds the session (its connection, or its deliveries while it is
    # away) when the domain runs several; NULL with one.
    holder: Mapped[str | None] = mapped_column(String(64))
    # Set by a process handing the session to another (JSON): from where the new holder reads
    # the rooms again for it, and how far the old one's lanes carry its runtime's messages.
    handover: Mapped[str | None] = mapped_column(Text)
    # The credential's claim on the runtimeURL: random, what the runtime's registry entries are
    # owned by. A new session of the same runtimeURL keeps it only by proving the credential
    # of the session before (its token, or the same verified identity).
    claim: Mapped[str] = mapped_column(String(32), server_default="")
    # Who the session's client is (adapter/clients.py): a start counts a session read back
    # under its client's bounds again, not as nobody's.
    client: Mapped[str] = mapped_column(Text, server_default="")
    # Whether the runtime ever used the session (sent a frame, came back to it): eviction
    # takes the never used first. Sessions stored before this was kept count as used.
    used: Mapped[bool] = mapped_column(Boolean, server_default=true())


class RuntimeClaim(Base):
    """A runtimeURL whose session ended while its registry entries live on: it stays the
    credential's (only a connection proving it gets the runtimeURL, and with it the entries)
    until nothing is registered under the claim any more."""

    __tablename__ = "runtime_claims"

    runtime_url: Mapped[str] = mapped_column(String(2048), primary_key=True)
    claim: Mapped[str] = mapped_column(String(32))
    # The session that ended: a token naming it proves the credential.
    session_id: Mapped[int] = mapped_column(BigId)
    protected: Mapped[bool] = mapped_column(Boolean)
    identity: Mapped[str | None] = mapped_column(Text)
    released_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Allocation(Base):
    """An address allocated by the MN to a runtime (hyperty or data object)."""

    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(2048), unique=True)
    scheme: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[int] = mapped_column(
        ForeignKey("runtime_sessions.id", ondelete="CASCADE"), index=True
    )
    # Names the block this address was allocated in; a delete by key removes the block. Not
    # indexed: blocks are looked up in the routing table, and an index would cost every
    # allocation (the hot path of the allocation benchmark) one more page write.
    allocation_key: Mapped[str | None] = mapped_column(String(1024))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ReleasedAddress(Base):
    """An address the node allocated and its runtime let go (by ``delete`` or with its session).
    Kept for as long as the registry may still name it, so that nobody else takes it up by
    using it (access.py, "Claim"): what is sent to it is not sent to a stranger."""

    __tablename__ = "released_addresses"

    address: Mapped[str] = mapped_column(String(2048), primary_key=True)
    released_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Subscription(Base):
    """A runtime subscribed to an exact address (e.g. ``<obj>/changes``)."""

    __tablename__ = "subscriptions"
    __table_args__ = (
        UniqueConstraint("address", "session_id", name="uq_subscriptions_address_session"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(2048), index=True)
    session_id: Mapped[int] = mapped_column(
        ForeignKey("runtime_sessions.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LearnedRoute(Base):
    """A `from` address the node saw arrive over a runtime's connection without allocating it."""

    __tablename__ = "learned_routes"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(2048), unique=True)
    session_id: Mapped[int] = mapped_column(
        ForeignKey("runtime_sessions.id", ondelete="CASCADE"), index=True
    )
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Room(Base):
    """The room map: which Matrix room carries which traffic."""

    __tablename__ = "rooms"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    room_id: Mapped[str] = mapped_column(String(255), unique=True)
    alias: Mapped[str] = mapped_column(String(255), unique=True)
    # What the room is for (e.g. "outbox"), and whose it is when it belongs to one runtime.
    purpose: Mapped[str] = mapped_column(String(32))
    # The Matrix user that created the room and sends into it (reads its history for exports).
    creator: Mapped[str] = mapped_column(String(255))
    session_id: Mapped[int | None] = mapped_column(
        ForeignKey("runtime_sessions.id", ondelete="SET NULL"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ProcessedTransaction(Base):
    """Appservice transactions already handled; makes Synapse's retries idempotent."""

    __tablename__ = "processed_transactions"

    txn_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    processed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    event_count: Mapped[int] = mapped_column(Integer)


class PendingDelivery(Base):
    """A delivery the runtime has not confirmed: kept while it is not connected, or written
    when its stub is slow to acknowledge it. Replayed in delivery-number order."""

    __tablename__ = "pending_deliveries"
    # Unique: a checkpoint retried after an ambiguous commit writes nothing twice.
    __table_args__ = (
        Index("ix_pending_deliveries_session_dseq", "session_id", "dseq", unique=True),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("runtime_sessions.id", ondelete="CASCADE"))
    # The session's delivery number: only grows, also across restarts of the node.
    dseq: Mapped[int] = mapped_column(BigInteger)
    # The reTHINK message exactly as the sender wrote it (delivered unmodified); NULL when it
    # is kept once for every runtime it waits for, in ``kept_payloads`` (``payload_digest``).
    payload: Mapped[str | None] = mapped_column(Text)
    payload_digest: Mapped[str | None] = mapped_column(String(64), index=True)
    # Who numbered the message and its number there; NULL for the node's own answers.
    origin: Mapped[str | None] = mapped_column(String(128))
    oseq: Mapped[int] = mapped_column(BigInteger)
    event_id: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class KeptPayload(Base):
    """A message kept for several runtimes that are away (a publication to a stream's
    subscribers): stored once, named by its SHA-256, and referenced by each of their
    ``pending_deliveries`` rows. Unreferenced ones are swept by the node's maintenance once
    ``touched_at`` (its last write) is old enough that no write in flight can still refer to
    it."""

    __tablename__ = "kept_payloads"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    payload: Mapped[str] = mapped_column(Text)
    touched_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class LanePosition(Base):
    """Where a lane's recovery starts: its last event whose deliveries are all settled
    (acknowledged by the runtimes or kept in ``pending_deliveries``)."""

    __tablename__ = "lane_positions"

    # The node process whose reading it is ("" when the domain has one): every process reads
    # every lane, each at its own pace.
    process: Mapped[str] = mapped_column(String(64), primary_key=True, server_default="")
    room_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SenderMark(Base):
    """The highest message number of an origin the node has routed (as of the lane positions):
    a message numbered at or below it is a resend and is not routed again."""

    __tablename__ = "sender_marks"

    process: Mapped[str] = mapped_column(String(64), primary_key=True, server_default="")
    origin: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class NodeCounter(Base):
    """Small counters the node keeps across restarts (``starts``: its start count, the high
    bits of the numbers it hands out, so they never repeat)."""

    __tablename__ = "node_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class NodeProcess(Base):
    """A node process of the domain, when it runs several: the lanes it writes (every other
    process reads them) and when it was last alive."""

    __tablename__ = "node_processes"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # JSON list of the room ids of its lanes.
    lane_rooms: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RemoteSubscription(Base):
    """A runtime of another reTHINK domain subscribed, through its node, to a stream of this
    one: one copy of what is published there goes to that domain while any of its runtimes
    holds such a row (its node fans it out)."""

    __tablename__ = "remote_subscriptions"
    __table_args__ = (
        UniqueConstraint(
            "domain", "runtime", "address", name="uq_remote_subscriptions_domain_runtime_address"
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(2048))
    domain: Mapped[str] = mapped_column(String(255), index=True)
    # The peer runtime that asked ("" for rows from before runtimes were named).
    runtime: Mapped[str] = mapped_column(String(512), server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class NodeSecret(Base):
    """Secrets the node generates once and keeps (the session-token key when the configuration
    names none), so what they sign survives a restart."""

    __tablename__ = "node_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ExportPosition(Base):
    """How far `rethink-mn export` has read each room (a Matrix pagination token)."""

    __tablename__ = "export_positions"

    room_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The `end` token of the last page written; the next run reads forward from it.
    token: Mapped[str] = mapped_column(String(512))
    events: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

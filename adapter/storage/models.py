"""What the node keeps: SQLAlchemy 2.x typed declarative models.

The schema is owned by the Alembic migrations in ``migrations/``; these models must match them
(``tests/integration/test_migrations.py`` checks that autogenerate finds no difference).
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
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
    """A message routed to a runtime whose session is alive but not connected, kept in order."""

    __tablename__ = "pending_deliveries"
    __table_args__ = (Index("ix_pending_deliveries_session_seq", "session_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("runtime_sessions.id", ondelete="CASCADE"))
    # The reTHINK message exactly as the sender wrote it (delivered unmodified).
    payload: Mapped[str] = mapped_column(Text)
    event_id: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ExportPosition(Base):
    """How far `rethink-mn export` has read each room (a Matrix pagination token)."""

    __tablename__ = "export_positions"

    room_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The `end` token of the last page written; the next run reads forward from it.
    token: Mapped[str] = mapped_column(String(512))
    events: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

"""Initial schema: sessions, allocations, subscriptions, learned routes, room map, transactions,
pending deliveries.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)


def _session_fk(nullable: bool = False) -> list[sa.SchemaItem]:
    return [sa.Column("session_id", BigId, nullable=nullable)]


def _fk(table: str, ondelete: str = "CASCADE") -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["session_id"],
        ["runtime_sessions.id"],
        name=op.f(f"fk_{table}_session_id_runtime_sessions"),
        ondelete=ondelete,
    )


def upgrade() -> None:
    op.create_table(
        "processed_transactions",
        sa.Column("txn_id", sa.String(255), nullable=False),
        sa.Column("processed_at", Timestamp, nullable=False),
        sa.Column("event_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("txn_id", name=op.f("pk_processed_transactions")),
    )
    op.create_index(
        op.f("ix_processed_transactions_processed_at"), "processed_transactions", ["processed_at"]
    )

    op.create_table(
        "runtime_sessions",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("runtime_url", sa.String(2048), nullable=False),
        sa.Column("user_id", sa.String(255), nullable=False),
        sa.Column(
            "state",
            sa.Enum("connected", "detached", name="session_state", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("last_seen", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runtime_sessions")),
        sa.UniqueConstraint("runtime_url", name=op.f("uq_runtime_sessions_runtime_url")),
        sa.UniqueConstraint("user_id", name=op.f("uq_runtime_sessions_user_id")),
    )

    op.create_table(
        "allocations",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("address", sa.String(2048), nullable=False),
        sa.Column("scheme", sa.String(64), nullable=False),
        *_session_fk(),
        sa.Column("allocation_key", sa.String(1024), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        _fk("allocations"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocations")),
        sa.UniqueConstraint("address", name=op.f("uq_allocations_address")),
    )
    op.create_index(op.f("ix_allocations_session_id"), "allocations", ["session_id"])

    op.create_table(
        "learned_routes",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("address", sa.String(2048), nullable=False),
        *_session_fk(),
        sa.Column("updated_at", Timestamp, nullable=False),
        _fk("learned_routes"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_learned_routes")),
        sa.UniqueConstraint("address", name=op.f("uq_learned_routes_address")),
    )
    op.create_index(op.f("ix_learned_routes_session_id"), "learned_routes", ["session_id"])

    op.create_table(
        "pending_deliveries",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        *_session_fk(),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("event_id", sa.String(255), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        _fk("pending_deliveries"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pending_deliveries")),
    )
    op.create_index("ix_pending_deliveries_session_seq", "pending_deliveries", ["session_id", "id"])

    op.create_table(
        "rooms",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("room_id", sa.String(255), nullable=False),
        sa.Column("alias", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("creator", sa.String(255), nullable=False),
        *_session_fk(nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        _fk("rooms", ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rooms")),
        sa.UniqueConstraint("alias", name=op.f("uq_rooms_alias")),
        sa.UniqueConstraint("room_id", name=op.f("uq_rooms_room_id")),
    )
    op.create_index(op.f("ix_rooms_session_id"), "rooms", ["session_id"])

    op.create_table(
        "subscriptions",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("address", sa.String(2048), nullable=False),
        *_session_fk(),
        sa.Column("created_at", Timestamp, nullable=False),
        _fk("subscriptions"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_subscriptions")),
        sa.UniqueConstraint("address", "session_id", name="uq_subscriptions_address_session"),
    )
    op.create_index(op.f("ix_subscriptions_address"), "subscriptions", ["address"])
    op.create_index(op.f("ix_subscriptions_session_id"), "subscriptions", ["session_id"])


def downgrade() -> None:
    for table in (
        "subscriptions",
        "rooms",
        "pending_deliveries",
        "learned_routes",
        "allocations",
        "runtime_sessions",
        "processed_transactions",
    ):
        op.drop_table(table)

"""Lanes and acknowledged delivery: session keys, numbered pending deliveries, lane positions,
sender marks, node counters.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.add_column(sa.Column("key", sa.String(32), nullable=True))
    sessions = sa.table("runtime_sessions", sa.column("id", sa.Integer), sa.column("key"))
    conn = op.get_bind()
    for (session_id,) in conn.execute(sa.select(sessions.c.id)).all():
        conn.execute(
            sessions.update().where(sessions.c.id == session_id).values(key=secrets.token_hex(8))
        )
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.alter_column("key", existing_type=sa.String(32), nullable=False)
        batch.create_unique_constraint(op.f("uq_runtime_sessions_key"), ["key"])

    with op.batch_alter_table("pending_deliveries") as batch:
        batch.add_column(sa.Column("dseq", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("origin", sa.String(128), nullable=True))
        batch.add_column(sa.Column("oseq", sa.BigInteger(), nullable=True))
    # Rows kept before numbering existed keep their order: their id is below every number
    # handed out from now on (those carry the node's start count in their high bits).
    op.execute("UPDATE pending_deliveries SET dseq = id, oseq = 0")
    with op.batch_alter_table("pending_deliveries") as batch:
        batch.alter_column("dseq", existing_type=sa.BigInteger(), nullable=False)
        batch.alter_column("oseq", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_index("ix_pending_deliveries_session_seq")
        batch.create_index("ix_pending_deliveries_session_dseq", ["session_id", "dseq"])

    op.create_table(
        "lane_positions",
        sa.Column("room_id", sa.String(255), nullable=False),
        sa.Column("event_id", sa.String(255), nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("room_id", name=op.f("pk_lane_positions")),
    )
    op.create_table(
        "sender_marks",
        sa.Column("origin", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("origin", name=op.f("pk_sender_marks")),
    )
    op.create_index(op.f("ix_sender_marks_updated_at"), "sender_marks", ["updated_at"])
    op.create_table(
        "node_counters",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_node_counters")),
    )


def downgrade() -> None:
    op.drop_table("node_counters")
    op.drop_index(op.f("ix_sender_marks_updated_at"), table_name="sender_marks")
    op.drop_table("sender_marks")
    op.drop_table("lane_positions")
    with op.batch_alter_table("pending_deliveries") as batch:
        batch.drop_index("ix_pending_deliveries_session_dseq")
        batch.create_index("ix_pending_deliveries_session_seq", ["session_id", "id"])
        batch.drop_column("oseq")
        batch.drop_column("origin")
        batch.drop_column("dseq")
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.drop_constraint(op.f("uq_runtime_sessions_key"), type_="unique")
        batch.drop_column("key")

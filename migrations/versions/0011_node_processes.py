"""Several node processes for one domain: who holds each session, each process's own lane
positions and sender marks, and the processes themselves.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key_by_process(table: str, key: str) -> None:
    # SQLite changes a primary key only by copying the table; batch mode does that there and
    # alters in place on PostgreSQL.
    with op.batch_alter_table(table, recreate="auto") as batch:
        batch.add_column(sa.Column("process", sa.String(64), nullable=False, server_default=""))
        batch.drop_constraint(f"pk_{table}", type_="primary")
        batch.create_primary_key(f"pk_{table}", ["process", key])


def _key_without_process(table: str, key: str) -> None:
    op.execute(f"DELETE FROM {table} WHERE process <> ''")
    with op.batch_alter_table(table, recreate="auto") as batch:
        batch.drop_constraint(f"pk_{table}", type_="primary")
        batch.drop_column("process")
        batch.create_primary_key(f"pk_{table}", [key])


def upgrade() -> None:
    op.add_column("runtime_sessions", sa.Column("holder", sa.String(64), nullable=True))
    op.add_column("runtime_sessions", sa.Column("handover", sa.Text(), nullable=True))
    _key_by_process("lane_positions", "room_id")
    _key_by_process("sender_marks", "origin")
    op.create_table(
        "node_processes",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("lane_rooms", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_node_processes"),
    )


def downgrade() -> None:
    op.drop_table("node_processes")
    _key_without_process("sender_marks", "origin")
    _key_without_process("lane_positions", "room_id")
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.drop_column("handover")
        batch.drop_column("holder")

"""Export positions: how far the room-event export has read each room.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "export_positions",
        sa.Column("room_id", sa.String(255), nullable=False),
        sa.Column("token", sa.String(512), nullable=False),
        sa.Column("events", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("room_id", name=op.f("pk_export_positions")),
    )


def downgrade() -> None:
    op.drop_table("export_positions")

"""Addresses the node allocated and their runtimes let go, kept for as long as the registry may
name them: nobody takes them up by using them.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "released_addresses",
        sa.Column("address", sa.String(2048), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("address", name="pk_released_addresses"),
    )
    op.create_index("ix_released_addresses_released_at", "released_addresses", ["released_at"])


def downgrade() -> None:
    op.drop_index("ix_released_addresses_released_at", table_name="released_addresses")
    op.drop_table("released_addresses")

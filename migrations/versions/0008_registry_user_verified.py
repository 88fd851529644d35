"""Registry entries record whether their user URL was vouched for (verified identity, operator).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "registry_entries"


def upgrade() -> None:
    # Entries registered before this revision count as unverified: none was checked.
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(
            sa.Column("user_verified", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("user_verified")

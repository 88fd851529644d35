"""A kept delivery is stored once: (session, delivery number) is unique, so a checkpoint retried
after an ambiguous commit cannot write it twice.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "pending_deliveries"


def upgrade() -> None:
    op.execute(
        f"DELETE FROM {TABLE} WHERE id NOT IN "
        f"(SELECT MIN(id) FROM {TABLE} GROUP BY session_id, dseq)"
    )
    op.drop_index("ix_pending_deliveries_session_dseq", table_name=TABLE)
    op.create_index(
        "ix_pending_deliveries_session_dseq", TABLE, ["session_id", "dseq"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_pending_deliveries_session_dseq", table_name=TABLE)
    op.create_index("ix_pending_deliveries_session_dseq", TABLE, ["session_id", "dseq"])

"""A message kept for many runtimes that are away (a publication to a stream's subscribers) is
stored once, in ``kept_payloads``, and each of their ``pending_deliveries`` rows refers to it
by its SHA-256 instead of holding a copy.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "pending_deliveries"


def upgrade() -> None:
    op.create_table(
        "kept_payloads",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("touched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_kept_payloads"),
    )
    op.create_index("ix_kept_payloads_touched_at", "kept_payloads", ["touched_at"])
    with op.batch_alter_table(TABLE) as batch:
        batch.alter_column("payload", existing_type=sa.Text(), nullable=True)
        batch.add_column(sa.Column("payload_digest", sa.String(64), nullable=True))
        batch.create_index("ix_pending_deliveries_payload_digest", ["payload_digest"])


def downgrade() -> None:
    # Every row holds its own copy again before the shared ones go.
    op.execute(
        f"UPDATE {TABLE} SET payload = (SELECT k.payload FROM kept_payloads k "
        f"WHERE k.digest = {TABLE}.payload_digest) WHERE payload IS NULL"
    )
    op.execute(f"DELETE FROM {TABLE} WHERE payload IS NULL")
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_index("ix_pending_deliveries_payload_digest")
        batch.drop_column("payload_digest")
        batch.alter_column("payload", existing_type=sa.Text(), nullable=False)
    op.drop_index("ix_kept_payloads_touched_at", table_name="kept_payloads")
    op.drop_table("kept_payloads")

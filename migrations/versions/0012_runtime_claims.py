"""A runtimeURL belongs to the credential that established it: each session carries its claim
(what its registry entries are owned by), and a claim outlives its session while entries do.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.add_column(sa.Column("claim", sa.String(32), nullable=False, server_default=""))
    # Every session so far claims its runtimeURL with its own key; the registry entries its
    # runtime owned (by runtimeURL until now) are the claim's. Entries of a runtimeURL with no
    # session left belong to nobody now: they expire, and only the operator changes them.
    op.execute("UPDATE runtime_sessions SET claim = key")
    op.execute(
        "UPDATE registry_entries SET owner = (SELECT s.claim FROM runtime_sessions s "
        "WHERE s.runtime_url = registry_entries.owner)"
    )
    op.create_table(
        "runtime_claims",
        sa.Column("runtime_url", sa.String(2048), nullable=False),
        sa.Column("claim", sa.String(32), nullable=False),
        sa.Column(
            "session_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("protected", sa.Boolean(), nullable=False),
        sa.Column("identity", sa.Text(), nullable=True),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("runtime_url", name="pk_runtime_claims"),
    )


def downgrade() -> None:
    op.drop_table("runtime_claims")
    op.execute(
        "UPDATE registry_entries SET owner = (SELECT s.runtime_url FROM runtime_sessions s "
        "WHERE s.claim = registry_entries.owner)"
    )
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.drop_column("claim")

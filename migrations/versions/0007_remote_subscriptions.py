"""Other domains' subscriptions to addresses of this one (federation).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "remote_subscriptions",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("address", sa.String(2048), nullable=False),
        sa.Column("domain", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_remote_subscriptions")),
        sa.UniqueConstraint(
            "address", "domain", name=op.f("uq_remote_subscriptions_address_domain")
        ),
    )
    op.create_index(op.f("ix_remote_subscriptions_domain"), "remote_subscriptions", ["domain"])


def downgrade() -> None:
    op.drop_index(op.f("ix_remote_subscriptions_domain"), table_name="remote_subscriptions")
    op.drop_table("remote_subscriptions")

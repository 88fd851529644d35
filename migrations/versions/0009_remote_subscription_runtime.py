"""A peer domain's subscriptions name the peer runtime that asked, so that they end with it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "remote_subscriptions"


def upgrade() -> None:
    # Rows from before name no runtime (""): the peer's node as a whole asked for them.
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("runtime", sa.String(512), server_default="", nullable=False))
        batch.drop_constraint("uq_remote_subscriptions_address_domain", type_="unique")
        batch.create_unique_constraint(
            "uq_remote_subscriptions_domain_runtime_address", ["domain", "runtime", "address"]
        )


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_constraint("uq_remote_subscriptions_domain_runtime_address", type_="unique")
        batch.drop_column("runtime")
    # Several runtimes' rows for one address collapse into one (the old key).
    op.execute(
        "DELETE FROM remote_subscriptions WHERE id NOT IN "
        "(SELECT MIN(id) FROM remote_subscriptions GROUP BY address, domain)"
    )
    with op.batch_alter_table(TABLE) as batch:
        batch.create_unique_constraint(
            "uq_remote_subscriptions_address_domain", ["address", "domain"]
        )

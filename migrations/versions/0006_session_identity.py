"""Protected sessions and verified identities; the node's own secrets.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.add_column(
            sa.Column("protected", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.add_column(sa.Column("identity", sa.Text(), nullable=True))
    op.create_table(
        "node_secrets",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_node_secrets")),
    )


def downgrade() -> None:
    op.drop_table("node_secrets")
    with op.batch_alter_table("runtime_sessions") as batch:
        batch.drop_column("identity")
        batch.drop_column("protected")

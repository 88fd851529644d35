"""A session keeps who its client is (``client``) and whether its runtime used it (``used``),
so that a start counts the sessions it reads back under their clients' bounds and eviction
still takes the never used first. Sessions stored before count as used (what the node assumed
of them) and as nobody's.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "runtime_sessions"


def upgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.add_column(sa.Column("client", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("used", sa.Boolean(), server_default=sa.true(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table(TABLE) as batch:
        batch.drop_column("used")
        batch.drop_column("client")

"""The built-in domain registry: registered hyperties and data objects.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)
TABLE = "registry_entries"
# Looked up by these: the lookups of dev-registry-domain, presence (owner), expiry.
INDEXED = (
    "user_url",
    "email",
    "guid",
    "name",
    "reporter",
    "owner",
    "expires_at",
    "disconnected_at",
)


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "hyperty", "dataobject", name="registry_entry_kind", native_enum=False, length=16
            ),
            nullable=False,
        ),
        sa.Column("url", sa.String(1024), nullable=False),
        sa.Column("user_url", sa.String(1024), nullable=True),
        sa.Column("email", sa.String(1024), nullable=True),
        sa.Column("guid", sa.String(1024), nullable=True),
        sa.Column("descriptor", sa.Text(), nullable=True),
        sa.Column("p2p_handler", sa.Text(), nullable=True),
        sa.Column("name", sa.String(1024), nullable=True),
        sa.Column("object_schema", sa.Text(), nullable=True),
        sa.Column("reporter", sa.String(1024), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("data_schemes", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("runtime", sa.Text(), nullable=True),
        sa.Column("owner", sa.String(1024), nullable=True),
        sa.Column("p2p_requester", sa.Text(), nullable=True),
        sa.Column("expires", sa.Integer(), nullable=False),
        sa.Column("starting_time", Timestamp, nullable=False),
        sa.Column("last_modified", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("disconnected_at", Timestamp, nullable=True),
        sa.Column("detached", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registry_entries")),
    )
    op.create_index("uq_registry_entries_kind_url", TABLE, ["kind", "url"], unique=True)
    for column in INDEXED:
        op.create_index(op.f(f"ix_{TABLE}_{column}"), TABLE, [column])


def downgrade() -> None:
    for column in INDEXED:
        op.drop_index(op.f(f"ix_{TABLE}_{column}"), table_name=TABLE)
    op.drop_index("uq_registry_entries_kind_url", table_name=TABLE)
    op.drop_table(TABLE)

"""What the built-in domain registry keeps: one row per registered hyperty or data object.

Hyperties and data objects share a table: presence, expiry and status notifications treat both
alike, and each kind only fills its own columns. The schema is owned by migrations 0004 and 0008.
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Enum, Index, Integer, String, Text, false
from sqlalchemy.orm import Mapped, mapped_column

from .models import Base, BigId

# Longest key (URL, user, e-mail, GUID, name, runtime) the registry indexes; longer ones are
# refused with 400 before they reach the database (PostgreSQL would reject them).
KEY_LENGTH = 1024
STATUS_LENGTH = 64
# The two statuses the node itself sets; registrations may carry others ("created").
LIVE = "live"
DISCONNECTED = "disconnected"


class EntryKind(enum.StrEnum):
    HYPERTY = "hyperty"
    DATA_OBJECT = "dataobject"


class RegistryEntry(Base):
    __tablename__ = "registry_entries"
    __table_args__ = (
        # The registry keeps hyperties and data objects in separate maps, so one URL may be both.
        Index("uq_registry_entries_kind_url", "kind", "url", unique=True),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[EntryKind] = mapped_column(
        Enum(
            EntryKind,
            name="registry_entry_kind",
            native_enum=False,
            length=16,
            values_callable=lambda e: [m.value for m in e],
        )
    )
    url: Mapped[str] = mapped_column(String(KEY_LENGTH))

    # Hyperties: the user they belong to, the user's e-mail (the user URL's last path segment,
    # as dev-registry-domain derives it), the user's GUID, the catalogue descriptor.
    user_url: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    email: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    guid: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    descriptor: Mapped[str | None] = mapped_column(Text)
    p2p_handler: Mapped[str | None] = mapped_column(Text)

    # Data objects: their name, schema and reporting hyperty.
    name: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    object_schema: Mapped[str | None] = mapped_column(Text)
    reporter: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)

    resources: Mapped[list[str]] = mapped_column(JSON)
    data_schemes: Mapped[list[str]] = mapped_column(JSON)
    # As registered ("live", "created", "disconnected"...); expiry is applied on top of it.
    status: Mapped[str] = mapped_column(String(STATUS_LENGTH))
    # The `runtime` field as registered, and the runtime whose presence the entry follows and
    # who alone may change it: the session that registered it through the MN, else that field.
    runtime: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(KEY_LENGTH), index=True)
    # Hyperties: `user_url` was vouched for, by the registering runtime's verified identity or
    # by the operator (the REST API). An entry registered under a user URL without that gives
    # way when the verified user registers under it.
    user_verified: Mapped[bool] = mapped_column(Boolean, server_default=false())
    p2p_requester: Mapped[str | None] = mapped_column(Text)

    expires: Mapped[int] = mapped_column(Integer)
    starting_time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_modified: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # last_modified + expires, stored so the sweep finds expired entries by index.
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    # Set while the stored status is "disconnected": when the grace period started.
    disconnected_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    # Disconnected because its owner's session detached: a resume of that session revives it.
    detached: Mapped[bool] = mapped_column(Boolean)

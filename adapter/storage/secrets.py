"""Secrets the node generates once and keeps in its database."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, select

from .database import Database, upsert
from .models import NodeSecret


class SecretStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._keep_first = upsert(db.dialect, NodeSecret, ["name"])

    async def get_or_create(self, name: str, generate: Callable[[], str]) -> str:
        """The secret called ``name``; the first caller's ``generate()`` wins, also when two
        nodes start at once on one database."""
        candidate = generate()

        def op(conn: Connection) -> str:
            conn.execute(self._keep_first, {"name": name, "value": candidate})
            return str(
                conn.execute(select(NodeSecret.value).where(NodeSecret.name == name)).scalar_one()
            )

        return await self._db.run(op)

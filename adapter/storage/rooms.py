"""The room map: which Matrix room carries which traffic."""

from __future__ import annotations

from sqlalchemy import Connection, delete, select

from .clock import utcnow
from .database import Database, upsert
from .models import Room

_R = Room


class RoomStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._upsert = upsert(
            db.dialect, _R, ["alias"], update=["room_id", "creator", "session_id", "created_at"]
        )

    async def by_alias(self, alias: str) -> str | None:
        def op(conn: Connection) -> str | None:
            found = conn.execute(select(_R.room_id).where(_R.alias == alias)).first()
            return str(found[0]) if found else None

        return await self._db.run(op)

    async def add(
        self, room_id: str, alias: str, purpose: str, creator: str, session_id: int | None
    ) -> None:
        """Record the room an alias names; a newer room for the alias (the homeserver lost the
        old one and the node made it again) replaces the old entry."""
        row = {
            "room_id": room_id,
            "alias": alias,
            "purpose": purpose,
            "creator": creator,
            "session_id": session_id,
            "created_at": utcnow(),
        }
        await self._db.run(lambda conn: conn.execute(self._upsert, row))

    async def purposes(self, room_id: str) -> set[str]:
        """What the node uses ``room_id`` for (empty: a room it does not know)."""

        def op(conn: Connection) -> set[str]:
            return {str(p) for p in conn.execute(select(_R.purpose).where(_R.room_id == room_id))}

        return await self._db.run(op)

    async def all(self) -> list[tuple[str, str, str, str]]:
        """(room_id, alias, purpose, creator) of every room the node uses."""

        def op(conn: Connection) -> list[tuple[str, str, str, str]]:
            rows = conn.execute(select(_R.room_id, _R.alias, _R.purpose, _R.creator))
            return [(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]

        return await self._db.run(op)

    async def forget(self, room_id: str, purpose: str) -> None:
        """The node no longer uses ``room_id`` for ``purpose`` (a peer's room it left)."""
        statement = delete(_R).where(_R.room_id == room_id, _R.purpose == purpose)
        await self._db.run(lambda conn: conn.execute(statement))

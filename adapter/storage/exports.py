"""Where the room-event export stopped in each room, so the next run reads only what is new."""

from __future__ import annotations

from sqlalchemy import Connection, insert, select, update

from .clock import utcnow
from .database import Database
from .models import ExportPosition

_E = ExportPosition


class ExportPositionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, room_id: str) -> tuple[str, int] | None:
        def op(conn: Connection) -> tuple[str, int] | None:
            row = conn.execute(select(_E.token, _E.events).where(_E.room_id == room_id)).first()
            return (str(row[0]), int(row[1])) if row else None

        return await self._db.run(op)

    async def save(self, room_id: str, token: str, events_added: int) -> None:
        def op(conn: Connection) -> None:
            now = utcnow()
            result = conn.execute(
                update(_E)
                .where(_E.room_id == room_id)
                .values(token=token, events=_E.events + events_added, updated_at=now)
            )
            if not result.rowcount:
                conn.execute(
                    insert(_E).values(
                        room_id=room_id, token=token, events=events_added, updated_at=now
                    )
                )

        await self._db.run(op)

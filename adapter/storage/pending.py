"""Messages kept for a runtime whose session is alive but not connected, in arrival order."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, func, insert, select

from .clock import utcnow
from .database import Database
from .models import PendingDelivery

_P = PendingDelivery
_APPEND = insert(_P)


class PendingStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def append(self, session_id: int, payloads: Sequence[tuple[str, str | None]]) -> None:
        """Queue ``(message text, carrying event id)`` pairs; ids keep their order."""
        if not payloads:
            return

        now = utcnow()
        rows = [
            {"session_id": session_id, "payload": text, "event_id": event_id, "created_at": now}
            for text, event_id in payloads
        ]
        await self._db.run(lambda conn: conn.execute(_APPEND, rows[0] if len(rows) == 1 else rows))

    async def next_batch(self, session_id: int, limit: int = 500) -> list[tuple[int, str]]:
        def op(conn: Connection) -> list[tuple[int, str]]:
            rows = conn.execute(
                select(_P.id, _P.payload)
                .where(_P.session_id == session_id)
                .order_by(_P.id)
                .limit(limit)
            )
            return [(int(i), str(p)) for i, p in rows]

        return await self._db.run(op)

    async def remove_through(self, session_id: int, last_id: int) -> None:
        def op(conn: Connection) -> None:
            conn.execute(delete(_P).where(_P.session_id == session_id, _P.id <= last_id))

        await self._db.run(op)

    async def count(self, session_id: int) -> int:
        def op(conn: Connection) -> int:
            return int(
                conn.execute(
                    select(func.count()).select_from(_P).where(_P.session_id == session_id)
                ).scalar_one()
            )

        return await self._db.run(op)

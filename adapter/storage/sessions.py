"""Runtime sessions: one row per runtimeURL the node knows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, insert, select, update

from .clock import utcnow
from .database import Database
from .models import RuntimeSession, SessionState

_S = RuntimeSession


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: int
    runtime_url: str
    user_id: str
    state: SessionState
    last_seen: datetime


class SessionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def has_user(self, user_id: str) -> bool:
        def op(conn: Connection) -> bool:
            return conn.execute(select(_S.id).where(_S.user_id == user_id)).first() is not None

        return await self._db.run(op)

    async def create(self, runtime_url: str, user_id: str) -> int:
        def op(conn: Connection) -> int:
            now = utcnow()
            result = conn.execute(
                insert(_S)
                .values(
                    runtime_url=runtime_url,
                    user_id=user_id,
                    state=SessionState.CONNECTED,
                    created_at=now,
                    last_seen=now,
                )
                .returning(_S.id)
            )
            return int(result.scalar_one())

        return await self._db.run(op)

    async def set_state(self, session_id: int, state: SessionState) -> None:
        def op(conn: Connection) -> None:
            conn.execute(
                update(_S).where(_S.id == session_id).values(state=state, last_seen=utcnow())
            )

        await self._db.run(op)

    async def delete(self, session_id: int) -> None:
        """Forget the session and, by cascade, everything it owned."""

        def op(conn: Connection) -> None:
            conn.execute(delete(_S).where(_S.id == session_id))

        await self._db.run(op)

    async def all(self) -> list[SessionRow]:
        def op(conn: Connection) -> list[SessionRow]:
            rows = conn.execute(select(_S.id, _S.runtime_url, _S.user_id, _S.state, _S.last_seen))
            return [SessionRow(*row) for row in rows]

        return await self._db.run(op)

    async def detach_all(self) -> None:
        """At start-up no stub is connected, whatever the rows say after a crash."""

        def op(conn: Connection) -> None:
            conn.execute(
                update(_S)
                .where(_S.state == SessionState.CONNECTED)
                .values(state=SessionState.DETACHED)
            )

        await self._db.run(op)

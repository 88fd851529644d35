"""Which appservice transactions were already processed (persisted, so a restart keeps it)."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from sqlalchemy import Connection, bindparam, delete, insert, select

from .clock import utcnow
from .database import ConstraintViolation, Database
from .models import ProcessedTransaction

_T = ProcessedTransaction
# Built once: both run for every transaction the homeserver pushes.
_FIND = select(_T.txn_id).where(_T.txn_id == bindparam("txn_id"))
_MARK = insert(_T)


class SqlTransactionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def is_processed(self, txn_id: str) -> bool:
        def op(conn: Connection) -> bool:
            return conn.execute(_FIND, {"txn_id": txn_id}).first() is not None

        return await self._db.run_small(op)

    async def mark_processed(self, txn_id: str, event_count: int) -> None:
        row = {"txn_id": txn_id, "processed_at": utcnow(), "event_count": event_count}
        # Already recorded by an earlier attempt is the state we want.
        with contextlib.suppress(ConstraintViolation):
            await self._db.run_small(lambda conn: conn.execute(_MARK, row))

    async def prune(self, keep: timedelta, now: datetime | None = None) -> int:
        """Forget transactions older than ``keep``; the homeserver never retries that long."""
        cutoff = (now or utcnow()) - keep

        def op(conn: Connection) -> int:
            return int(conn.execute(delete(_T).where(_T.processed_at < cutoff)).rowcount or 0)

        return await self._db.run(op)

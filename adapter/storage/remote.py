"""Other domains' subscriptions to addresses of this one (kept across restarts)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, select

from .clock import utcnow
from .database import Database, upsert
from .models import RemoteSubscription

_R = RemoteSubscription


class RemoteSubscriptionStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._add = upsert(db.dialect, _R, ["address", "domain"])

    async def subscribe(self, domain: str, addresses: Sequence[str]) -> None:
        now = utcnow()
        rows = [{"address": a, "domain": domain, "created_at": now} for a in addresses]
        if rows:
            await self._db.run(lambda conn: conn.execute(self._add, rows))

    async def unsubscribe(self, domain: str, addresses: Sequence[str]) -> None:
        def op(conn: Connection) -> None:
            conn.execute(delete(_R).where(_R.domain == domain, _R.address.in_(list(addresses))))

        if addresses:
            await self._db.run(op)

    async def all(self) -> list[tuple[str, str]]:
        """(address, domain) of every remote subscription."""

        def op(conn: Connection) -> list[tuple[str, str]]:
            return [(str(a), str(d)) for a, d in conn.execute(select(_R.address, _R.domain))]

        return await self._db.run(op)

"""Other domains' runtimes' subscriptions to streams of this one (kept across restarts)."""

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
        self._add = upsert(db.dialect, _R, ["domain", "runtime", "address"])

    async def subscribe(self, domain: str, runtime: str, addresses: Sequence[str]) -> None:
        now = utcnow()
        rows = [
            {"address": a, "domain": domain, "runtime": runtime, "created_at": now}
            for a in addresses
        ]
        if rows:
            await self._db.run(lambda conn: conn.execute(self._add, rows))

    async def unsubscribe(
        self, domain: str, runtime: str, addresses: Sequence[str] | None = None
    ) -> None:
        """The runtime's subscriptions to ``addresses`` end (all of them when None)."""
        query = delete(_R).where(_R.domain == domain, _R.runtime == runtime)
        if addresses is not None:
            if not addresses:
                return
            query = query.where(_R.address.in_(list(addresses)))
        await self._db.run(lambda conn: conn.execute(query))

    async def all(self) -> list[tuple[str, str, str]]:
        """(address, domain, runtime) of every remote subscription."""

        def op(conn: Connection) -> list[tuple[str, str, str]]:
            rows = conn.execute(select(_R.address, _R.domain, _R.runtime))
            return [(str(a), str(d), str(r)) for a, d, r in rows]

        return await self._db.run(op)

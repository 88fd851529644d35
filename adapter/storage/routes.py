"""Persistence of the routing state: allocations, subscriptions and learned routes.

The in-memory RoutingTable is the source for routing decisions; these stores make it survive a
restart of the node and are written before an MN service answers, so an answer the runtime got
is never lost. Statements are built once: an allocation's durable write is on the hot path of
every allocation request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, inspect, select

from .clock import utcnow
from .database import Database, Prepared, upsert
from .models import Allocation, LearnedRoute, Subscription

_A, _Sub, _L = Allocation, Subscription, LearnedRoute

_ADD_ALLOCATION = insert(_A)
# By address alone: the routing table has already checked that they are the session's, and
# naming the session too lets SQLite's planner pick the session index, scanning every address
# the session holds for each delete.
_REMOVE_ALLOCATIONS = delete(_A).where(_A.address.in_(bindparam("addresses", expanding=True)))
_UNSUBSCRIBE = delete(_Sub).where(
    _Sub.session_id == bindparam("sid"), _Sub.address.in_(bindparam("addresses", expanding=True))
)


# Up to this many rows a write counts as small (see Database.run_small).
SMALL = 16


@dataclass(frozen=True, slots=True)
class AllocationRow:
    address: str
    session_id: int
    allocation_key: str | None


def _one_or_many(rows: list[dict[str, Any]]) -> dict[str, Any] | list[dict[str, Any]]:
    # A single row executes as one statement; a list takes the (slower) executemany path.
    return rows[0] if len(rows) == 1 else rows


class RouteStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        mapped = inspect(_A).columns
        columns = [
            mapped[c] for c in ("address", "scheme", "session_id", "allocation_key", "created_at")
        ]
        self._add_one = Prepared(
            db, insert(_A).values({c.key: bindparam(c.key) for c in columns}), columns
        )
        self._remove_one = Prepared(
            db, delete(_A).where(_A.address == bindparam("address")), [mapped["address"]]
        )
        self._subscribe = upsert(db.dialect, _Sub, ["address", "session_id"])
        self._learn = upsert(db.dialect, _L, ["address"], update=["session_id", "updated_at"])

    # -- allocations ------------------------------------------------------------------------

    async def add_allocations(
        self, session_id: int, addresses: Sequence[str], scheme: str, key: str | None
    ) -> None:
        now = utcnow()
        rows = [
            {
                "address": a,
                "scheme": scheme,
                "session_id": session_id,
                "allocation_key": key,
                "created_at": now,
            }
            for a in addresses
        ]
        if len(rows) <= SMALL:
            # Once per allocation request: the prepared fast path.
            await self._db.execute_small(self._add_one, _one_or_many(rows))
        else:
            await self._db.run(lambda conn: conn.execute(_ADD_ALLOCATION, rows))

    async def remove_allocations(self, session_id: int, addresses: Iterable[str]) -> None:
        """Remove addresses the routing table found allocated to ``session_id``."""
        rows = [{"address": a} for a in addresses]
        if not rows:
            return
        if len(rows) <= SMALL:
            # Once per delete request: the prepared fast path.
            await self._db.execute_small(self._remove_one, _one_or_many(rows))
        else:
            params = {"addresses": [row["address"] for row in rows]}
            await self._db.run(lambda conn: conn.execute(_REMOVE_ALLOCATIONS, params))

    async def allocations(self) -> list[AllocationRow]:
        def op(conn: Connection) -> list[AllocationRow]:
            rows = conn.execute(select(_A.address, _A.session_id, _A.allocation_key))
            return [AllocationRow(*row) for row in rows]

        return await self._db.run(op)

    # -- subscriptions ----------------------------------------------------------------------

    async def subscribe(self, session_id: int, addresses: Iterable[str]) -> None:
        now = utcnow()
        rows = [
            {"address": a, "session_id": session_id, "created_at": now}
            for a in dict.fromkeys(addresses)
        ]
        if rows:
            run = self._db.run_small if len(rows) <= SMALL else self._db.run
            await run(lambda conn: conn.execute(self._subscribe, _one_or_many(rows)))

    async def unsubscribe(self, session_id: int, addresses: Iterable[str]) -> None:
        params = {"sid": session_id, "addresses": list(addresses)}
        if params["addresses"]:
            await self._db.run_small(lambda conn: conn.execute(_UNSUBSCRIBE, params))

    async def subscriptions(self) -> list[tuple[str, int]]:
        def op(conn: Connection) -> list[tuple[str, int]]:
            rows = conn.execute(select(_Sub.address, _Sub.session_id))
            return [(str(a), int(s)) for a, s in rows]

        return await self._db.run(op)

    # -- learned routes ---------------------------------------------------------------------

    async def learn(self, session_id: int, address: str) -> None:
        row = {"address": address, "session_id": session_id, "updated_at": utcnow()}
        await self._db.run_small(lambda conn: conn.execute(self._learn, row))

    async def learned(self) -> list[tuple[str, int]]:
        def op(conn: Connection) -> list[tuple[str, int]]:
            return [(str(a), int(s)) for a, s in conn.execute(select(_L.address, _L.session_id))]

        return await self._db.run(op)

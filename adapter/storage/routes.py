"""Persistence of the routing state: allocations, subscriptions and learned routes.

The in-memory RoutingTable is the source for routing decisions; these stores make it survive a
restart of the node and are written before an MN service answers, so an answer the runtime got
is never lost. Statements are built once: an allocation's durable write is on the hot path of
every allocation request, a subscription's on a crowd's arrival. Each write of a few rows is one
prepared statement (``Database.execute_small``), with a multi-row form for PostgreSQL, where a
statement is a round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Select,
    bindparam,
    delete,
    insert,
    inspect,
    literal,
    select,
)

from .clock import utcnow
from .database import Database, Prepared, upsert
from .models import Allocation, LearnedRoute, ReleasedAddress, Subscription

_A, _Sub, _L, _R = Allocation, Subscription, LearnedRoute, ReleasedAddress

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


def _columns(entity: Any, *keys: str) -> list[Column[Any]]:
    mapped = inspect(entity).columns
    return [mapped[k] for k in keys]


def _values(columns: list[Column[Any]], rows: int | None = None) -> Any:
    """Bound values for an INSERT of ``columns``: one row, or ``rows`` rows named <key>_<i>."""
    if rows is None:
        return {c.key: bindparam(c.key) for c in columns}
    return [{c.key: bindparam(f"{c.key}_{i}") for c in columns} for i in range(rows)]


def _addresses(rows: int) -> list[Any]:
    return [bindparam(f"address_{i}") for i in range(rows)]


class RouteStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        d = db.dialect
        add = _columns(_A, "address", "scheme", "session_id", "allocation_key", "created_at")
        self._add = Prepared(
            db,
            insert(_A).values(_values(add)),
            add,
            block=lambda n: insert(_A).values(_values(add, n)),
            groupable=True,
        )
        sub = _columns(_Sub, "address", "session_id", "created_at")
        self._subscribe_many = upsert(d, _Sub, ["address", "session_id"])
        self._subscribe = Prepared(
            db,
            upsert(d, _Sub, ["address", "session_id"]).values(_values(sub)),
            sub,
            block=lambda n: upsert(d, _Sub, ["address", "session_id"]).values(_values(sub, n)),
            groupable=True,
        )
        self._unsubscribe = Prepared(
            db,
            delete(_Sub).where(
                _Sub.session_id == bindparam("session_id"), _Sub.address == bindparam("address")
            ),
            _columns(_Sub, "address", "session_id"),
            # Every row names the same session: the first row's stands for all (so writes of
            # other sessions cannot share it: not groupable).
            block=lambda n: delete(_Sub).where(
                _Sub.session_id == bindparam("session_id_0"), _Sub.address.in_(_addresses(n))
            ),
        )
        learn = _columns(_L, "address", "session_id", "updated_at")
        self._learn = Prepared(
            db,
            upsert(d, _L, ["address"], update=["session_id", "updated_at"]).values(_values(learn)),
            learn,
        )

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
            await self._db.execute_small(self._add, _one_or_many(rows))
        else:
            await self._db.run(lambda conn: conn.execute(_ADD_ALLOCATION, rows))

    async def remove_allocations(self, session_id: int, addresses: Iterable[str]) -> None:
        """Remove addresses the routing table found allocated to ``session_id``; they are kept
        as released (``released``)."""
        gone = list(addresses)
        if not gone:
            return
        now = utcnow()

        def op(conn: Connection) -> None:
            keep_released(conn, select(_A.address, literal(now)).where(_A.address.in_(gone)))
            conn.execute(_REMOVE_ALLOCATIONS, {"addresses": gone})

        await self._db.run(op)

    async def released(self, address: str, since: datetime) -> bool:
        """Whether ``address`` was allocated here and let go after ``since``."""
        query = select(_R.address).where(_R.address == address, _R.released_at > since)
        return await self._db.run(lambda conn: conn.execute(query).first() is not None)

    async def forget_released(self, before: datetime) -> int:
        """Forget the addresses let go before ``before``: nothing may name them any more."""
        statement = delete(_R).where(_R.released_at <= before)
        return await self._db.run(lambda conn: conn.execute(statement).rowcount)

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
        if not rows:
            return
        if len(rows) <= SMALL:
            await self._db.execute_small(self._subscribe, _one_or_many(rows))
        else:
            await self._db.run(lambda conn: conn.execute(self._subscribe_many, rows))

    async def unsubscribe(self, session_id: int, addresses: Iterable[str]) -> None:
        unique = list(dict.fromkeys(addresses))
        if not unique:
            return
        if len(unique) <= SMALL:
            rows = [{"session_id": session_id, "address": a} for a in unique]
            await self._db.execute_small(self._unsubscribe, _one_or_many(rows))
        else:
            params = {"sid": session_id, "addresses": unique}
            await self._db.run(lambda conn: conn.execute(_UNSUBSCRIBE, params))

    async def subscriptions(self) -> list[tuple[str, int]]:
        def op(conn: Connection) -> list[tuple[str, int]]:
            rows = conn.execute(select(_Sub.address, _Sub.session_id))
            return [(str(a), int(s)) for a, s in rows]

        return await self._db.run(op)

    # -- learned routes ---------------------------------------------------------------------

    async def learn(self, session_id: int, address: str) -> None:
        row = {"address": address, "session_id": session_id, "updated_at": utcnow()}
        await self._db.execute_small(self._learn, row)

    async def learned(self) -> list[tuple[str, int]]:
        def op(conn: Connection) -> list[tuple[str, int]]:
            return [(str(a), int(s)) for a, s in conn.execute(select(_L.address, _L.session_id))]

        return await self._db.run(op)


def keep_released(conn: Connection, rows: Select[str, datetime]) -> None:
    """Record the (address, released_at) ``rows`` select as released addresses (one released
    earlier and taken up again once its time was over is released anew)."""
    conn.execute(delete(_R).where(_R.address.in_(rows.with_only_columns(rows.selected_columns[0]))))
    conn.execute(insert(_R).from_select(["address", "released_at"], rows))

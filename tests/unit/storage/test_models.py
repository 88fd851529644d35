"""The models' constraints: what the database refuses and what it cascades."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import Connection, delete, func, insert, select

from adapter.storage.clock import utcnow
from adapter.storage.database import ConstraintViolation, Database
from adapter.storage.models import (
    Allocation,
    Base,
    PendingDelivery,
    RuntimeSession,
    SessionState,
    Subscription,
)


@pytest_asyncio.fixture(loop_scope="session")
async def db() -> AsyncIterator[Database]:
    database = Database("sqlite:///:memory:")
    await database.run(lambda conn: Base.metadata.create_all(conn))
    yield database
    await database.dispose()


def add_runtime(conn: Connection, n: int) -> int:
    now = utcnow()
    return int(
        conn.execute(
            insert(RuntimeSession)
            .values(
                runtime_url=f"runtime://mn.test/{n}",
                user_id=f"@_rethink_{n}:hs",
                key=f"key{n}",
                state=SessionState.CONNECTED,
                created_at=now,
                last_seen=now,
            )
            .returning(RuntimeSession.id)
        ).scalar_one()
    )


def allocate(conn: Connection, session_id: int, address: str) -> None:
    conn.execute(
        insert(Allocation).values(
            address=address,
            scheme="hyperty",
            session_id=session_id,
            allocation_key=None,
            created_at=utcnow(),
        )
    )


async def test_session_state_round_trips(db: Database) -> None:
    session_id = await db.run(lambda conn: add_runtime(conn, 1))
    state = await db.run(
        lambda conn: conn.execute(
            select(RuntimeSession.state).where(RuntimeSession.id == session_id)
        ).scalar_one()
    )
    assert state is SessionState.CONNECTED


async def test_an_address_is_allocated_once(db: Database) -> None:
    session_id = await db.run(lambda conn: add_runtime(conn, 2))
    await db.run(lambda conn: allocate(conn, session_id, "hyperty://mn.test/a"))
    with pytest.raises(ConstraintViolation):
        await db.run(lambda conn: allocate(conn, session_id, "hyperty://mn.test/a"))


async def test_one_failing_operation_does_not_undo_others_committed_with_it(db: Database) -> None:
    """Group commit: operations queued together share a transaction but not their failures."""
    import asyncio

    session_id = await db.run(lambda conn: add_runtime(conn, 5))
    results = await asyncio.gather(
        db.run(lambda conn: allocate(conn, session_id, "hyperty://mn.test/g1")),
        db.run(lambda conn: allocate(conn, session_id, "hyperty://mn.test/g1")),  # duplicate
        db.run(lambda conn: allocate(conn, session_id, "hyperty://mn.test/g2")),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], ConstraintViolation)
    stored = await db.run(
        lambda conn: set(
            conn.execute(
                select(Allocation.address).where(Allocation.session_id == session_id)
            ).scalars()
        )
    )
    assert stored == {"hyperty://mn.test/g1", "hyperty://mn.test/g2"}


async def test_removing_a_session_removes_what_it_owned(db: Database) -> None:
    def scenario(conn: Connection) -> tuple[list[int], int, int, int]:
        rt, other = add_runtime(conn, 3), add_runtime(conn, 4)
        now = utcnow()
        allocate(conn, rt, "hyperty://mn.test/b")
        conn.execute(
            insert(Subscription),
            [
                {"address": "comm://mn.test/o/changes", "session_id": rt, "created_at": now},
                {"address": "comm://mn.test/o/changes", "session_id": other, "created_at": now},
            ],
        )
        conn.execute(
            insert(PendingDelivery).values(
                session_id=rt, dseq=1, payload="{}", oseq=0, event_id=None, created_at=now
            )
        )
        conn.execute(delete(RuntimeSession).where(RuntimeSession.id == rt))
        subs = list(conn.execute(select(Subscription.session_id)).scalars())
        allocs = conn.execute(
            select(func.count()).select_from(Allocation).where(Allocation.session_id == rt)
        ).scalar_one()
        pending = conn.execute(select(func.count()).select_from(PendingDelivery)).scalar_one()
        return subs, other, int(allocs), int(pending)

    subs, other, allocs, pending = await db.run(scenario)
    assert subs == [other]  # the other runtime's subscription stays
    assert (allocs, pending) == (0, 0)

"""RouteStore's allocation writes on SQLite and PostgreSQL: one address, a block, and more than
the prepared fast path takes, each stored exactly and removable by address."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import insert, text

from adapter.storage.clock import utcnow
from adapter.storage.database import Database
from adapter.storage.models import RuntimeSession
from adapter.storage.routes import SMALL, RouteStore

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.dispose()


async def test_allocation_blocks_round_trip(db: Database) -> None:
    now = utcnow()
    add_session = (
        insert(RuntimeSession)
        .values(
            runtime_url="runtime://example.com/1",
            user_id="@_rethink_1:example.com",
            state="live",
            created_at=now,
            last_seen=now,
        )
        .returning(RuntimeSession.id)
    )
    session_id = await db.run(lambda c: c.execute(add_session).scalar_one())
    store = RouteStore(db)
    one = ["hyperty://example.com/one"]
    block = [f"hyperty://example.com/block-{i}" for i in range(3)]
    large = [f"comm://example.com/large-{i}" for i in range(SMALL + 5)]
    await store.add_allocations(session_id, one, "hyperty", None)
    await store.add_allocations(session_id, block, "hyperty", "key-1")
    await store.add_allocations(session_id, large, "comm", None)

    stored = {(r.address, r.session_id, r.allocation_key) for r in await store.allocations()}
    assert stored == {
        *((a, session_id, None) for a in one + large),
        *((a, session_id, "key-1") for a in block),
    }
    schemes = await db.run(
        lambda c: dict(c.execute(text("SELECT address, scheme FROM allocations")).all())
    )
    assert {schemes[a] for a in large} == {"comm"} and schemes[one[0]] == "hyperty"

    await store.remove_allocations(session_id, one)
    await store.remove_allocations(session_id, block[:2])
    await store.remove_allocations(session_id, large)
    assert {r.address for r in await store.allocations()} == {block[2]}

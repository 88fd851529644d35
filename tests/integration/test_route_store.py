"""RouteStore's writes on SQLite and PostgreSQL: allocations, subscriptions and learned routes of
one address, a block, and more than the prepared fast path takes, each stored exactly and
removable."""

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


async def add_session(db: Database, n: int = 1) -> int:
    now = utcnow()
    statement = (
        insert(RuntimeSession)
        .values(
            runtime_url=f"runtime://example.com/{n}",
            user_id=f"@_rethink_{n}:example.com",
            key=f"k{n}",
            state="live",
            created_at=now,
            last_seen=now,
        )
        .returning(RuntimeSession.id)
    )
    return int(await db.run(lambda c: c.execute(statement).scalar_one()))


async def test_allocation_blocks_round_trip(db: Database) -> None:
    session_id = await add_session(db)
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


async def test_subscriptions_round_trip(db: Database) -> None:
    one, other = await add_session(db, 1), await add_session(db, 2)
    store = RouteStore(db)
    obj = "comm://example.com/obj"
    block = [f"{obj}/changes", f"{obj}/children/chat", f"{obj}/children/files"]
    large = [f"{obj}/children/{i}" for i in range(SMALL + 5)]
    await store.subscribe(one, [obj])
    await store.subscribe(one, block)
    await store.subscribe(one, [*block[:2], block[0]])  # again, and twice in one request
    await store.subscribe(one, large)
    await store.subscribe(other, [f"{obj}/changes"])
    assert set(await store.subscriptions()) == {
        *((a, one) for a in [obj, *block, *large]),
        (f"{obj}/changes", other),
    }

    await store.unsubscribe(one, [obj])
    await store.unsubscribe(one, block[:2])
    await store.unsubscribe(one, large)
    await store.unsubscribe(one, ["comm://example.com/never-subscribed"])
    # Only the requester's subscriptions go: the other session keeps the same address.
    assert set(await store.subscriptions()) == {(block[2], one), (f"{obj}/changes", other)}


async def test_learned_routes_move_to_the_latest_session(db: Database) -> None:
    one, other = await add_session(db, 1), await add_session(db, 2)
    store = RouteStore(db)
    await store.learn(one, "hyperty://elsewhere.org/a")
    await store.learn(one, "hyperty://elsewhere.org/b")
    await store.learn(other, "hyperty://elsewhere.org/a")
    assert set(await store.learned()) == {
        ("hyperty://elsewhere.org/a", other),
        ("hyperty://elsewhere.org/b", one),
    }

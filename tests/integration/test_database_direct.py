"""The small writes of a request's hot path (Database.execute_small) on real databases: committed
when they return, atomic, and on PostgreSQL sent over the event loop's own connections, which
survive cancelled and failed writes and commit without waiting for the disk unless asked to."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from sqlalchemy import Connection, bindparam, func, insert, select, text

from adapter.storage import migrate
from adapter.storage.clock import utcnow
from adapter.storage.database import (
    DIRECT_CONNECTIONS,
    ConstraintViolation,
    Database,
    Prepared,
    create_engine,
)
from adapter.storage.models import Allocation, RuntimeSession
from adapter.storage.routes import RouteStore
from tests.conftest import Databases

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def pg_url(databases: Databases) -> str:
    url = await databases.postgres()
    await migrate.upgrade(url)
    return url


async def add_sessions(db: Database, count: int) -> list[int]:
    now = utcnow()
    rows = [
        {
            "runtime_url": f"runtime://example.com/{uuid.uuid4()}",
            "user_id": f"@_rethink_{uuid.uuid4().hex}:example.com",
            "key": uuid.uuid4().hex[:16],
            "state": "connected",
            "created_at": now,
            "last_seen": now,
        }
        for _ in range(count)
    ]

    def op(conn: Connection) -> list[int]:
        return [
            int(
                conn.execute(
                    insert(RuntimeSession).values(row).returning(RuntimeSession.id)
                ).scalar_one()
            )
            for row in rows
        ]

    return await db.run(op)


def addresses(count: int) -> list[str]:
    return [f"hyperty://example.com/{uuid.uuid4()}" for _ in range(count)]


def stored_elsewhere(url: str, query: str) -> list[tuple[object, ...]]:
    """Rows as another client of the database sees them (a connection of its own)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query))]
    finally:
        engine.dispose()


async def test_small_writes_are_committed_when_they_return(database_url: str) -> None:
    db = Database(database_url)
    try:
        [session] = await add_sessions(db, 1)
        store = RouteStore(db)
        one, block = addresses(1), addresses(3)
        await store.add_allocations(session, one, "hyperty", None)
        await store.add_allocations(session, block, "hyperty", "key")
        await store.subscribe(session, [f"{one[0]}/changes"])
        # No await of anything else in between: what returned is visible to everyone.
        seen = await asyncio.to_thread(
            stored_elsewhere, database_url, "SELECT address FROM allocations"
        )
        assert {row[0] for row in seen} == set(one + block)
        subscribed = await asyncio.to_thread(
            stored_elsewhere, database_url, "SELECT address, session_id FROM subscriptions"
        )
        assert subscribed == [(f"{one[0]}/changes", session)]
    finally:
        await db.dispose()


async def test_a_block_is_stored_whole_or_not_at_all(database_url: str) -> None:
    db = Database(database_url)
    try:
        [session] = await add_sessions(db, 1)
        store = RouteStore(db)
        taken = addresses(1)
        await store.add_allocations(session, taken, "hyperty", None)
        block = [*addresses(2), taken[0]]
        with pytest.raises(ConstraintViolation):
            await store.add_allocations(session, block, "hyperty", "k")
        # None of the block's rows stayed, and the failed write left the path usable.
        later = addresses(3)
        await store.add_allocations(session, later, "hyperty", "k")
        assert {r.address for r in await store.allocations()} == set(taken + later)
    finally:
        await db.dispose()


async def test_a_crowd_subscribing_at_once_is_stored_whole(database_url: str) -> None:
    db = Database(database_url)
    try:
        sessions = await add_sessions(db, 200)
        store = RouteStore(db)
        wanted = {(f"comm://example.com/{s}/{i}", s) for s in sessions for i in range(5)}
        await asyncio.gather(*(store.subscribe(s, [a]) for a, s in wanted))
        assert set(await store.subscriptions()) == wanted
    finally:
        await db.dispose()


# -- PostgreSQL's own connections ---------------------------------------------------------------


async def test_small_writes_do_not_wait_for_the_worker_threads(pg_url: str) -> None:
    db = Database(pg_url, workers=1)
    release = threading.Event()
    try:
        [session] = await add_sessions(db, 1)
        store = RouteStore(db)
        # The only worker thread is busy with a long job...
        busy = asyncio.create_task(db.run(lambda conn: release.wait(30)))
        await asyncio.sleep(0.05)
        # ...and the hot-path writes still go through, on the event loop's connections.
        await asyncio.wait_for(store.add_allocations(session, addresses(1), "hyperty", None), 5)
        await asyncio.wait_for(store.add_allocations(session, addresses(3), "hyperty", None), 5)
        await asyncio.wait_for(store.subscribe(session, ["comm://example.com/o/changes"]), 5)
        assert not busy.done()
    finally:
        release.set()
        await db.dispose()


async def record_setting(db: Database, name: str) -> tuple[str, str]:
    """The setting as seen by a worker connection and by an event-loop connection."""
    await db.run(lambda c: c.execute(text("CREATE TABLE IF NOT EXISTS probe (v TEXT)")))
    await db.run(lambda c: c.execute(text("DELETE FROM probe")))
    record = Prepared(
        db, text("INSERT INTO probe (v) SELECT current_setting(:name)"), [], block=None
    )
    await db.execute_small(record, {"name": name})
    direct = await db.run(lambda c: c.execute(text("SELECT v FROM probe")).scalar_one())
    worker = await db.run(lambda c: c.execute(text(f"SHOW {name}")).scalar_one())
    return str(worker), str(direct)


async def server_default(url: str, name: str) -> str:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (await conn.execute(f"SHOW {name}")).fetchone()
        assert row is not None
        return str(row[0])


async def test_only_the_hot_path_skips_the_disk_flush_unless_asked(pg_url: str) -> None:
    configured = await server_default(pg_url, "synchronous_commit")
    db = Database(pg_url)
    try:
        # (worker connections, event-loop connections): the rule of adapter/storage/database.py;
        # messages kept for detached runtimes wait for the flush as the server is configured.
        assert await record_setting(db, "synchronous_commit") == (configured, "off")
    finally:
        await db.dispose()
    db = Database(pg_url, synchronous_commit=True)
    try:
        assert await record_setting(db, "synchronous_commit") == ("on", "on")
    finally:
        await db.dispose()


async def test_connection_options_in_the_url_are_kept(pg_url: str) -> None:
    url = f"{pg_url}?options=-c%20statement_timeout%3D4321"
    configured = await server_default(pg_url, "synchronous_commit")
    for synchronous_commit, expected in ((False, (configured, "off")), (True, ("on", "on"))):
        db = Database(url, synchronous_commit=synchronous_commit)
        try:
            assert await record_setting(db, "statement_timeout") == ("4321ms", "4321ms")
            assert await record_setting(db, "synchronous_commit") == expected
        finally:
            await db.dispose()


async def test_a_write_cancelled_mid_statement_frees_its_connection(pg_url: str) -> None:
    db = Database(pg_url, workers=1)
    holder = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    try:
        [session] = await add_sessions(db, 1)
        store = RouteStore(db)
        await store.add_allocations(session, addresses(1), "hyperty", None)  # a connection idles
        # A statement that runs until this test lets it: it waits for a lock the test holds.
        await holder.execute("SELECT pg_advisory_lock(4242)")
        wait = Prepared(db, text("SELECT pg_advisory_lock(:k)").bindparams(bindparam("k")), [])
        # The caller of a slow write gives up waiting, mid-statement...
        stuck = asyncio.create_task(db.execute_small(wait, {"k": 4242}))
        await waiting_for_lock(holder)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        # ...and writes go on (that connection is dropped: its state is unknown), without
        # waiting for that statement to end.
        writes = [
            store.add_allocations(session, addresses(1), "hyperty", None)
            for _ in range(2 * DIRECT_CONNECTIONS)
        ]
        # Done while the test still holds the lock, so none waited for the stuck statement (it
        # could not end before the lock is let go: waiting would hang to the test's timeout).
        await asyncio.gather(*writes)
        assert len(await store.allocations()) == 1 + 2 * DIRECT_CONNECTIONS
    finally:
        await holder.close()  # the stuck statement gets its lock, and its connection is gone
        await db.dispose()


async def waiting_for_lock(holder: psycopg.AsyncConnection[Any]) -> None:
    """Returns once a statement waits for the test's advisory lock."""
    while True:
        cursor = await holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
        row = await cursor.fetchone()
        if row and row[0]:
            return
        await asyncio.sleep(0.05)


async def test_a_write_cancelled_while_queued_never_runs(pg_url: str) -> None:
    db = Database(pg_url)
    try:
        [session] = await add_sessions(db, 1)
        store = RouteStore(db)
        sleep = Prepared(db, text("SELECT pg_sleep(:s)").bindparams(bindparam("s")), [])
        busy = [
            asyncio.create_task(db.execute_small(sleep, {"s": 0.5}))
            for _ in range(DIRECT_CONNECTIONS)
        ]
        await asyncio.sleep(0.2)  # every connection is sleeping
        given_up = addresses(1)
        queued = asyncio.create_task(store.add_allocations(session, given_up, "hyperty", None))
        kept = addresses(1)
        after = asyncio.create_task(store.add_allocations(session, kept, "hyperty", None))
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        await asyncio.gather(*busy, after)
        assert {r.address for r in await store.allocations()} == set(kept)
    finally:
        await db.dispose()


async def test_a_burst_shares_statements_and_each_write_gets_its_own_answer(
    pg_url: str,
) -> None:
    db = Database(pg_url)
    try:
        sessions = await add_sessions(db, 300)
        store = RouteStore(db)
        taken = addresses(5)
        await store.add_allocations(sessions[0], taken, "hyperty", None)
        # 300 allocations at once, five of them naming an address already taken: those five
        # are refused, every other one is stored, whatever statement it shared.
        wanted = {s: addresses(1) for s in sessions}
        for s, clash in zip(sessions[1:6], taken, strict=True):
            wanted[s] = [clash]
        results = await asyncio.gather(
            *(store.add_allocations(s, a, "hyperty", None) for s, a in wanted.items()),
            return_exceptions=True,
        )
        refused = [s for s, r in zip(wanted, results, strict=True) if r is not None]
        assert refused == sessions[1:6]
        assert all(isinstance(r, ConstraintViolation) for r in results if r is not None)
        stored = {(r.address, r.session_id) for r in await store.allocations()}
        expected = {(a, sessions[0]) for a in taken} | {
            (a[0], s) for s, a in wanted.items() if s not in refused
        }
        assert stored == expected
    finally:
        await db.dispose()


async def table_reads(
    pg_url: str, deleted_since: dict[str, int] | None = None, deleted: int = 0
) -> dict[str, int]:
    """The allocations table's statistics: rows read by sequential scans and rows deleted.
    With ``deleted_since``: once ``deleted`` more rows show as deleted since those (a backend's
    statistics reach the server whole, some time after its transactions: then its scans have
    too)."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        while True:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            cursor = await conn.execute(
                "SELECT seq_tup_read, n_tup_del FROM pg_stat_user_tables WHERE relname = %s",
                [Allocation.__tablename__],
            )
            row = await cursor.fetchone()
            assert row is not None
            stats = {"seq_tup_read": int(row[0]), "n_tup_del": int(row[1])}
            if deleted_since is None or stats["n_tup_del"] - deleted_since["n_tup_del"] >= deleted:
                return stats
            await asyncio.sleep(0.5)


async def test_block_deletes_keep_using_the_index_as_the_table_grows(pg_url: str) -> None:
    """A statement kept prepared may get a generic plan; one made while the table was nearly
    empty scans it, and stays as the table grows (10,000 block deletes took minutes)."""
    db = Database(pg_url)
    try:
        [session] = await add_sessions(db, 1)
        store = RouteStore(db)
        # While the table is empty: every form of delete, more times than the server needs
        # before it considers a generic plan.
        for _ in range(12):
            one, block = addresses(1), addresses(3)
            await store.add_allocations(session, one + block, "hyperty", None)
            await store.remove_allocations(session, one)
            await store.remove_allocations(session, block)
        now = utcnow()
        filler = [
            {"address": f"filler-{i}", "scheme": "x", "session_id": session, "created_at": now}
            for i in range(50_000)
        ]
        await db.run(lambda c: c.execute(insert(Allocation), filler))

        # 100 deletes of 3-address blocks: by index each reads a few rows; by a scan, all
        # 50,000. What the server read is in its statistics, once the deletes' are in.
        batches = [addresses(3) for _ in range(100)]
        for batch in batches:
            await store.add_allocations(session, batch, "hyperty", None)
        before = await table_reads(pg_url)
        for batch in batches:
            await store.remove_allocations(session, batch)
        after = await table_reads(pg_url, deleted_since=before, deleted=300)
        scanned = after["seq_tup_read"] - before["seq_tup_read"]
        assert scanned < 50_000, f"the block deletes scanned {scanned:,} rows"
        count = await db.run(
            lambda c: c.execute(select(func.count()).select_from(Allocation)).scalar_one()
        )
        assert count == 50_000
    finally:
        await db.dispose()


# -- the worker threads' group commit --------------------------------------------------------------


async def test_a_failing_operation_in_a_group_undoes_only_itself(database_url: str) -> None:
    db = Database(database_url, workers=1)
    release = threading.Event()
    try:
        [session] = await add_sessions(db, 1)
        taken = addresses(1)
        await RouteStore(db).add_allocations(session, taken, "hyperty", None)
        # The one worker is held while the operations queue, so they run as one group.
        holder = asyncio.create_task(db.run(lambda conn: release.wait(10)))
        await asyncio.sleep(0.05)
        now = utcnow()

        def add(address: str) -> Callable[[Connection], int]:
            row = {"address": address, "scheme": "x", "session_id": session, "created_at": now}
            return lambda conn: int(conn.execute(insert(Allocation).values(row)).rowcount)

        def broken(conn: Connection) -> int:
            raise ValueError("a bug in one operation")

        fresh = addresses(4)
        ops = [add(fresh[0]), add(taken[0]), add(fresh[1]), broken, add(fresh[2]), add(fresh[3])]
        results = [asyncio.create_task(db.run(op)) for op in ops]
        await asyncio.sleep(0.05)
        release.set()
        await holder
        outcomes = await asyncio.gather(*results, return_exceptions=True)
        assert [type(o).__name__ for o in outcomes] == [
            "int",
            "ConstraintViolation",
            "int",
            "ValueError",
            "int",
            "int",
        ]
        stored = {r.address for r in await RouteStore(db).allocations()}
        assert stored == set(taken + fresh)
    finally:
        release.set()
        await db.dispose()

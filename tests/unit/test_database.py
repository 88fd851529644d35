"""The Database: worker threads with group commit, and run_small's inline path on SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import Column, Connection, Integer, MetaData, Table, bindparam, text
from sqlalchemy.exc import IntegrityError, OperationalError

from adapter.storage.database import Database, Prepared


@pytest_asyncio.fixture(loop_scope="session")
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    await database.run(lambda c: c.exec_driver_sql("CREATE TABLE t (x INTEGER PRIMARY KEY)"))
    yield database
    await database.dispose()


def insert(x: int) -> Callable[[Connection], object]:
    return lambda conn: conn.execute(text("INSERT INTO t VALUES (:x)"), {"x": x})


def thread_name(conn: Connection) -> str:
    conn.execute(text("INSERT INTO t VALUES (100)"))
    return threading.current_thread().name


async def test_run_small_runs_inline_when_the_lock_is_free(db: Database) -> None:
    assert await db.run_small(thread_name) == "MainThread"


@pytest.mark.parametrize("path", ["run_small", "execute_small"])
async def test_small_writes_go_to_the_worker_while_another_writer_holds_the_lock(
    db: Database, path: str
) -> None:
    release = threading.Event()
    locked = threading.Event()

    def hold_lock(conn: Connection) -> None:
        conn.execute(text("INSERT INTO t VALUES (1)"))
        locked.set()
        release.wait(10)

    # A writer on the worker thread holds the lock for a while...
    holder = asyncio.create_task(db.run(hold_lock))
    await asyncio.to_thread(locked.wait, 10)
    # ...so a small write must not wait for it on the event loop: it queues behind it instead.
    small = asyncio.create_task(
        db.run_small(thread_name)
        if path == "run_small"
        else db.execute_small(prepared_insert(db), {"x": 100})
    )
    await asyncio.sleep(0.05)
    assert not small.done()
    release.set()
    await holder
    ran_on = await small
    if path == "run_small":
        assert ran_on.startswith("db-")
    rows = await db.run(lambda c: [r[0] for r in c.execute(text("SELECT x FROM t ORDER BY x"))])
    assert rows == [1, 100]


async def test_run_small_raises_real_errors(db: Database) -> None:
    await db.run_small(insert(7))
    with pytest.raises(IntegrityError):
        await db.run_small(insert(7))
    # The failed transaction left the inline connection usable.
    await db.run_small(insert(8))


async def test_an_unreachable_database_fails_the_call_and_keeps_the_workers(
    tmp_path: Path,
) -> None:
    # Port 1 on loopback refuses at once: the database server is down.
    database = Database("postgresql+psycopg://nobody@127.0.0.1:1/none", workers=1)
    try:
        for _ in range(2):  # the second call proves the worker thread survived the first
            with pytest.raises(OperationalError):
                await asyncio.wait_for(database.run(lambda c: c.execute(text("SELECT 1"))), 10)
    finally:
        await database.dispose()


def prepared_insert(db: Database) -> Prepared:
    table = Table("t", MetaData(), Column("x", Integer, primary_key=True))
    return Prepared(db, table.insert().values(x=bindparam("x")), [table.c.x])


async def test_execute_small_commits_inline_and_rolls_back_on_error(db: Database) -> None:
    insert_x = prepared_insert(db)
    await db.execute_small(insert_x, {"x": 1})
    with pytest.raises(sqlite3.IntegrityError):
        await db.execute_small(insert_x, {"x": 1})
    # The failed statement's transaction was rolled back: the connection takes the next one.
    await db.execute_small(insert_x, {"x": 2})
    # Several rows: all or none.
    with pytest.raises(sqlite3.IntegrityError):
        await db.execute_small(insert_x, [{"x": 3}, {"x": 2}])
    await db.execute_small(insert_x, [{"x": 3}, {"x": 4}])
    rows = await db.run(lambda c: [r[0] for r in c.execute(text("SELECT x FROM t ORDER BY x"))])
    assert rows == [1, 2, 3, 4]

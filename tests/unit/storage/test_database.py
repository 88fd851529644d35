"""The Database: worker threads with group commit, run_small's inline path on SQLite, and the
statements the PostgreSQL fast path sends."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import Column, Connection, Enum, Integer, MetaData, Table, bindparam, text
from sqlalchemy.exc import IntegrityError

from adapter.storage.database import (
    ConstraintViolation,
    Database,
    DatabaseUnavailable,
    Prepared,
    unavailable,
)
from adapter.storage.models import SessionState
from adapter.storage.prepared import MAX_BLOCK


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
    with pytest.raises(ConstraintViolation) as caught:
        await db.run_small(insert(7))
    assert isinstance(caught.value.__cause__, IntegrityError)
    # The failed transaction left the inline connection usable.
    await db.run_small(insert(8))


def _select_one(database: Database, path: str) -> Awaitable[object]:
    if path == "run":
        return database.run(lambda c: c.execute(text("SELECT 1")))
    if path == "run_small":
        return database.run_small(lambda c: c.execute(text("SELECT 1")))
    table = Table("t", MetaData(), Column("x", Integer, primary_key=True))
    statement = Prepared(database, table.insert().values(x=bindparam("x")), [table.c.x])
    return database.execute_small(statement, {"x": 1})


@pytest.mark.parametrize("path", ["run", "run_small", "execute_small"])
async def test_a_database_that_is_away_is_one_error_on_every_path(path: str) -> None:
    """What the ingress gives back to the stub for a while (503 after) and what inbound
    transactions wait out, never counted against the event they carry. Port 1 on loopback
    refuses at once: the database server is down."""
    database = Database("postgresql+psycopg://nobody@127.0.0.1:1/none", workers=1)
    try:
        for _ in range(2):  # the second call proves the path survived the first
            with pytest.raises(DatabaseUnavailable) as caught:
                await asyncio.wait_for(_select_one(database, path), 10)
            assert unavailable(caught.value) and caught.value.__cause__ is not None
    finally:
        await database.dispose()


def test_a_bug_is_not_unavailable() -> None:
    assert not unavailable(ValueError("a bug")) and not unavailable(KeyError("x"))


def prepared_insert(db: Database) -> Prepared:
    table = Table("t", MetaData(), Column("x", Integer, primary_key=True))
    return Prepared(db, table.insert().values(x=bindparam("x")), [table.c.x])


async def test_execute_small_commits_inline_and_rolls_back_on_error(db: Database) -> None:
    insert_x = prepared_insert(db)
    await db.execute_small(insert_x, {"x": 1})
    with pytest.raises(ConstraintViolation):
        await db.execute_small(insert_x, {"x": 1})
    # The failed statement's transaction was rolled back: the connection takes the next one.
    await db.execute_small(insert_x, {"x": 2})
    # Several rows: all or none.
    with pytest.raises(ConstraintViolation):
        await db.execute_small(insert_x, [{"x": 3}, {"x": 2}])
    await db.execute_small(insert_x, [{"x": 3}, {"x": 4}])
    rows = await db.run(lambda c: [r[0] for r in c.execute(text("SELECT x FROM t ORDER BY x"))])
    assert rows == [1, 2, 3, 4]


# -- Prepared: the SQL and arguments the PostgreSQL fast path sends ----------------------------


@pytest_asyncio.fixture(loop_scope="session")
async def pg_dialect_db() -> AsyncIterator[Database]:
    # Compiles for PostgreSQL; never connects (nothing is executed).
    database = Database("postgresql+psycopg://nobody@127.0.0.1:1/none", workers=1)
    yield database
    await database.dispose()


def pair_table() -> Table:
    return Table("p", MetaData(), Column("x", Integer, primary_key=True), Column("y", Integer))


def insert_pairs(db: Database, block: bool = True) -> Prepared:
    t = pair_table()
    return Prepared(
        db,
        t.insert().values(x=bindparam("x"), y=bindparam("y")),
        [t.c.x, t.c.y],
        block=(
            (
                lambda n: t.insert().values(
                    [{"x": bindparam(f"x_{i}"), "y": bindparam(f"y_{i}")} for i in range(n)]
                )
            )
            if block
            else None
        ),
    )


async def test_bound_one_row_is_one_prepared_statement_without_returning(
    pg_dialect_db: Database,
) -> None:
    bound = insert_pairs(pg_dialect_db).bound({"x": 1, "y": 2})
    assert bound.sql.startswith("INSERT INTO p (x, y) VALUES (%(x)s")
    assert "RETURNING" not in bound.sql  # nothing reads the new key: no row comes back
    assert bound.args == {"x": 1, "y": 2}
    assert not bound.many and bound.prepare
    assert insert_pairs(pg_dialect_db).bound([{"x": 1, "y": 2}]) == bound


async def test_bound_rows_become_one_multi_row_statement(pg_dialect_db: Database) -> None:
    bound = insert_pairs(pg_dialect_db).bound(
        [{"x": 1, "y": 2}, {"x": 3, "y": 4}, {"x": 5, "y": 6}]
    )
    assert bound.sql.count("%(x_") == 3 and not bound.many
    assert bound.args == {"x_0": 1, "y_0": 2, "x_1": 3, "y_1": 4, "x_2": 5, "y_2": 6}
    assert bound.prepare  # an INSERT ... VALUES has one plan: safe to keep prepared


async def test_bound_block_with_a_where_is_planned_with_its_values(
    pg_dialect_db: Database,
) -> None:
    t = pair_table()
    remove = Prepared(
        pg_dialect_db,
        t.delete().where(t.c.x == bindparam("x")),
        [t.c.x],
        block=lambda n: t.delete().where(t.c.x.in_([bindparam(f"x_{i}") for i in range(n)])),
    )
    assert remove.bound({"x": 1}).prepare
    block = remove.bound([{"x": 1}, {"x": 2}])
    assert "IN (%(x_0)s, %(x_1)s)" in block.sql
    # A generic plan made while the table was small would scan it for ever after.
    assert not block.prepare


async def test_bound_rows_without_a_block_form_run_as_one_transaction(
    pg_dialect_db: Database,
) -> None:
    rows = [{"x": i, "y": i} for i in range(3)]
    bound = insert_pairs(pg_dialect_db, block=False).bound(rows)
    assert bound.many and bound.args == rows and "%(x)s" in bound.sql
    # Beyond the largest block compiled, too.
    many = [{"x": i, "y": i} for i in range(MAX_BLOCK + 1)]
    assert insert_pairs(pg_dialect_db).bound(many).many


async def test_bound_applies_the_columns_bind_processing(pg_dialect_db: Database) -> None:
    t = Table("e", MetaData(), Column("k", Enum(SessionState, native_enum=False)))
    prepared = Prepared(
        pg_dialect_db,
        t.insert().values(k=bindparam("k")),
        [t.c.k],
        block=lambda n: t.insert().values([{"k": bindparam(f"k_{i}")} for i in range(n)]),
    )
    # Stored as SQLAlchemy stores it (the enum's name), in both forms.
    assert prepared.bound({"k": SessionState.DETACHED}).args == {"k": "DETACHED"}
    two = prepared.bound([{"k": SessionState.CONNECTED}, {"k": SessionState.DETACHED}])
    assert two.args == {"k_0": "CONNECTED", "k_1": "DETACHED"}


# -- SQLite's durability setting -----------------------------------------------------------------


@pytest.mark.parametrize(("synchronous_commit", "expected"), [(False, (2, 1)), (True, (2, 2))])
async def test_sqlite_the_worker_path_waits_for_the_disk_the_hot_path_only_when_asked(
    tmp_path: Path, synchronous_commit: bool, expected: tuple[int, int]
) -> None:
    """The durability rule of adapter/storage/database.py, as PostgreSQL's is checked in
    tests/integration/test_database_direct.py."""
    database = Database(
        f"sqlite:///{tmp_path / 'sync.sqlite'}", synchronous_commit=synchronous_commit
    )

    def level(conn: Connection) -> tuple[int, str]:
        value = conn.exec_driver_sql("PRAGMA synchronous").scalar()
        return int(value or 0), threading.current_thread().name

    try:
        # 1 = NORMAL (durable against a crash of the node), 2 = FULL (of the machine too).
        worker, worker_thread = await database.run(level)
        inline, inline_thread = await database.run_small(level)
        assert (worker_thread, inline_thread) == ("db-0", "MainThread")
        assert (worker, inline) == expected
    finally:
        await database.dispose()

"""DirectPostgres's connection handling and group commit, with stand-in connections whose answers
the test holds back: how many are opened, which writes share a statement, who gets which
answer, and which connections are never reused.
(tests/integration/test_database_direct.py runs the same paths on a real PostgreSQL.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from adapter.storage.direct_pg import DirectPostgres
from adapter.storage.prepared import MAX_BLOCK, Bound, Rows


class Statement:
    """Stands in for a Prepared: the SQL names the rows, so the test sees what was sent."""

    def __init__(self, name: str, groupable: bool | None = None) -> None:
        self.name = name
        # As Prepared: never grouped when rows come back.
        self.groupable = not name.startswith("ret") if groupable is None else groupable

    def bound(self, params: Rows) -> Bound:
        rows = [params] if isinstance(params, dict) else params
        return Bound(f"{self.name}:" + ",".join(str(r["v"]) for r in rows), rows)


class FakeCursor:
    """A connection's cursor: what its last statement returned."""

    def __init__(self, conn: FakeConnection) -> None:
        self._conn = conn
        self.description: list[tuple[str]] | None = None
        self._rows: list[tuple[Any, ...]] = []

    async def execute(self, sql: str, args: Any, prepare: bool) -> None:
        self.description, self._rows = None, []
        rows = await self._conn.execute(sql, args, prepare)
        if rows is not None:
            self.description, self._rows = [("id",)], rows

    async def executemany(self, sql: str, args: list[Any]) -> None:
        for one in args:
            await self._conn.execute(sql, [one], False)

    async def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    async def __aenter__(self) -> FakeCursor:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None


class FakeConnection:
    """Answers a statement when the test releases it; mid-statement it is ACTIVE, as libpq's.
    A statement naming a value in ``refuse`` fails as a constraint violation would."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.info = SimpleNamespace(transaction_status=TransactionStatus.IDLE)
        self.closed = False
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent: list[str] = []
        self.refuse: set[int] = set()
        self.pgconn = SimpleNamespace(finish=self._finish)

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    async def execute(self, sql: str, args: Any, prepare: bool) -> list[tuple[Any, ...]] | None:
        self.info.transaction_status = TransactionStatus.ACTIVE
        await asyncio.sleep(0)  # the round trip: others run meanwhile
        await self.gate.wait()
        self.info.transaction_status = TransactionStatus.IDLE
        self.sent.append(sql)
        if any(row["v"] in self.refuse for row in args):
            raise psycopg.errors.UniqueViolation("duplicate key")
        # A statement named "ret..." returns its rows' values (as INSERT ... RETURNING id).
        return [(row["v"] * 10,) for row in args] if sql.startswith("ret") else None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        yield

    async def close(self) -> None:
        self.closed = True

    def _finish(self) -> None:
        self.closed = True


class Opener:
    def __init__(self) -> None:
        self.opened: list[FakeConnection] = []

    async def __call__(self) -> Any:
        conn = FakeConnection(len(self.opened))
        self.opened.append(conn)
        return conn

    def sent(self) -> list[str]:
        return [sql for conn in self.opened for sql in conn.sent]


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def row(v: int) -> dict[str, Any]:
    return {"v": v}


async def warm(pool: DirectPostgres, opener: Opener) -> FakeConnection:
    """One write, so one connection is open and idle."""
    await pool.execute(Statement("warm"), row(0))
    return opener.opened[-1]


async def test_a_lone_write_runs_at_once_on_an_idle_connection() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=2)
    assert pool.usable()
    conn = await warm(pool, opener)
    await pool.execute(Statement("s"), [row(1), row(2)])
    assert conn.sent == ["warm:0", "s:1,2"] and len(opener.opened) == 1
    await pool.close()
    assert conn.closed


async def test_a_burst_shares_statements_within_the_connection_limit() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=2)
    conn = await warm(pool, opener)
    conn.gate.clear()
    subscribe, other = Statement("sub"), Statement("other")
    first = asyncio.create_task(pool.execute(subscribe, row(1)))  # takes the idle connection
    await settle()
    burst = [asyncio.create_task(pool.execute(subscribe, row(v))) for v in range(2, 2 + 70)]
    burst.append(asyncio.create_task(pool.execute(other, row(99))))
    await settle()
    conn.gate.set()
    await asyncio.gather(first, *burst)
    sent = opener.sent()
    assert len(opener.opened) == 2  # never more than `size`
    # Every write was sent once; the queued ones in shared statements of at most MAX_BLOCK rows.
    values = sorted(int(v) for sql in sent[1:] for v in sql.split(":")[1].split(","))
    assert values == [1, *range(2, 72), 99]
    shared = [sql for sql in sent if sql.startswith("sub:") and "," in sql]
    assert shared and all(len(sql.split(",")) <= MAX_BLOCK for sql in shared)
    assert len(sent) <= 1 + 1 + 1 + 70 // MAX_BLOCK + 2
    assert "other:99" in sent  # another statement never joins them


async def test_writes_of_a_statement_that_is_not_groupable_run_one_by_one() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    conn = await warm(pool, opener)
    conn.gate.clear()
    alone = Statement("alone", groupable=False)
    tasks = [asyncio.create_task(pool.execute(alone, row(v))) for v in range(1, 5)]
    await settle()
    conn.gate.set()
    await asyncio.gather(*tasks)
    assert conn.sent == ["warm:0", "alone:1", "alone:2", "alone:3", "alone:4"]


async def test_a_refused_row_fails_only_its_own_write() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    conn = await warm(pool, opener)
    conn.refuse = {3}
    conn.gate.clear()
    insert = Statement("ins")
    busy = asyncio.create_task(pool.execute(insert, row(1)))
    await settle()
    queued = [asyncio.create_task(pool.execute(insert, row(v))) for v in (2, 3, 4)]
    await settle()
    conn.gate.set()
    await busy
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert results[0] == [] and results[2] == []
    assert isinstance(results[1], psycopg.errors.UniqueViolation)
    # The shared statement was refused as a whole, then each write was sent on its own.
    assert conn.sent[2:] == ["ins:2,3,4", "ins:2", "ins:3", "ins:4"]
    # A refused statement leaves the connection idle: it stays in use.
    assert len(opener.opened) == 1 and not conn.closed


async def test_a_write_cancelled_mid_statement_drops_its_connection() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    stuck = await warm(pool, opener)
    stuck.gate.clear()
    cancelled = asyncio.create_task(pool.execute(Statement("slow"), row(1)))
    await settle()
    waiting = asyncio.create_task(pool.execute(Statement("next"), row(2)))
    await settle()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await asyncio.wait_for(waiting, 5)
    # Mid-round-trip the connection's state is unknown: closed, and the queued write ran on a
    # new one in its slot.
    assert stuck.closed
    assert len(opener.opened) == 2 and opener.opened[1].sent == ["next:2"]


async def test_a_write_cancelled_while_queued_is_never_sent() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    conn = await warm(pool, opener)
    conn.gate.clear()
    busy = asyncio.create_task(pool.execute(Statement("busy"), row(1)))
    await settle()
    given_up = asyncio.create_task(pool.execute(Statement("ins"), row(2)))
    kept = asyncio.create_task(pool.execute(Statement("ins"), row(3)))
    await settle()
    given_up.cancel()
    conn.gate.set()
    await asyncio.gather(busy, kept)
    assert given_up.cancelled()
    assert conn.sent == ["warm:0", "busy:1", "ins:3"]


async def test_a_failed_connect_fails_the_waiting_writes_and_frees_its_slot() -> None:
    attempts = 0
    opener = Opener()

    async def flaky() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise psycopg.OperationalError("connection refused")
        return await opener()

    pool = DirectPostgres(flaky, size=1)
    with pytest.raises(psycopg.OperationalError):
        await pool.execute(Statement("lost"), row(1))
    await pool.execute(Statement("later"), row(2))
    assert opener.opened[0].sent == ["later:2"]


async def test_closing_fails_queued_writes() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    conn = await warm(pool, opener)
    conn.gate.clear()
    busy = asyncio.create_task(pool.execute(Statement("busy"), row(1)))
    await settle()
    queued = asyncio.create_task(pool.execute(Statement("q"), row(2)))
    await settle()
    closing = asyncio.create_task(pool.close())
    await settle()
    with pytest.raises(RuntimeError, match="closed"):
        await queued
    conn.gate.set()
    await busy  # what was under way completes
    await closing
    assert conn.closed
    with pytest.raises(RuntimeError, match="closed"):
        await pool.execute(Statement("late"), row(3))


async def test_connections_belong_to_the_loop_that_opened_them() -> None:
    pool = DirectPostgres(Opener(), size=1)
    assert pool.usable()

    def other_loop() -> bool:
        async def probe() -> bool:
            return pool.usable()

        return asyncio.run(probe())

    assert not await asyncio.to_thread(other_loop)
    await pool.close()
    assert not pool.usable()


async def test_returned_rows_go_back_to_their_own_write() -> None:
    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    conn = await warm(pool, opener)
    assert await pool.execute(Statement("ret"), row(1)) == [(10,)]  # at once
    conn.gate.clear()
    busy = asyncio.create_task(pool.execute(Statement("busy"), row(0)))
    await settle()
    queued = [asyncio.create_task(pool.execute(Statement("ret"), row(v))) for v in (2, 3, 4)]
    await settle()
    conn.gate.set()
    await busy
    assert await asyncio.gather(*queued) == [[(20,)], [(30,)], [(40,)]]
    # A statement with RETURNING is never shared: each write's rows are its own.
    assert conn.sent[-3:] == ["ret:2", "ret:3", "ret:4"]


async def test_an_unexpected_error_fails_its_write_and_the_rest_go_on() -> None:
    class Broken(Statement):
        def bound(self, params: Rows) -> Bound:
            raise ValueError("cannot bind")

    opener = Opener()
    pool = DirectPostgres(opener, size=1)
    conn = await warm(pool, opener)
    conn.gate.clear()
    busy = asyncio.create_task(pool.execute(Statement("busy"), row(1)))
    await settle()
    broken = asyncio.create_task(pool.execute(Broken("broken"), row(2)))
    after = asyncio.create_task(pool.execute(Statement("after"), row(3)))
    await settle()
    conn.gate.set()
    with pytest.raises(ValueError, match="cannot bind"):
        await broken
    await asyncio.gather(busy, after)
    assert conn.sent == ["warm:0", "busy:1", "after:3"] and not conn.closed

"""PostgreSQL connections on the event loop, for the small writes of a request's hot path.

Through a worker thread, a PostgreSQL write costs two thread wake-ups, SQLAlchemy's transaction
bookkeeping and three round trips to the server (BEGIN, the statement, COMMIT). A psycopg async
connection in autocommit mode sends the one statement and awaits its answer on the event loop:
one round trip, and the statement is its own transaction, committed when the answer arrives.

A write that finds a connection idle runs at once, in its caller's task. Writes that find every
connection busy (a crowd subscribing at once) queue, and each connection that comes free takes
the oldest one together with the queued writes of the same statement, as one multi-row
statement when the statement allows it (``Prepared.groupable``): group commit, so a burst costs
a few dozen round trips rather than one per write. If the shared statement fails, nothing of it
was applied, and each write runs again on its own to get its own answer.

Connections are opened lazily, at most ``size`` of them, on the loop that first uses them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ..tasks import BackgroundTasks
from .prepared import MAX_BLOCK, Bound, Prepared, Rows

Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]
Conn = psycopg.AsyncConnection[Any]
# The rows a statement returned (RETURNING), as the driver gives them.
Returned = list[tuple[Any, ...]]


class _Write:
    __slots__ = ("future", "rows", "statement")

    def __init__(self, statement: Prepared, rows: list[dict[str, Any]], future: Any) -> None:
        self.statement = statement
        self.rows = rows
        self.future: asyncio.Future[Returned] = future


class DirectPostgres:
    def __init__(self, connect: Connect, size: int) -> None:
        self._connect = connect
        self._size = size
        self._idle: list[Conn] = []
        # One cursor per connection, reused: a cursor per statement costs ~8 us, a tenth of a
        # one-row insert's round trip.
        self._cursors: dict[Conn, psycopg.AsyncCursor[Any]] = {}
        self._opened = 0
        self._queue: deque[_Write] = deque()
        self._servers = BackgroundTasks("direct_pg")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def usable(self) -> bool:
        """Whether the running loop may use these connections (they belong to one loop)."""
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        return self._loop is loop

    async def execute(self, statement: Prepared, params: Rows) -> Returned:
        """Write ``params`` (one row or a few) with ``statement``; returns once committed, with
        the rows the statement returned (RETURNING)."""
        if self._closed:
            raise RuntimeError("the database is closed")
        if self._idle and not self._queue:
            conn = self._idle.pop()
            try:
                returned = await self._run(conn, statement.bound(params))
            except BaseException:
                self._put_back(conn)
                raise
            self._put_back(conn)
            return returned
        rows = [params] if isinstance(params, dict) else params
        write = _Write(statement, rows, asyncio.get_running_loop().create_future())
        self._queue.append(write)
        self._dispatch()
        # Cancelled while queued, the write is dropped; once taken, it completes regardless
        # (its connection is shared with other writes).
        return await write.future

    async def close(self) -> None:
        self._closed = True
        while self._queue:
            write = self._queue.popleft()
            if not write.future.done():
                write.future.set_exception(RuntimeError("the database is closed"))
        await self._servers.stop(cancel=False)
        idle, self._idle = self._idle, []
        self._cursors.clear()
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.close()

    # -- connections ----------------------------------------------------------------------------

    def _put_back(self, conn: Conn | None) -> None:
        """Return a connection after use, or drop it when its state is unknown (cancelled or
        cut off mid-round-trip: a failed statement leaves an autocommit connection idle)."""
        if conn is not None and (
            conn.closed or conn.info.transaction_status != TransactionStatus.IDLE or self._closed
        ):
            conn.pgconn.finish()  # closes the socket at once; nothing to wait for
            self._cursors.pop(conn, None)
            conn = None
        if conn is None:
            self._opened -= 1
        else:
            self._idle.append(conn)
        self._dispatch()

    def _dispatch(self) -> None:
        """Set a connection to work on the queue while there are writes and connections."""
        while self._queue and not self._closed:
            if self._idle:
                conn: Conn | None = self._idle.pop()
            elif self._opened < self._size:
                self._opened += 1
                conn = None
            else:
                return
            self._servers.spawn(self._serve(conn))
            if conn is None:
                return  # let the connect happen before starting more (the queue may drain)

    async def _serve(self, conn: Conn | None) -> None:
        try:
            if conn is None:
                try:
                    conn = await self._connect()
                except Exception as exc:  # noqa: BLE001 - the server is down: say so to one group
                    self._fail(self._take_group(), exc)
                    return
            while self._queue and conn is not None and not conn.closed:
                group = self._take_group()
                if group:
                    await self._run_group(conn, group)
        finally:
            self._put_back(conn)

    # -- groups ---------------------------------------------------------------------------------

    def _take_group(self) -> list[_Write]:
        """The oldest waiting write, and the later ones of the same statement it can share one
        statement with, up to MAX_BLOCK rows."""
        first = None
        while self._queue and first is None:
            candidate = self._queue.popleft()
            if not candidate.future.done():  # cancelled while queued
                first = candidate
        if first is None:
            return []
        group, rows = [first], len(first.rows)
        if first.statement.groupable and self._queue:
            rest: deque[_Write] = deque()
            for write in self._queue:
                if write.future.done():
                    continue
                if write.statement is first.statement and rows + len(write.rows) <= MAX_BLOCK:
                    group.append(write)
                    rows += len(write.rows)
                else:
                    rest.append(write)
            self._queue = rest
        return group

    async def _run_group(self, conn: Conn, group: list[_Write]) -> None:
        try:
            await self._write_group(conn, group)
        except Exception as exc:  # noqa: BLE001 - handed to the writes' callers
            # Not the database's answer (the driver failed otherwise): whatever is not settled
            # failed, committed or not, and the connection is not reused unless idle.
            self._fail(group, exc)
        except BaseException:
            # The loop is going away: so are the callers.
            for write in group:
                write.future.cancel()
            raise

    async def _write_group(self, conn: Conn, group: list[_Write]) -> None:
        statement = group[0].statement
        if len(group) == 1:
            try:
                returned = await self._run(conn, statement.bound(group[0].rows))
            except psycopg.Error as exc:
                self._fail(group, exc)
            else:
                _settle(group[0].future, returned)
            return
        try:
            # Only statements without RETURNING are grouped: nothing comes back.
            await self._run(conn, statement.bound([row for write in group for row in write.rows]))
        except psycopg.Error as exc:
            if conn.closed:
                self._fail(group, exc)
                return
            # The shared statement did nothing: each write on its own, for its own answer.
            for write in group:
                try:
                    await self._run(conn, statement.bound(write.rows))
                except psycopg.Error as own:
                    _settle(write.future, own)
                    if conn.closed:
                        self._fail(group, own)
                        return
                else:
                    _settle(write.future, [])
            return
        for write in group:
            _settle(write.future, [])

    async def _run(self, conn: Conn, bound: Bound) -> Returned:
        if bound.many:
            async with conn.transaction(), conn.cursor() as many:
                await many.executemany(bound.sql, bound.args)
            return []
        cursor = self._cursors.get(conn)
        if cursor is None:
            cursor = self._cursors[conn] = conn.cursor()
        await cursor.execute(bound.sql, bound.args, prepare=bound.prepare)
        return [tuple(r) for r in await cursor.fetchall()] if cursor.description else []

    @staticmethod
    def _fail(group: list[_Write], exc: BaseException) -> None:
        for write in group:
            _settle(write.future, exc)


def _settle(future: asyncio.Future[Returned], outcome: Returned | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)

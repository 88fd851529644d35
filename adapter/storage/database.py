"""The node's database: SQLAlchemy Core on dedicated worker threads, with group commit.

Each store operation is a function of a Connection, handed to a worker thread; the worker
drains every operation waiting at that moment and runs them in ONE transaction (each in its own
savepoint, so one failure does not undo the others), commits once, and resolves their futures.
A lone operation costs one thread hop and one commit; a burst (1,000 runtimes subscribing at
once) costs one commit for all. SQLite gets one worker, the single writer SQLite wants;
PostgreSQL a few.

One exception, measured (see ``run_small`` and ``execute_small``): on SQLite the one- or
two-statement writes of a request's hot path (an allocation, a subscription) run on the event
loop itself when the write lock is free, because there they cost less than the two thread
wake-ups of a hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, Insert, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import StaticPool

T = TypeVar("T")

# At most this many queued operations share one transaction.
MAX_GROUP = 256
CHECKPOINT_INTERVAL = 1.0
# Beyond this WAL size a checkpoint also truncates the WAL (briefly holding the writer back).
WAL_TRUNCATE_BYTES = 64 * 1024 * 1024


def sync_url(url: str) -> URL:
    """The configured URL with the driver the node uses (sqlite3, psycopg 3)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+pysqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    raise ValueError(f"unsupported database backend {backend!r}")


def is_sqlite(url: str | URL) -> bool:
    return make_url(str(url) if isinstance(url, URL) else url).get_backend_name() == "sqlite"


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin (savepoints need it).
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    # WAL lets readers (the export, the CLI) run beside the writer; synchronous=NORMAL in WAL mode
    # keeps every commit durable against a crash of the node (not of the machine) at a fraction
    # of FULL's cost.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    # Checkpoints (copying the WAL into the database, with an fsync) would otherwise run inside
    # whichever commit crosses the threshold and stall it for milliseconds; the Database's
    # checkpointer thread does them instead, beside the writer.
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # Straight to the driver: this runs for every transaction, and going through SQLAlchemy's
    # statement execution would cost more than the BEGIN itself.
    dbapi = conn.connection.dbapi_connection
    assert dbapi is not None
    # A connection may ask to take the write lock at BEGIN (see Database.run_small).
    dbapi.execute(f"BEGIN {conn.info.get('sqlite_begin', '')}")


def create_engine(url: str, echo: bool = False) -> Engine:
    target = sync_url(url)
    kwargs: dict[str, Any] = {"echo": echo}
    sqlite = target.get_backend_name() == "sqlite"
    if sqlite:
        database = target.database or ""
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        else:
            kwargs["poolclass"] = StaticPool  # one in-memory database for the engine's life
        kwargs["connect_args"] = {"check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
    engine = sa_create_engine(target, **kwargs)
    if sqlite:
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    return engine


# A statement's parameters: one row, or several for executemany.
Rows = dict[str, Any] | list[dict[str, Any]]


class Prepared:
    """A statement compiled once for the database's dialect and run on the driver's cursor.

    For the few statements on a hot path (an allocation's insert runs once per request): it
    skips SQLAlchemy's per-execution work, which costs as much as SQLite's insert itself. Values
    still go through the columns' bind processors, so they are stored exactly as through
    SQLAlchemy. Run it inside ``Database.run`` (it joins that transaction)."""

    def __init__(self, db: Database, statement: Any, columns: Any) -> None:
        dialect = db.engine.dialect
        compiled = statement.compile(dialect=dialect)
        self._sql = str(compiled)
        self._order = list(compiled.positiontup or []) if dialect.positional else None
        self._processors = {
            column.key: processor
            for column in columns
            if (processor := column.type.dialect_impl(dialect).bind_processor(dialect))
        }

    def execute(self, conn: Connection, params: Rows) -> None:
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        self.execute_on_driver(dbapi, params)

    def execute_on_driver(self, dbapi: Any, params: Rows) -> None:
        cursor = dbapi.cursor()
        try:
            if isinstance(params, dict):
                cursor.execute(self._sql, self._args(params))
            else:
                cursor.executemany(self._sql, [self._args(row) for row in params])
        finally:
            cursor.close()

    def _args(self, params: dict[str, Any]) -> Any:
        args = {
            name: processor(value) if (processor := self._processors.get(name)) else value
            for name, value in params.items()
        }
        return tuple(args[n] for n in self._order) if self._order is not None else args


def upsert(dialect: str, entity: Any, keys: list[str], update: list[str] | None = None) -> Insert:
    """INSERT that, on a conflict on ``keys``, updates ``update`` columns (or does nothing)."""
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(entity)
    if update:
        return stmt.on_conflict_do_update(
            index_elements=keys, set_={c: getattr(stmt.excluded, c) for c in update}
        )
    return stmt.on_conflict_do_nothing(index_elements=keys)


def _is_busy(exc: OperationalError | sqlite3.OperationalError) -> bool:
    code = getattr(exc.orig if isinstance(exc, OperationalError) else exc, "sqlite_errorcode", None)
    # Extended codes (BUSY_SNAPSHOT, BUSY_RECOVERY, ...) carry the primary one in the low byte.
    return isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _in_memory(url: str) -> bool:
    database = make_url(url).database
    return not database or database == ":memory:"


class _Job:
    __slots__ = ("fn", "future", "loop")

    def __init__(
        self,
        fn: Callable[[Connection], Any],
        future: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.fn = fn
        self.future = future
        self.loop = loop


class Database:
    def __init__(self, url: str, echo: bool = False, workers: int | None = None) -> None:
        self.url = url
        self.engine = create_engine(url, echo=echo)
        self.dialect = self.engine.dialect.name
        count = workers or (1 if self.dialect == "sqlite" else 4)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"db-{i}", daemon=True) for i in range(count)
        ]
        self._closed = False
        self._stop = threading.Event()
        self._inline: Connection | None = None
        if self.dialect == "sqlite" and not _in_memory(url):
            self._inline = self.engine.connect()
            # Never wait for the lock here: if another connection writes, the caller goes to the
            # worker thread instead (which may wait).
            self._inline.exec_driver_sql("PRAGMA busy_timeout=0")
            self._inline.commit()
            # The lock is taken at BEGIN: if it is busy, nothing has run yet to undo.
            self._inline.info["sqlite_begin"] = "IMMEDIATE"
            self._threads.append(
                threading.Thread(target=self._checkpoint, name="db-checkpoint", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    async def run(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(connection)`` inside a transaction on a database thread; its result or
        exception comes back here once the transaction committed."""
        if self._closed:
            raise RuntimeError("the database is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put(_Job(fn, future, loop))
        return await future

    async def run_small(self, fn: Callable[[Connection], T]) -> T:
        """``run`` for a statement or two on a request's hot path.

        On SQLite, runs right here when the database's write lock is free: in WAL mode with
        checkpoints moved to their own thread, such a commit is a few page writes into the OS
        cache (~30-80 us), and it never waits for a lock (busy timeout 0). On this kind of
        machine a hop to the worker thread and back costs more than that (two thread wake-ups
        of ~50-100 us each): 10,000 sequential allocations took 2.8 s through the worker and
        1.8 s here, on an earlier build (the allocation's own write now uses
        ``execute_small``). When the lock is held, or on PostgreSQL, it is ``run``."""
        inline = self._inline
        if inline is not None and not self._closed:
            try:
                with inline.begin():
                    return fn(inline)
            except (OperationalError, sqlite3.OperationalError) as exc:
                # The BEGIN runs in an event hook, so its error arrives unwrapped.
                if not _is_busy(exc):
                    raise
        return await self.run(fn)

    async def execute_small(self, statement: Prepared, params: Rows) -> None:
        """One prepared statement (for one row or a few) in a transaction of its own:
        ``run_small`` for the writes on a request's hot path (an allocation, a delete).

        On SQLite with the write lock free, BEGIN/COMMIT go straight to the driver, skipping
        SQLAlchemy's transaction bookkeeping and events, which cost as much as SQLite's own
        commit. Nothing awaits between BEGIN and COMMIT, so the connection is back in
        autocommit state before anything else can use it."""
        inline = self._inline
        if inline is not None and not self._closed:
            dbapi = inline.connection.dbapi_connection
            assert dbapi is not None
            try:
                dbapi.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
            else:
                try:
                    statement.execute_on_driver(dbapi, params)
                    dbapi.execute("COMMIT")
                except BaseException:
                    if dbapi.in_transaction:
                        dbapi.execute("ROLLBACK")
                    raise
                return
        await self.run(lambda conn: statement.execute(conn, params))

    def _work(self) -> None:
        # Each worker keeps its connection for its whole life: no pool check-out and reset per
        # transaction, which would cost more than a small transaction itself.
        conn: Connection | None = None
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    self._jobs.put(None)  # the stop signal stays queued for the other workers
                    return
                group = self._gather(job)
                if conn is None or conn.invalidated or conn.closed:
                    try:
                        conn = self._connect()
                    except Exception as exc:  # noqa: BLE001 - the database is down
                        # Fail this group rather than the thread: its callers get the error
                        # now, and the next job tries to connect again.
                        conn = None
                        self._settle(group, dict.fromkeys(range(len(group)), (None, exc)))
                        continue
                self._run_group(conn, group)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _checkpoint(self) -> None:
        wal = Path(str(self.engine.url.database) + "-wal")
        with self.engine.connect() as conn:
            while not self._stop.wait(CHECKPOINT_INTERVAL):
                try:
                    size = wal.stat().st_size if wal.exists() else 0
                    if size:
                        mode = "TRUNCATE" if size > WAL_TRUNCATE_BYTES else "PASSIVE"
                        conn.exec_driver_sql(f"PRAGMA wal_checkpoint({mode})")
                except Exception:  # noqa: BLE001 - the next round tries again
                    continue

    def _connect(self) -> Connection:
        return self.engine.connect()

    def _gather(self, job: _Job) -> list[_Job]:
        group = [job]
        while len(group) < MAX_GROUP:
            try:
                more = self._jobs.get_nowait()
            except queue.Empty:
                break
            if more is None:
                self._jobs.put(None)
                break
            group.append(more)
        return group

    def _run_group(self, conn: Connection, group: list[_Job]) -> None:
        outcomes: dict[int, tuple[Any, BaseException | None]] = {}
        try:
            with conn.begin():
                if len(group) == 1:
                    outcomes[0] = (group[0].fn(conn), None)
                else:
                    for index, job in enumerate(group):
                        savepoint = conn.begin_nested()
                        try:
                            value = job.fn(conn)
                        except Exception as exc:  # noqa: BLE001 - handed to its caller
                            savepoint.rollback()
                            outcomes[index] = (None, exc)
                        else:
                            savepoint.commit()
                            outcomes[index] = (value, None)
        except Exception as exc:  # noqa: BLE001 - every caller learns of it
            # The transaction itself failed (commit, connection, or the lone job): nothing of
            # the group is durable, so every job reports a failure (its own error if it had one).
            outcomes = {
                i: (None, (outcomes.get(i) or (None, None))[1] or exc) for i in range(len(group))
            }
        self._settle(group, outcomes)

    @staticmethod
    def _settle(group: list[_Job], outcomes: dict[int, tuple[Any, BaseException | None]]) -> None:
        for index, job in enumerate(group):
            value, error = outcomes[index]
            with contextlib.suppress(RuntimeError):  # the loop may be gone at shutdown
                job.loop.call_soon_threadsafe(_resolve, job.future, value, error)

    async def dispose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._inline is not None:
            self._inline.close()
        self._jobs.put(None)
        await asyncio.to_thread(self._join)
        self.engine.dispose()

    def _join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)


def _resolve(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)

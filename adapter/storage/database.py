"""The node's database: SQLAlchemy Core on dedicated worker threads, with group commit.

Each store operation is a function of a Connection, handed to a worker thread; the worker
drains every operation waiting at that moment and runs them in ONE transaction, commits once, and
resolves their futures (if one fails, each runs again on its own, so one failure does not undo
the others).
A lone operation costs one thread hop and one commit; a burst (1,000 runtimes subscribing at
once) costs one commit for all. SQLite gets one worker, the single writer SQLite wants;
PostgreSQL a few.

Exceptions, measured (see ``run_small`` and ``execute_small``): on SQLite the one- or
two-statement writes of a request's hot path (an allocation, a subscription) run on the event
loop itself when the write lock is free, because there they cost less than the two thread
wake-ups of a hop. On PostgreSQL ``execute_small`` sends its one statement over an async
connection on the event loop (``DirectPostgres``): one round trip instead of a hop and three.

Durability, one rule on both databases: every commit survives a crash of the node process. A
commit on the worker threads (``run``: messages kept for a detached runtime, which the homeserver
has been told were delivered, and whatever else is not on a request's hot path) also waits for
the disk, so it survives a crash of the machine or the database server, and makes every earlier
commit durable with it (the log is flushed in order). The hot-path writes (``run_small`` and
``execute_small``: allocations, subscriptions, learned routes, session changes, which a runtime
asks for again) do not wait, unless ``synchronous_commit`` is set: then every commit does. On
SQLite (WAL) that is synchronous=FULL for the worker connections and NORMAL for the inline one;
on PostgreSQL the server's own setting (on unless an operator turned it off) for the worker
connections and synchronous_commit=off for the event loop's. Either way a commit is atomic and
visible to every later read.

Errors: every path (``run``, ``run_small``, ``execute_small``) on every database raises the same
family for what the database itself said: ``DatabaseUnavailable`` for a condition that passes
(the server unreachable or restarting, a connection lost, the pool exhausted, SQLite locked),
``ConstraintViolation`` for a write that conflicts with a row already there. Each carries the
driver's or SQLAlchemy's error as its ``__cause__``. Anything else (a bug in a statement, an
exception of the caller's own function) comes through as it was raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import structlog
from sqlalchemy import Engine, Insert, Select, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import StaticPool

from ..private_files import SQLITE_SIDE_FILES, create_private_file, private_dir
from .direct_pg import DirectPostgres
from .prepared import Prepared, Rows

log = structlog.get_logger(__name__)

__all__ = [
    "ConstraintViolation",
    "Database",
    "DatabaseUnavailable",
    "Prepared",
    "Rows",
    "StorageError",
    "create_engine",
    "is_sqlite",
    "sqlite_files",
    "sync_url",
    "unavailable",
    "upsert",
]

T = TypeVar("T")

# At most this many queued operations share one transaction.
MAX_GROUP = 256
CHECKPOINT_INTERVAL = 1.0
# Beyond this WAL size a checkpoint also truncates the WAL (briefly holding the writer back).
WAL_TRUNCATE_BYTES = 64 * 1024 * 1024
# PostgreSQL connections on the event loop for execute_small (see DirectPostgres).
DIRECT_CONNECTIONS = 4


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


def _sqlite_connect(synchronous: str, dbapi_conn: Any, _record: Any) -> None:
    # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin (savepoints need it).
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    # WAL lets readers (the export, the CLI) run beside the writer; synchronous=NORMAL in WAL mode
    # keeps every commit durable against a crash of the node (not of the machine) at a fraction
    # of FULL's cost.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA synchronous={synchronous}")
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


def _pg_options(target: URL, synchronous_commit: bool | None) -> dict[str, Any]:
    """libpq's ``options`` for every connection: session settings applied at connect, outside
    any transaction (a SET in a connect hook would be undone by the pool's rollback)."""
    if synchronous_commit is None:
        return {}
    given = target.query.get("options", "")
    options = " ".join(
        part
        for part in (*(given if isinstance(given, tuple) else (given,)), "-c synchronous_commit=")
        if part
    )
    return {"options": options + ("on" if synchronous_commit else "off")}


def sqlite_files(url: str) -> list[Path]:
    """The files of a SQLite database URL: the database and the -wal/-shm/-journal files SQLite
    keeps beside it, whether they exist or not; none for PostgreSQL or an in-memory database."""
    if not is_sqlite(url):
        return []
    database = make_url(url).database
    if not database or database == ":memory:":
        return []
    path = Path(database).expanduser()
    return [path, *(path.with_name(path.name + side) for side in SQLITE_SIDE_FILES)]


def _create_private(path: Path) -> None:
    """The database file, created empty and owner-only before SQLite opens it: it holds the
    session-signing secret, and SQLite gives its -wal/-shm/-journal files the database file's
    mode (its own would be the process umask's, usually world-readable). A missing directory is
    created 0700; an existing one is left as it is."""
    if not path.parent.is_dir():
        private_dir(path.parent)
    create_private_file(path)


def create_engine(
    url: str,
    echo: bool = False,
    synchronous_commit: bool | None = None,
    application_name: str | None = None,
) -> Engine:
    """An engine for the node's database. ``synchronous_commit``: whether a commit waits until it
    is on disk (durable against a crash of the machine); None keeps the database's default
    (SQLite: synchronous=NORMAL in WAL mode; PostgreSQL: the server's setting).
    ``application_name``: how PostgreSQL names the connections (the node process's changes
    announced to the others carry it)."""
    target = sync_url(url)
    kwargs: dict[str, Any] = {"echo": echo}
    sqlite = target.get_backend_name() == "sqlite"
    if sqlite:
        database = target.database or ""
        if database and database != ":memory:":
            _create_private(Path(database).expanduser())
        else:
            kwargs["poolclass"] = StaticPool  # one in-memory database for the engine's life
        kwargs["connect_args"] = {"check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
        kwargs["connect_args"] = _pg_options(target, synchronous_commit)
        if application_name is not None:
            kwargs["connect_args"]["application_name"] = application_name
    engine = sa_create_engine(target, **kwargs)
    if sqlite:
        synchronous = "FULL" if synchronous_commit else "NORMAL"
        event.listen(engine, "connect", partial(_sqlite_connect, synchronous))
        event.listen(engine, "begin", _sqlite_begin)
    return engine


def upsert(
    dialect: str,
    entity: Any,
    keys: list[str],
    update: list[str] | None = None,
    source: tuple[Sequence[str], Select[Any]] | None = None,
) -> Insert:
    """INSERT that, on a conflict on ``keys``, updates ``update`` columns (or does nothing);
    with ``source`` (columns, SELECT) the rows are what the SELECT gives."""
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(entity)
    if source is not None:
        stmt = stmt.from_select(list(source[0]), source[1])
    if update:
        return stmt.on_conflict_do_update(
            index_elements=keys, set_={c: getattr(stmt.excluded, c) for c in update}
        )
    return stmt.on_conflict_do_nothing(index_elements=keys)


class StorageError(Exception):
    """What the database said about an operation, the same whichever path ran it."""


class DatabaseUnavailable(StorageError):
    """The database could not be used just now: a condition that passes, unlike a bug. Callers
    wait and try again; they never count it against the message they were handling."""


class ConstraintViolation(StorageError):
    """The write conflicts with a row already there (a unique key, a foreign key)."""


def _away(exc: BaseException) -> bool:
    # Each path raises its own family: ``run`` SQLAlchemy's wrappers, the inline SQLite path
    # sqlite3's own errors, the direct PostgreSQL path psycopg's, and the pool its timeout when
    # every connection is stuck on a server that went away.
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(
        exc,
        (
            OperationalError,
            InterfaceError,
            PoolTimeout,
            psycopg.OperationalError,
            psycopg.InterfaceError,
            sqlite3.OperationalError,
        ),
    )


def storage_error(exc: BaseException) -> BaseException:
    """``exc`` as the family above when the database raised it, else ``exc`` itself."""
    translated: StorageError
    if isinstance(exc, IntegrityError | sqlite3.IntegrityError | psycopg.IntegrityError):
        translated = ConstraintViolation(str(exc))
    elif _away(exc):
        translated = DatabaseUnavailable(str(exc))
    else:
        return exc
    translated.__cause__ = exc
    return translated


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be used just now."""
    return isinstance(exc, DatabaseUnavailable)


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
    def __init__(
        self,
        url: str,
        echo: bool = False,
        workers: int | None = None,
        synchronous_commit: bool = False,
        application_name: str | None = None,
    ) -> None:
        self.url = url
        self.application_name = application_name
        # The worker connections wait for the disk whatever ``synchronous_commit`` says (the
        # rule in the module's docstring); bursts share a commit, so that costs a burst little.
        # PostgreSQL: the server's own setting; SQLite: FULL.
        self.engine = create_engine(
            url,
            echo=echo,
            synchronous_commit=True if is_sqlite(url) else (synchronous_commit or None),
            application_name=application_name,
        )
        self.dialect = self.engine.dialect.name
        self._synchronous_commit = synchronous_commit
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
            if not synchronous_commit:
                # Straight to the driver, before SQLAlchemy begins a transaction: SQLite refuses
                # to change the level inside one.
                dbapi = self._inline.connection.dbapi_connection
                assert dbapi is not None
                dbapi.execute("PRAGMA synchronous=NORMAL")
            self._inline.exec_driver_sql("PRAGMA busy_timeout=0")
            self._inline.commit()
            # The lock is taken at BEGIN: if it is busy, nothing has run yet to undo.
            self._inline.info["sqlite_begin"] = "IMMEDIATE"
            self._threads.append(
                threading.Thread(target=self._checkpoint, name="db-checkpoint", daemon=True)
            )
        self._direct: DirectPostgres | None = None
        if self.dialect == "postgresql":
            self._direct = DirectPostgres(self._connect_direct, DIRECT_CONNECTIONS)
        for thread in self._threads:
            thread.start()

    async def connect_autocommit(self) -> psycopg.AsyncConnection[Any]:
        """A PostgreSQL connection of its own on the event loop, in autocommit mode (for LISTEN:
        the caller keeps and closes it)."""
        return await self._connect_direct()

    async def _connect_direct(self) -> psycopg.AsyncConnection[Any]:
        # The engine's own connect arguments (host, credentials, options, the dialect's type
        # adapters), so these connections behave as the engine's do.
        args, params = self.engine.dialect.create_connect_args(self.engine.url)
        if self.application_name is not None:
            params["application_name"] = self.application_name
        params.update(_pg_options(self.engine.url, self._synchronous_commit))
        return await psycopg.AsyncConnection.connect(*args, **params, autocommit=True)

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
                    raise storage_error(exc)  # noqa: B904 - storage_error sets the cause
            except Exception as exc:  # noqa: BLE001 - raised again, as the storage family
                raise storage_error(exc)  # noqa: B904
        return await self.run(fn)

    async def execute_small(self, statement: Prepared, params: Rows) -> list[tuple[Any, ...]]:
        """One prepared statement (for one row or a few) in a transaction of its own:
        ``run_small`` for the writes on a request's hot path (an allocation, a delete, a
        subscription, a session). Returns once the write is committed, with the rows a one-row
        statement returned (RETURNING), as the driver gives them.

        On SQLite with the write lock free, BEGIN/COMMIT go straight to the driver, skipping
        SQLAlchemy's transaction bookkeeping and events, which cost as much as SQLite's own
        commit. Nothing awaits between BEGIN and COMMIT, so the connection is back in
        autocommit state before anything else can use it.

        On PostgreSQL the statement goes to the server over an async connection on the event
        loop, in autocommit mode: one round trip, no thread hop (10,000 sequential one-row
        inserts: ~0.5 ms each through a worker, ~0.06 ms here with synchronous_commit off).
        Several rows go as one multi-row statement when the Prepared has a ``block`` form,
        else in one transaction. Errors are the storage family,
        as ``run``'s are."""
        direct = self._direct
        if direct is not None and direct.usable():
            try:
                return await direct.execute(statement, params)
            except Exception as exc:  # noqa: BLE001 - raised again, as the storage family
                raise storage_error(exc)  # noqa: B904 - storage_error sets the cause
        inline = self._inline
        if inline is not None and not self._closed:
            dbapi = inline.connection.dbapi_connection
            assert dbapi is not None
            try:
                dbapi.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise storage_error(exc)  # noqa: B904 - storage_error sets the cause
            else:
                try:
                    returned = statement.execute_on_driver(dbapi, params)
                    dbapi.execute("COMMIT")
                except BaseException as exc:  # noqa: BLE001 - raised again, as the family
                    if dbapi.in_transaction:
                        dbapi.execute("ROLLBACK")
                    raise storage_error(exc)  # noqa: B904
                return returned
        return await self.run(lambda conn: statement.execute(conn, params))

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
                except Exception as exc:  # noqa: BLE001 - the next round tries again
                    log.warning("WAL checkpoint failed", error=repr(exc))

    def _connect(self) -> Connection:
        conn = self.engine.connect()
        if self.dialect == "sqlite":
            # Take the write lock at BEGIN: a group that reads before it writes would otherwise
            # fail at once (SQLITE_BUSY_SNAPSHOT, no busy wait) whenever the inline connection
            # committed in between.
            conn.info["sqlite_begin"] = "IMMEDIATE"
        return conn

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
        if len(group) == 1:
            self._settle(group, {0: self._run_alone(conn, group[0])})
            return
        # Optimistic: the whole group in one transaction, without a savepoint per operation
        # (on PostgreSQL each savepoint and its release is a round trip: two thirds of a
        # 1,000-runtime burst's round trips). If an operation fails, nothing was committed, and
        # every operation runs again in a transaction of its own, for its own outcome.
        values: list[Any] = []
        try:
            with conn.begin():
                for job in group:
                    values.append(job.fn(conn))
                    # ``values`` then tells a failed operation from a failed commit.
        except Exception as exc:  # noqa: BLE001 - every caller learns of it
            if len(values) == len(group):
                # The commit (or the connection under it) failed: nothing of the group is
                # known to be durable, and running it again might apply it twice.
                self._settle(group, dict.fromkeys(range(len(group)), (None, exc)))
                return
            self._settle(group, {i: self._run_alone(conn, job) for i, job in enumerate(group)})
            return
        self._settle(group, {i: (value, None) for i, value in enumerate(values)})

    @staticmethod
    def _run_alone(conn: Connection, job: _Job) -> tuple[Any, BaseException | None]:
        try:
            with conn.begin():
                return job.fn(conn), None
        except Exception as exc:  # noqa: BLE001 - handed to its caller
            return None, exc

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
        if self._direct is not None:
            await self._direct.close()
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
        future.set_exception(storage_error(error))
    else:
        future.set_result(value)

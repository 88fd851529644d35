"""One domain's routing state in every process: what the other node processes change in it
reaches this process's routing table.

PostgreSQL announces every row change of the sessions, allocations, subscriptions and learned
routes, in the writing transaction (storage/processes.py installs the triggers), so an
announcement exists exactly when the change is committed. This process listens, skips its own
(each process's connections carry its name), and applies the others' to its table: a runtime
held by another process is then an address like any other here, its messages leave through a
lane and that process delivers them. A connection lost to the database is opened again and
the other processes' part of the table read again whole, since announcements made meanwhile
are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from sqlalchemy import Connection, text

from ..retry import Backoff
from ..routing_table import RoutingTable
from ..storage.database import Database
from ..storage.processes import PROCESSES_CHANNEL, ROUTES_CHANNEL, application_name

log = structlog.get_logger(__name__)

RETRY_MAX_SECONDS = 5.0
# The longest a message to an address this process does not know waits for the announcements
# in flight before it is refused.
CATCH_UP_SECONDS = 2.0


class SharedRoutes:
    def __init__(
        self,
        db: Database,
        process: str,
        table: RoutingTable,
        reload: Callable[[], Awaitable[None]],
        on_process: Callable[[], Awaitable[None]],
        on_handover: Callable[[str, str], None],
    ) -> None:
        self._db = db
        self._me = application_name(process)
        self._table = table
        self._reload = reload
        self._on_process = on_process
        self._process = process
        # Another process asks for a session this one holds: (runtime URL, the asker).
        self._on_handover = on_handover
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        self._marks = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[None]] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="shared-routes")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _listen(self) -> None:
        backoff = Backoff(0.25, RETRY_MAX_SECONDS)
        first = True
        while True:
            try:
                conn = await self._db.connect_autocommit()
                async with conn:
                    await conn.execute(f"LISTEN {ROUTES_CHANNEL}")
                    await conn.execute(f"LISTEN {PROCESSES_CHANNEL}")
                    if not first:
                        # What was announced while nobody listened is not announced again.
                        await self._reload()
                    first = False
                    backoff.reset()
                    self.listening.set()
                    async for note in conn.notifies():
                        if note.channel == PROCESSES_CHANNEL:
                            await self._on_process()
                        else:
                            self._apply(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database away: listen again
                log.warning("listening for routing changes failed", error=repr(exc))
            self.listening.clear()
            await backoff.wait()

    async def caught_up(self) -> None:
        """Until every change committed before now has reached the table (or a moment has
        passed). An address another process allocated a moment ago may not have been heard of
        yet: its announcement is on its way. This process announces a mark of its own and
        waits for it to come back: announcements arrive in the order of their commits."""
        if not self.listening.is_set():
            return
        mark = next(self._marks)
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[mark] = waiter
        payload = orjson.dumps({"by": self._me, "t": "mark", "n": mark}).decode()

        def announce(conn: Connection) -> None:
            conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": ROUTES_CHANNEL, "p": payload})

        try:
            await self._db.run(announce)
            async with asyncio.timeout(CATCH_UP_SECONDS):
                await waiter
        except TimeoutError:
            log.warning("routing changes not caught up in time")
        finally:
            self._waiting.pop(mark, None)

    def _apply(self, payload: str) -> None:
        try:
            note = orjson.loads(payload)
            if note["t"] == "handover":
                if note["from"] == self._process:
                    self._on_handover(str(note["runtime"]), str(note["to"]))
                return
            if note["by"] == self._me:
                waiter = self._waiting.get(note["n"]) if note["t"] == "mark" else None
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                return
            apply_change(self._table, note["t"], note["op"], note["row"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("routing change not understood", error=repr(exc))


def apply_change(table: RoutingTable, kind: str, op: str, row: dict[str, Any]) -> None:
    """One announced row change, applied to ``table`` (idempotent)."""
    session = int(row["s"])
    removed = op == "DELETE"
    if kind == "runtime_sessions":
        if removed:
            table.remove_session(session)
        else:
            table.add_runtime(session, str(row["runtime"]))
        return
    address = str(row["address"])
    if kind == "allocations":
        if removed:
            table.remove_allocations(session, [address])
        else:
            key = row.get("key")
            table.add_allocations(session, [address], None if key is None else str(key))
    elif kind == "subscriptions":
        if removed:
            table.unsubscribe(session, [address])
        else:
            table.subscribe(session, [address])
    elif kind == "learned_routes":
        if removed:
            table.unlearn(session, address)
        else:
            table.learn(session, address)

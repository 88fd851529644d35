"""A publication to a stream whose subscribers are away is stored once (issue 41, row 6), on
SQLite and PostgreSQL: each subscriber's kept delivery refers to one copy of its text, reads
it back whole, counts it against its own quota, and the copy goes once nobody refers to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import orjson
import pytest
import pytest_asyncio
from sqlalchemy import Connection, inspect, text

from adapter.access import AccessMonitor
from adapter.carrier import Routed
from adapter.routing.delivery import Delivery
from adapter.routing.journal import Journal
from adapter.routing.marks import SenderMarks
from adapter.routing_table import RoutingTable
from adapter.storage.checkpoints import CheckpointStore
from adapter.storage.clock import utcnow
from adapter.storage.database import Database
from adapter.storage.pending import PendingStore
from adapter.storage.sessions import SessionStore

from ..unit.routing.test_routing_core import Sessions, metrics

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
STREAM = "comm://example.com/kept-o/changes"
SUBSCRIBERS = 50


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.dispose()


async def _stored_bytes(db: Database) -> int:
    def op(conn: Connection) -> int:
        total = 0
        for table in ("pending_deliveries", "kept_payloads"):
            if inspect(conn).has_table(table):  # (so that the code before the fix runs it too)
                total += int(
                    conn.execute(
                        text(f"SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM {table}")
                    ).scalar_one()
                )
        return total

    return await db.run(op)


async def test_a_publication_to_many_away_subscribers_is_stored_once(db: Database) -> None:
    store = SessionStore(db)
    ids = [
        await store.create(
            f"runtime://example.com/kept-{i}",
            f"@_rethink_kept{i}:example.com",
            f"kk{i}",
            False,
            None,
        )
        for i in range(SUBSCRIBERS + 1)
    ]
    table = RoutingTable()
    sessions = Sessions()
    reporter, *subscribers = (sessions.add(i, table) for i in ids)
    for subscriber in subscribers:
        table.subscribe(subscriber.id, [STREAM])
    publication = orjson.dumps(
        {
            "id": 1,
            "type": "update",
            "from": "comm://example.com/kept-o",
            "to": STREAM,
            "body": {"value": "x" * 200_000},
        }
    ).decode()
    monitor = AccessMonitor("example.com", table)
    delivery = Delivery(monitor, sessions, Journal(None), metrics(), SenderMarks())  # type: ignore[arg-type]
    # Nobody is attached: every subscriber's copy is kept for its resume.
    await delivery.deliver([Routed(publication, (STREAM,), reporter.sender("kk.s"), 1)], None)
    before = await _stored_bytes(db)
    checkpoints = CheckpointStore(db)
    await checkpoints.commit(
        [(s.id, s.mailbox.take_unstored(None)) for s in subscribers], [], {}, {}
    )
    # Once, not once per subscriber (before: 50 copies, 10 MB).
    assert await _stored_bytes(db) - before < 2 * len(publication)

    pending = PendingStore(db)
    sizes = await pending.stored()
    for subscriber in subscribers:
        [row] = await pending.after(subscriber.id, 0, 10)
        assert row.text == publication and row.origin == "kk.s" and row.oseq == 1
        # Each subscriber's quota counts what waits for it.
        assert sizes[subscriber.id][1] == len(publication)

    # Still referred to: the sweep keeps it, however old.
    first, *rest = subscribers
    await checkpoints.commit([], [(first.id, 2**62)], {}, {})
    assert await pending.sweep(utcnow() + timedelta(minutes=1)) == 0
    [row] = await pending.after(rest[0].id, 0, 10)
    assert row.text == publication
    # Nobody waits for it any more: recently written, it stays; then it goes.
    await checkpoints.commit([], [(s.id, 2**62) for s in rest], {}, {})
    assert await pending.sweep(utcnow() - timedelta(minutes=1)) == 0
    assert await pending.sweep(utcnow() + timedelta(minutes=1)) == 1
    assert await _stored_bytes(db) == before

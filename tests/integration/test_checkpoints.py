"""What a checkpoint writes, on SQLite and PostgreSQL: each node process's recovery positions
and sender marks are its own, and the latest of each is kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from sqlalchemy import Connection, select

from adapter.storage.checkpoints import CheckpointStore
from adapter.storage.clock import utcnow
from adapter.storage.database import Database
from adapter.storage.models import SenderMark

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.dispose()


async def test_marks_and_positions_are_each_process_own_and_the_latest_is_kept(
    db: Database,
) -> None:
    p1, p2 = CheckpointStore(db, "p1"), CheckpointStore(db, "p2")
    marks = {f"{i:016x}.stub": i for i in range(1, 1201)}
    await p1.commit([], [], {"!lane": "$e1", "!other": "$o1"}, marks)
    await p1.commit([], [], {"!lane": "$e2"}, {"0000000000000001.stub": 99, "new.n": 5})
    await p2.commit([], [], {"!lane": "$x"}, {"0000000000000001.stub": 7})

    got = await p1.marks()
    assert got == {**marks, "0000000000000001.stub": 99, "new.n": 5}
    assert await p2.marks() == {"0000000000000001.stub": 7}
    assert await p1.positions() == {"!lane": "$e2", "!other": "$o1"}
    assert await p2.positions() == {"!lane": "$x"}
    # Another process's positions, as a take-over reads them.
    assert await p2.positions(process="p1") == await p1.positions()
    assert await CheckpointStore(db).marks() == {}


async def test_marks_keep_any_number_and_age_like_the_rest(db: Database) -> None:
    """Marks go in as one statement from one parameter: the largest number a message may carry
    comes back exact, and their time is stored as every other row's (pruning compares it)."""
    store = CheckpointStore(db, "p3")
    largest = 2**53 - 1
    await store.commit([], [], {}, {"a.stub": largest, "b.n": 1})
    assert await store.marks() == {"a.stub": largest, "b.n": 1}

    def stamps(conn: Connection) -> list[datetime]:
        rows = conn.execute(select(SenderMark.updated_at).where(SenderMark.process == "p3"))
        return [stamp for (stamp,) in rows]

    now = utcnow()
    for stamp in await db.run(stamps):  # read back as the column's type reads it
        # SQLite gives it back naive (in UTC, as written), PostgreSQL with its zone.
        aware = stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
        assert abs(aware - now) < timedelta(minutes=1)
    assert await store.prune_marks(timedelta(hours=1)) == 0
    assert await store.marks() == {"a.stub": largest, "b.n": 1}
    # Kept for less than no time: every mark is older than that.
    assert await store.prune_marks(timedelta(seconds=-5)) >= 2
    assert await store.marks() == {}

"""What a checkpoint writes, on SQLite and PostgreSQL: each node process's recovery positions
and sender marks are its own, and the latest of each is kept."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from adapter.storage.checkpoints import CheckpointStore
from adapter.storage.database import Database

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

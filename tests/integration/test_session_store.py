"""SessionStore on SQLite and PostgreSQL: what a crowd of runtimes connecting and dropping writes
(prepared statements on the hot path) is stored exactly as the schema says."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from sqlalchemy import text

from adapter.storage.clock import utcnow
from adapter.storage.database import Database
from adapter.storage.models import SessionState
from adapter.storage.pending import PendingStore, kept_rows, write_kept
from adapter.storage.sessions import SessionStore

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.dispose()


async def test_sessions_created_at_once_get_their_own_ids(db: Database) -> None:
    store = SessionStore(db)
    urls = [f"runtime://example.com/{i}" for i in range(300)]
    ids = await asyncio.gather(
        *(
            store.create(u, f"@_rethink_{i}:example.com", f"key{i}", False, None)
            for i, u in enumerate(urls)
        )
    )
    assert len(set(ids)) == len(urls)
    rows = {r.id: r for r in await store.all()}
    assert {rows[i].runtime_url for i in ids} == set(urls)
    assert all(rows[i].runtime_url == u for i, u in zip(ids, urls, strict=True))
    assert {r.state for r in rows.values()} == {SessionState.CONNECTED}


async def test_state_changes_are_stored_as_the_schema_spells_them(db: Database) -> None:
    store = SessionStore(db)
    first = await store.create(
        "runtime://example.com/a", "@_rethink_a:example.com", "ka", True, None
    )
    second = await store.create(
        "runtime://example.com/b", "@_rethink_b:example.com", "kb", False, None
    )
    before = {r.id: r.last_seen for r in await store.all()}
    await asyncio.sleep(0.01)
    await store.set_state(first, SessionState.DETACHED)
    rows = {r.id: r for r in await store.all()}
    assert rows[first].state is SessionState.DETACHED
    assert rows[second].state is SessionState.CONNECTED
    assert rows[first].last_seen > before[first] and rows[second].last_seen == before[second]
    # The column holds the enum's value, which migrations and exports read.
    raw = await db.run(
        lambda c: dict(c.execute(text("SELECT id, state FROM runtime_sessions")).all())
    )
    assert raw == {first: "detached", second: "connected"}
    await store.set_state(first, SessionState.CONNECTED)
    assert {r.state for r in await store.all()} == {SessionState.CONNECTED}
    # A session handed a token stays protected; one that is not stays as it was.
    await store.set_state(second, SessionState.CONNECTED, protect=True)
    await store.set_state(first, SessionState.DETACHED)
    rows = {r.id: r for r in await store.all()}
    assert rows[first].protected and rows[second].protected


async def test_a_deleted_session_takes_what_it_owned_and_nothing_else(db: Database) -> None:
    store = SessionStore(db)
    gone = await store.create(
        "runtime://example.com/gone", "@_rethink_g:example.com", "kg", True, None
    )
    kept = await store.create(
        "runtime://example.com/kept", "@_rethink_k:example.com", "kk", True, None
    )
    insert = text(
        "INSERT INTO allocations (address, scheme, session_id, created_at)"
        " VALUES (:address, 'hyperty', :session, CURRENT_TIMESTAMP)"
    )
    await db.run(
        lambda c: c.execute(insert, {"address": "hyperty://example.com/g", "session": gone})
    )
    await db.run(
        lambda c: c.execute(insert, {"address": "hyperty://example.com/k", "session": kept})
    )
    await store.delete(gone)
    assert {r.id for r in await store.all()} >= {kept} and gone not in {
        r.id for r in await store.all()
    }
    owners = await db.run(
        lambda c: dict(c.execute(text("SELECT address, session_id FROM allocations")).all())
    )
    assert owners.get("hyperty://example.com/k") == kept
    assert "hyperty://example.com/g" not in owners


@dataclass(frozen=True)
class Kept:
    dseq: int
    text: str
    origin: str | None
    oseq: int
    event_id: str | None
    digest: str | None = None


async def test_deliveries_kept_for_a_session_released_meanwhile_are_dropped_not_fatal(
    db: Database,
) -> None:
    """A checkpoint carries every session's deliveries: one session released (its row deleted)
    between keeping a delivery and the write must not fail the others' rows."""
    store = SessionStore(db)
    gone = await store.create(
        "runtime://example.com/gone-2", "@_rethink_g2:example.com", "kg2", False, None
    )
    live = await store.create(
        "runtime://example.com/live-2", "@_rethink_l2:example.com", "kl2", False, None
    )
    await store.delete(gone)
    entries = [Kept(1, '{"id":1}', "o.1", 1, "$e"), Kept(2, '{"id":2}', "o.1", 2, "$e")]
    rows = kept_rows([(gone, entries), (live, entries)], utcnow())
    await db.run(lambda c: write_kept(c, rows))
    await db.run(lambda c: write_kept(c, rows))  # a retried checkpoint: nothing twice
    pending = PendingStore(db)
    assert await pending.count(gone) == 0
    assert [r.dseq for r in await pending.after(live, 0, 10)] == [1, 2]

"""What the session registry keeps is bounded (issue 23): detached sessions beyond the bound
are released oldest first; a replaced stub instance's and a released session's origins are
retired; the per-runtime lines are gone when nobody uses them; racing operations of one
runtime run one after the other."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from adapter.bounds import Bound
from adapter.sessions import registry as registry_module
from adapter.sessions.registry import Lifecycle, SessionRegistry, SessionsFull
from adapter.sessions.serial import Serial
from adapter.sessions.session import AckHello
from adapter.sessions.tokens import SessionTokens
from adapter.storage.clock import utcnow
from adapter.storage.models import SessionState


class Rows:
    """The sessions table in memory, with a UNIQUE runtimeURL as the database has."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.by_runtime: dict[str, int] = {}

    async def create(
        self,
        runtime_url: str,
        user_id: str,
        key: str,
        protected: bool,
        identity: str | None,
        claim: str,
        kept: Any = None,
        client: str = "",
    ) -> int:
        await asyncio.sleep(0.001)  # a round trip: room for a race
        if runtime_url in self.by_runtime:
            raise RuntimeError("UNIQUE constraint failed: runtime_sessions.runtime_url")
        self.by_runtime[runtime_url] = session_id = next(self.ids)
        return session_id

    async def set_state(
        self, session_id: int, state: SessionState, protect: bool = False, used: bool = True
    ) -> None:
        await asyncio.sleep(0)

    async def claim_of(self, runtime_url: str) -> None:
        return None

    async def release(self, session_id: int, kept: Any) -> None:
        await asyncio.sleep(0.001)
        self.by_runtime = {k: v for k, v in self.by_runtime.items() if v != session_id}

    async def detach_all(self) -> None:
        return None

    async def all(self) -> list[Any]:
        return []


async def database_away(_session_id: int, _kept: Any = None) -> None:
    """A session delete while the database is unavailable."""
    raise OSError("the database is away")


class Link:
    peer = "test"
    open = True

    async def send(self, data: str | bytes) -> bool:
        return True

    async def close(self, code: int = 1000, reason: str = "") -> None:
        return None


class Gauge:
    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


def registry(
    max_detached: int = 100, retired: list[str] | None = None
) -> tuple[SessionRegistry, list[int]]:
    evicted: list[int] = []
    lifecycle = Lifecycle(retired=[retired.append] if retired is not None else [])
    made = SessionRegistry(
        Rows(),
        None,  # type: ignore[arg-type]
        SessionTokens("s" * 32, 3600),
        lambda url: f"@u:{url}",
        Gauge(),
        3600,
        lifecycle,
        lambda _m: None,
        lambda _s: None,
        max_detached,
        lambda: evicted.append(1),
    )
    return made, evicted


async def test_detached_sessions_beyond_the_bound_are_released_newest_unused_first() -> None:
    # Issue 41 row 5: a flood of new sessions evicts its own, never the runtimes already away
    # (the longest detached, which an honest runtime briefly away is, went first before).
    sessions, evicted = registry(max_detached=3)
    for i in range(5):
        attachment = await sessions.attach(f"runtime://d/{i}", Link(), None, None)
        await sessions.detach(attachment)
    await asyncio.sleep(0.05)
    assert len(evicted) == 2
    assert [s.runtime_url for s in sessions] == [f"runtime://d/{i}" for i in (0, 1, 2)]


async def test_a_used_session_outlasts_newer_unused_ones_and_older_used_ones() -> None:
    sessions, evicted = registry(max_detached=3)
    for i in range(3):
        attachment = await sessions.attach(f"runtime://d/{i}", Link(), None, None)
        attachment.session.used = i != 1  # 0 and 2 sent something; 1 never did
        await sessions.detach(attachment)
    # A fourth, used: the unused one goes, though it is older.
    attachment = await sessions.attach("runtime://d/3", Link(), None, None)
    attachment.session.used = True
    await sessions.detach(attachment)
    await asyncio.sleep(0.05)
    assert sorted(s.runtime_url for s in sessions) == [f"runtime://d/{i}" for i in (0, 2, 3)]
    # Among used ones, the newest goes.
    attachment = await sessions.attach("runtime://d/4", Link(), None, None)
    attachment.session.used = True
    await sessions.detach(attachment)
    await asyncio.sleep(0.05)
    assert sorted(s.runtime_url for s in sessions) == [f"runtime://d/{i}" for i in (0, 2, 3)]
    assert len(evicted) == 2


async def test_a_replaced_stub_instance_and_a_released_session_retire_their_origins() -> None:
    retired: list[str] = []
    sessions, _ = registry(retired=retired)
    first = await sessions.attach("runtime://d/r", Link(), None, AckHello("stubaaaa1", 0))
    key = first.session.key
    await sessions.detach(first)
    second = await sessions.attach("runtime://d/r", Link(), None, AckHello("stubbbbb2", 0))
    assert retired == [f"{key}.stubaaaa1"]  # the reloaded page's old instance
    second.session.sender(f"{key}.stubbbbb2")
    await sessions.release(second.session)
    assert retired == [f"{key}.stubaaaa1", f"{key}.stubbbbb2"]


async def test_a_connect_racing_a_release_gets_a_new_session_and_no_error() -> None:
    sessions, _ = registry()
    for _ in range(20):
        attachment = await sessions.attach("runtime://d/race", Link(), None, None)
        # The old connection's `disconnect` and a new instance's connect, in either order.
        release = asyncio.create_task(sessions.disconnect(attachment))
        again = await sessions.attach("runtime://d/race", Link(), None, None)
        released = await release
        assert not again.session.released, "a newer connection keeps what it attached to"
        assert released == (again.session is not attachment.session)
        await sessions.release(again.session)
    assert len(sessions._serial) == 0  # no line is kept once nobody uses it


async def test_a_disconnect_the_database_refuses_for_a_while_still_releases() -> None:
    """The stub dropped its token with its `disconnect`: the release is tried again while the
    database is away; the runtime's next connect waits for it and gets a new session."""
    sessions, _ = registry()
    rows: Any = sessions._rows
    attachment = await sessions.attach("runtime://d/db", Link(), None, None)

    rows.release = database_away
    leaving = asyncio.create_task(sessions.disconnect(attachment))
    await asyncio.sleep(0.3)
    assert not leaving.done() and not attachment.session.released
    coming_back = asyncio.create_task(sessions.attach("runtime://d/db", Link(), None, None))
    await asyncio.sleep(0.1)
    assert not coming_back.done(), "a connect must wait for the release it would race"
    del rows.release  # the database is back
    assert await leaving
    again = await coming_back
    assert again.session is not attachment.session and attachment.session.released


async def test_a_release_the_database_keeps_refusing_leaves_the_session_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_module, "RELEASE_RETRY_SECONDS", 0.0)
    sessions, _ = registry()
    rows: Any = sessions._rows
    attachment = await sessions.attach("runtime://d/db", Link(), None, None)

    rows.release = database_away
    with pytest.raises(OSError):
        await sessions.disconnect(attachment)
    # Whole, not half gone (out of memory while its row still holds the runtimeURL): expiry
    # releases it later.
    assert not attachment.session.released
    assert sessions.by_runtime("runtime://d/db") is attachment.session


async def test_an_expiry_the_database_refuses_is_tried_again_at_the_next_round() -> None:
    sessions, _ = registry()
    sessions._ttl = 0
    rows: Any = sessions._rows
    await sessions.detach(await sessions.attach("runtime://d/old", Link(), None, None))

    rows.release = database_away
    await sessions.expire()
    assert sessions.by_runtime("runtime://d/old") is not None
    del rows.release
    await sessions.expire()
    assert sessions.by_runtime("runtime://d/old") is None and rows.by_runtime == {}


async def test_a_line_is_gone_once_nobody_holds_or_waits_for_it() -> None:
    serial = Serial()
    order: list[int] = []

    async def hold(n: int) -> None:
        async with serial.line("k"):
            order.append(n)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(hold(n) for n in range(5)))
    assert order == [0, 1, 2, 3, 4] and len(serial) == 0


class StoredRows(Rows):
    """The sessions table kept across a restart: what ``create`` and ``set_state`` write is
    what ``all`` reads back."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, dict[str, Any]] = {}

    async def create(
        self,
        runtime_url: str,
        user_id: str,
        key: str,
        protected: bool,
        identity: str | None,
        claim: str,
        kept: Any = None,
        client: str = "",
    ) -> int:
        session_id = await super().create(
            runtime_url, user_id, key, protected, identity, claim, kept, client
        )
        self.rows[session_id] = {
            "id": session_id,
            "runtime_url": runtime_url,
            "user_id": user_id,
            "key": key,
            "protected": protected,
            "identity": identity,
            "claim": claim,
            "last_seen": utcnow(),
            "client": client,
            "used": False,
        }
        return session_id

    async def set_state(
        self, session_id: int, state: SessionState, protect: bool = False, used: bool = True
    ) -> None:
        self.rows[session_id]["used"] = used

    async def all(self) -> list[Any]:
        return [SimpleNamespace(**row) for row in self.rows.values()]


def bounded_registry(rows: Rows, max_detached: int = 100) -> SessionRegistry:
    return SessionRegistry(
        rows,
        None,  # type: ignore[arg-type]
        SessionTokens("s" * 32, 3600),
        lambda url: f"@u:{url}",
        Gauge(),
        3600,
        Lifecycle(),
        lambda _m: None,
        lambda _s: None,
        max_detached,
        bound=Bound("sessions", 2, 100),
    )


async def test_a_restart_counts_the_sessions_it_reads_back_under_their_client() -> None:
    """Issue 41 row 3 across a restart: the sessions a client held before count against its
    bound after (they counted as nobody's, and the client got its whole share again)."""
    rows = StoredRows()
    before = bounded_registry(rows)
    for i in range(2):
        attachment = await before.attach(f"runtime://d/f{i}", Link(), None, None, client="ip:f")
        await before.detach(attachment)
    with pytest.raises(SessionsFull):
        await before.attach("runtime://d/f2", Link(), None, None, client="ip:f")

    after = bounded_registry(rows)
    await after.load(2, {})
    with pytest.raises(SessionsFull) as refused:
        await after.attach("runtime://d/f2", Link(), None, None, client="ip:f")
    assert refused.value.code == 429
    # Another client is not held to it; a session of the client that goes gives its place back.
    await after.attach("runtime://d/honest", Link(), None, None, client="ip:h")
    gone = after.by_runtime("runtime://d/f0")
    assert gone is not None
    await after.release(gone)
    await after.attach("runtime://d/f2", Link(), None, None, client="ip:f")


async def test_a_restart_still_evicts_the_sessions_never_used_first() -> None:
    """Whether a session was used is stored: after a restart a flood of sessions never used
    (made before it) goes before an honest runtime's older session, not after."""
    rows = StoredRows()
    before = bounded_registry(rows)
    honest = await before.attach("runtime://d/honest", Link(), None, None, client="ip:h")
    honest.session.used = True  # it sent a frame
    await before.detach(honest)
    for i in range(2):
        flood = await before.attach(f"runtime://d/new{i}", Link(), None, None, client="ip:f")
        await before.detach(flood)
    await asyncio.sleep(0.05)  # the states written behind

    after = bounded_registry(rows, max_detached=3)
    await after.load(2, {})
    late = await after.attach("runtime://d/late", Link(), None, None, client="ip:l")
    late.session.used = True
    await after.detach(late)
    await asyncio.sleep(0.05)
    # The newest never used went, not the runtime that used its session since the start.
    assert after.by_runtime("runtime://d/new1") is None
    assert after.by_runtime("runtime://d/late") is not None
    assert after.by_runtime("runtime://d/honest") is not None


async def test_a_stop_ends_the_state_writer_even_when_the_database_refuses() -> None:
    """Found by the domain model: a stopped node's state writer retried against its closed
    database every second for good."""
    sessions, _ = registry()

    async def closed(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("the database is closed")

    sessions._rows.set_state = closed  # type: ignore[method-assign]
    attachment = await sessions.attach("runtime://d/1", Link(), None, None)
    sessions.mark_used(attachment.session)
    writer = sessions._state_writer
    assert writer is not None
    await sessions.stop_writing_states(timeout=0.05)
    assert writer.done()

"""One owner per invariant (issue 44): every operation on a runtime's session, a move between
node processes too, runs in the runtime's line; racing ones end in one consistent state, and
whoever waits for a move waits in the line (no event beside it, no polling)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from adapter.identity import Identity
from adapter.sessions import registry as registry_module
from adapter.sessions.mailbox import Entry, Parcel
from adapter.sessions.registry import Lifecycle, SessionRefused, SessionRegistry
from adapter.sessions.serial import Serial
from adapter.sessions.tokens import SessionTokens
from adapter.storage.clock import utcnow
from adapter.storage.models import SessionState
from adapter.storage.sessions import HeldElsewhere

from .test_session_bounds import Gauge, Link, Rows

URL = "runtime://d/line"


class Gate:
    """A database call that waits until the test lets it through."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    async def __call__(self, *_args: Any, **_kwargs: Any) -> None:
        self.entered.set()
        await self.open.wait()


class GatedRows(Rows):
    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, Gate] = {}
        self.holders: dict[str, tuple[str, Any]] = {}

    async def _pass(self, name: str) -> None:
        gate = self.gates.get(name)
        if gate is not None:
            await gate()

    async def create(self, runtime_url: str, *args: Any, **kwargs: Any) -> int:
        await self._pass("create")
        return await super().create(runtime_url, *args, **kwargs)

    async def set_state(
        self, session_id: int, state: SessionState, protect: bool = False, used: bool = True
    ) -> None:
        if protect:
            await self._pass("protect")

    async def release(self, session_id: int, kept: Any) -> None:
        await self._pass("release")
        await super().release(session_id, kept)

    async def held(self, runtime_url: str) -> tuple[str, Any] | None:
        await asyncio.sleep(0)
        return self.holders.get(runtime_url)


class Deliveries:
    """Kept deliveries in memory (storage/pending.py)."""

    def __init__(self) -> None:
        self.rows: dict[int, list[Entry]] = {}
        self.replays: list[int] = []

    async def append(self, session_id: int, entries: Sequence[Entry]) -> None:
        await asyncio.sleep(0)
        self.rows.setdefault(session_id, []).extend(entries)

    async def after(self, session_id: int, dseq: int, limit: int) -> list[Any]:
        self.replays.append(session_id)
        await asyncio.sleep(0)
        return [
            SimpleNamespace(dseq=e.dseq, text=e.text, origin=e.origin, oseq=e.oseq)
            for e in self.rows.get(session_id, [])
            if e.dseq > dseq
        ][:limit]

    async def remove_through(self, session_id: int, dseq: int) -> None:
        kept = self.rows.get(session_id, [])
        self.rows[session_id] = [e for e in kept if e.dseq > dseq]


def registry(process: str | None = None) -> tuple[SessionRegistry, GatedRows, Deliveries]:
    rows, deliveries = GatedRows(), Deliveries()
    made = SessionRegistry(
        rows,
        deliveries,
        SessionTokens("s" * 32, 3600),
        lambda url: f"@u:{url}",
        Gauge(),
        3600,
        Lifecycle(),
        lambda _m: None,
        lambda _s: None,
        process=process,
    )
    return made, rows, deliveries


def row(session_id: int, runtime_url: str = URL) -> SimpleNamespace:
    """A session row as another node process left it."""
    return SimpleNamespace(
        id=session_id,
        key=f"k{session_id:04d}",
        runtime_url=runtime_url,
        user_id=f"@u:{runtime_url}",
        claim=None,
        protected=False,
        client="",
        used=True,
        identity=None,
        last_seen=utcnow(),
    )


def oidc(sub: str) -> Identity:
    return Identity(
        f"user://idp.example/{sub}",
        "idp.example",
        "oidc",
        True,
        f"{sub}@idp.example",
        expires_at=time.time() + 300,
        issuer="https://idp.example",
        subject=sub,
    )


class Recording(Link):
    def __init__(self) -> None:
        self.sent: list[str | bytes] = []

    async def send(self, data: str | bytes) -> bool:
        self.sent.append(data)
        return True


async def settled(task: Awaitable[Any]) -> Any:
    """The task's result; the bound only keeps a broken test from hanging."""
    return await asyncio.wait_for(task, 5)


async def test_a_turn_in_several_lines_holds_once_first_in_all_and_never_deadlocks() -> None:
    serial = Serial()
    order: list[str] = []

    async def run(name: str, keys: list[str]) -> None:
        turn = serial.reserve(keys)
        try:
            await turn.wait()
            order.append(name)
            await asyncio.sleep(0.001)
        finally:
            turn.release()

    # Two moves over the same lines in opposite orders, and single-line operations between:
    # each turn is placed in all its lines in one step, so none waits for a later one.
    await settled(
        asyncio.gather(
            run("a", ["x"]),
            run("move1", ["x", "y", "z"]),
            run("b", ["y"]),
            run("move2", ["z", "y", "x"]),
            run("c", ["z"]),
        )
    )
    assert order == ["a", "move1", "b", "move2", "c"]
    assert len(serial) == 0


async def test_a_turn_given_up_while_waiting_lets_those_behind_it_go() -> None:
    serial = Serial()
    first = serial.reserve(["x"])
    waiting = serial.reserve(["x", "y"])
    behind = serial.reserve(["y"])
    assert first.held and not waiting.held and not behind.held
    waiting.release()  # a connection that gave up its wait
    assert behind.held
    first.release()
    behind.release()
    assert len(serial) == 0


async def test_a_connection_waits_in_the_line_for_a_move_and_resumes_the_moved_session() -> None:
    sessions, _rows, _deliveries = registry()
    move = sessions.moving([URL])  # as the take-over's transaction returns
    link = Recording()
    attaching = asyncio.create_task(sessions.attach(URL, link, None, None))
    [adopted] = await sessions.adopt(move, [row(7)], 2, {})
    for _ in range(20):
        await asyncio.sleep(0)
    assert not attaching.done(), "a connection must not take a session still moving here"
    delivered = await adopted.mailbox.deliver(Parcel("live", "o.1", 2))
    assert delivered == "queued"  # held behind what is read again

    sessions.adopted(move, {adopted.id: [Parcel("read again", "o.1", 1)]})
    attachment = await settled(attaching)
    assert attachment.session is adopted and attachment.resumed
    assert len(sessions) == 1 and sessions.by_runtime(URL) is adopted
    await sessions._resume(attachment, 0)
    assert link.sent == [b"read again", b"live"]


async def test_a_move_waits_in_the_line_for_an_attach_and_keeps_the_session_attached() -> None:
    sessions, rows, _deliveries = registry()
    rows.gates["create"] = gate = Gate()
    attaching = asyncio.create_task(sessions.attach(URL, Link(), None, None))
    await gate.entered.wait()
    move = sessions.moving([URL])
    adopting = asyncio.create_task(sessions.adopt(move, [row(7)], 2, {}))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not adopting.done(), "a move must wait for the operation holding the line"
    gate.open.set()
    attachment = await settled(attaching)
    assert await settled(adopting) == []  # the runtime's session was here by then
    sessions.adopted(move, {})
    assert len(sessions) == 1 and sessions.by_runtime(URL) is attachment.session
    assert attachment.current and len(sessions._serial) == 0


async def test_a_handover_on_waits_for_the_move_here_and_takes_what_was_read_again() -> None:
    sessions, _rows, deliveries = registry()
    move = sessions.moving([URL])
    [adopted] = await sessions.adopt(move, [row(7)], 2, {})
    handing = asyncio.create_task(sessions.hand_over(URL, lambda: "stopped"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not handing.done()
    sessions.adopted(move, {adopted.id: [Parcel("read again", "o.1", 1)]})
    handed = await settled(handing)
    assert handed is not None and handed == (adopted, "stopped")
    assert [e.text for e in deliveries.rows[adopted.id]] == ["read again"]
    assert sessions.by_runtime(URL) is None


async def test_a_connection_finding_the_session_just_taken_here_waits_for_the_move() -> None:
    sessions, rows, _deliveries = registry(process="p1")
    rows.holders[URL] = ("p1", row(7))  # the take-over's transaction has committed
    move = sessions.moving([URL])
    asking = asyncio.create_task(sessions.held_elsewhere(URL, None, None))
    [adopted] = await sessions.adopt(move, [row(7)], 2, {})
    for _ in range(20):
        await asyncio.sleep(0)
    assert not asking.done()
    sessions.adopted(move, {})
    assert await settled(asking) is None
    attachment = await sessions.attach(URL, Link(), None, None)
    assert attachment.session is adopted


async def test_a_move_taking_too_long_sends_the_connection_to_connect_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_module, "TAKE_OVER_WAIT_SECONDS", 0.01)
    sessions, _rows, _deliveries = registry()
    move = sessions.moving([URL])
    await sessions.adopt(move, [row(7)], 2, {})
    with pytest.raises(HeldElsewhere):
        await settled(sessions.attach(URL, Link(), None, None))
    with pytest.raises(HeldElsewhere):
        await settled(sessions.admit(URL, None, None))
    sessions.adopted(move, {})
    assert len(sessions._serial) == 0  # the connections gave their turns up
    assert (await sessions.attach(URL, Link(), None, None)).resumed


async def test_only_a_move_bounds_a_connection_s_wait_in_the_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry_module, "TAKE_OVER_WAIT_SECONDS", 0.01)
    sessions, rows, _deliveries = registry()
    first = await sessions.attach(URL, Link(), None, None)
    rows.gates["release"] = gate = Gate()
    releasing = asyncio.create_task(sessions.release(first.session))
    await gate.entered.wait()
    attaching = asyncio.create_task(sessions.attach(URL, Link(), None, None))
    await asyncio.sleep(0.05)
    assert not attaching.done()  # still waiting, not sent away
    gate.open.set()
    await settled(releasing)
    again = await settled(attaching)
    assert not again.resumed and again.session is not first.session


async def test_attach_and_release_racing_in_either_order_leave_one_live_session() -> None:
    sessions, _rows, _deliveries = registry()
    for releasing_first in (True, False) * 5:
        old = await sessions.attach(URL, Link(), None, None)
        if releasing_first:
            releasing = asyncio.create_task(sessions.release(old.session))
            attaching = asyncio.create_task(sessions.attach(URL, Link(), None, None))
        else:
            attaching = asyncio.create_task(sessions.attach(URL, Link(), None, None))
            releasing = asyncio.create_task(sessions.release(old.session))
        await settled(releasing)
        new = await settled(attaching)
        assert old.session.released
        if releasing_first:
            assert new.session is not old.session and new.current
            assert sessions.by_runtime(URL) is new.session and len(sessions) == 1
        else:
            # The release came after the attach: it took the session, this connection too.
            assert new.session is old.session and not new.current
            assert sessions.by_runtime(URL) is None and len(sessions) == 0
            await sessions.attach(URL, Link(), None, None)
        await sessions.release(sessions.by_runtime(URL))  # type: ignore[arg-type]
    assert len(sessions._serial) == 0


async def test_a_credential_on_a_replaced_connection_changes_nothing() -> None:
    sessions, rows, _deliveries = registry()
    alice = oidc("alice")
    old = await sessions.attach(URL, Link(), None, None, identity=alice)
    # A newer connection of the same runtime and identity, storing its protection.
    rows.gates["protect"] = gate = Gate()
    newer = oidc("alice")
    attaching = asyncio.create_task(
        sessions.attach(URL, Link(), None, None, identity=newer, protect=True)
    )
    await gate.entered.wait()
    # The old connection's {cmd: 'auth'} arrives meanwhile: it waits, then finds itself replaced.
    reauthenticating = asyncio.create_task(sessions.reauthenticate(old, oidc("alice")))
    gate.open.set()
    attachment = await settled(attaching)
    with pytest.raises(SessionRefused, match="newer connection"):
        await settled(reauthenticating)
    assert attachment.session.identity is newer
    # On the current connection it takes.
    fresh = oidc("alice")
    await sessions.reauthenticate(attachment, fresh)
    assert attachment.session.identity is fresh


async def test_the_resume_of_a_replaced_connection_replays_nothing() -> None:
    sessions, rows, deliveries = registry()
    first = await sessions.attach(URL, Link(), None, None)
    await sessions.detach(first)
    await first.session.mailbox.deliver(Parcel("kept", "o.1", 1))
    again = await sessions.attach(URL, Link(), None, None)
    # Its resume is spawned after the answer; a newer connection attaches before it runs.
    rows.gates["protect"] = gate = Gate()
    newer = asyncio.create_task(sessions.attach(URL, Link(), None, None, protect=True))
    await gate.entered.wait()
    resuming = asyncio.create_task(sessions._resume(again, 0))
    gate.open.set()
    latest = await settled(newer)
    await settled(resuming)
    assert deliveries.replays == [], "the replaced connection's resume must not replay"
    await sessions._resume(latest, 0)
    assert deliveries.replays and latest.session.mailbox.live

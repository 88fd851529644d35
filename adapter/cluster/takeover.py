"""Taking a runtime's session over from the node process that holds it: all the sessions of
a process that is gone, or one session, handed over by a live process, when its runtime reached
another one.

A live holder hands a session over when the process its runtime connected to asks (a NOTIFY):
it closes the runtime's old connection (as replaced), stores what it kept for it, stops
delivering to it, lets its lanes send what the runtime had sent, and writes into the session's
row the new holder and the handover: where in each room its deliveries to the runtime stopped,
and how far its lanes carry the runtime's messages. The new holder then takes it as below, from
those positions; the handing process goes on.

A process that is gone (killed, its machine lost, or silent for longer than
``cluster.gone_after_seconds``):

The first process that notices (a runtime of the gone process connecting to it, or its own
heartbeat finding the other's stale) strikes the gone process from the domain and holds its
sessions, in one transaction: exactly one process takes them. Then nothing they were sent may
be lost:
- what the gone process had kept for them is in the database (its checkpoints), and goes with
  the resume as after a restart;
- what it had not settled is after its recovery positions in the rooms: every lane is read again
  from the gone process's position (or, where it had none, from where the lane's writer
  started), in the homeserver's order of the events, and what was for the taken sessions is
  kept for them first; what the lanes bring meanwhile waits behind it, once;
- delivery numbers continue above the gone process's (a fresh start count), so a stub keeps
  everything new, and drops by its number what it already had.
Before the taken runtimes' connections are admitted, this process reads the gone process's
lanes to their ends, so what a runtime sends now comes after what it sent there.

If the gone process was only slow, its next heartbeat finds its row struck and it stops at once
(membership.py): it never serves a session another process holds.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import orjson
import structlog

from appservice.intent import Intent

from .. import carrier
from ..access import AccessMonitor
from ..routing.lanes import Lane
from ..routing.numbering import event_number
from ..sessions.mailbox import Parcel
from ..sessions.registry import Move, SessionRegistry
from ..sessions.session import Session
from ..storage.checkpoints import CheckpointStore
from ..storage.pending import PendingStore
from ..storage.processes import ProcessStore
from ..storage.sessions import SessionStore
from ..tasks import BackgroundTasks
from .sibling_lanes import SiblingLanes

log = structlog.get_logger(__name__)

PAGE = 100
CATCH_UP_SECONDS = 10.0
# How long the asking process waits for a live holder to hand a session over.
HANDOVER_SECONDS = 5.0
# A runtime's session moves at most once this often (each move reads rooms again): a runtime
# flapping between processes faster is told to connect again later (503).
HANDOVER_INTERVAL_SECONDS = 1.0
RECENT_HANDOVERS = 10_000


class ReadAgain:
    """A taken session's deliveries read again from the rooms: settled once its runtime has
    acknowledged, or this process has stored, every one of them (a mailbox ticket)."""

    __slots__ = ("_settled", "event_id", "pending")

    def __init__(self) -> None:
        self.event_id: str | None = None  # not one lane event's
        self.pending = 0
        self._settled = asyncio.Event()

    def hold(self) -> None:
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1
        if self.pending <= 0:
            self._settled.set()

    async def wait(self) -> None:
        if self.pending > 0:
            await self._settled.wait()


class TakeOver:
    def __init__(
        self,
        rows: SessionStore,
        processes: ProcessStore,
        checkpoints: CheckpointStore,
        pending: PendingStore,
        sessions: SessionRegistry,
        monitor: AccessMonitor,
        bot: Intent,
        siblings: SiblingLanes,
        gone_after_seconds: float,
        name: str,
        lanes: Callable[[], list[Lane]],
    ) -> None:
        self._name = name
        self._lanes = lanes
        # Handovers waiting for what was read again for their sessions to settle.
        self._finishing = BackgroundTasks("takeover")
        self._rows = rows
        self._processes = processes
        self._checkpoints = checkpoints
        self._pending = pending
        self._sessions = sessions
        self._monitor = monitor
        self._bot = bot
        self._siblings = siblings
        self._gone_after = timedelta(seconds=gone_after_seconds)
        self._lock = asyncio.Lock()
        self._recent: OrderedDict[str, float] = OrderedDict()  # runtime URL -> when it moved
        # The sessions whose handovers this process had not finished when it stopped, and
        # those handovers (``hold_unfinished``, at start).
        self._unfinished: tuple[Move, dict[int, str]] | None = None
        self._filter = {"types": [carrier.BATCH_EVENT], "senders": [bot.user_id]}

    async def __call__(self, holder: str, runtime_url: str) -> bool:
        """Take the runtime's session from ``holder``: with all of its others if it is gone
        ("": sessions nobody holds), handed over if it is alive. Whether this process holds
        it now."""
        processes = await self._processes.all()
        listed = {row.name: row for row in processes}
        if holder and holder in listed and ProcessStore.alive(listed[holder], self._gone_after):
            return await self._handed(holder, runtime_url, processes)
        async with self._lock:
            await self._take(holder, await self._processes.all())
        return True

    async def _alive(self, name: str) -> bool:
        return any(
            row.name == name and ProcessStore.alive(row, self._gone_after)
            for row in await self._processes.all()
        )

    async def gone(self, holder: str) -> None:
        """Take every session of ``holder``, if it is gone."""
        await self(holder, "")

    # -- a live holder's session ----------------------------------------------------------------

    async def _handed(self, holder: str, runtime_url: str, processes: list[Any]) -> bool:
        now = time.monotonic()
        last = self._recent.get(runtime_url)
        if last is not None and now - last < HANDOVER_INTERVAL_SECONDS:
            return False
        self._recent[runtime_url] = now
        self._recent.move_to_end(runtime_url)
        while len(self._recent) > RECENT_HANDOVERS:
            self._recent.popitem(last=False)
        # The runtime's line is the move's before the holder is asked: a connection finding
        # the session this process's waits in it until the session is here.
        move = self._sessions.moving([runtime_url])
        try:
            await move.ready()
            await self._processes.ask_for(holder, runtime_url, self._name)
            found = await self._until_handed(holder, runtime_url)
        except BaseException:
            self._sessions.adopted(move, {})  # nothing moved
            raise
        if isinstance(found, bool):
            self._sessions.adopted(move, {})  # nothing moved
            if found:
                # It died before it could answer: its sessions are taken as a gone one's (a
                # move of their own, in their lines).
                async with self._lock:
                    await self._take(holder, await self._processes.all())
            return found
        await self._adopt_handed(move, holder, found, processes, now)
        return True

    async def _until_handed(self, holder: str, runtime_url: str) -> tuple[Any, str] | bool:
        """The session's row and handover once ``holder`` has handed it here; False when it
        did not in time, True when it died first."""
        deadline = time.monotonic() + HANDOVER_SECONDS
        while (found := await self._rows.handed_here(runtime_url)) is None:
            if time.monotonic() > deadline:
                log.warning("a session was not handed over in time", process=holder)
                return False
            # Another process's answer, in the database: read again, there is no event here.
            await asyncio.sleep(0.05)
            if not await self._alive(holder):
                return True
        return found

    async def _adopt_handed(
        self, move: Move, holder: str, found: tuple[Any, str], processes: list[Any], asked: float
    ) -> None:
        row, handover = found
        handed_at = time.monotonic()
        given = orjson.loads(handover)
        sessions = await self._adopt(move, [row])
        before: dict[int, list[Parcel]] = {}
        read_at: float | None = None
        try:
            self._after(given["sent"])
            lanes = {room: n for process in processes for room, n in process.lanes}
            before = await self._read_again(given["positions"], {s.id for s in sessions}, lanes)
            read_at = time.monotonic()
            for room, through in given["sent"].items():
                await self._siblings.catch_up(room, CATCH_UP_SECONDS, through)
        except Exception:
            log.exception("reading the rooms again for a handed session failed", process=holder)
        finally:
            self._adopted(move, before, {row.id: handover})
        done = time.monotonic()
        log.info(
            "session handed over",
            process=holder,
            runtime=row.runtime_url,
            read_again=sum(len(p) for p in before.values()),
            # Where a slow move spends its time: the holder handing it, reading the rooms
            # again, catching up with what the runtime had sent through the holder's lanes.
            handing_ms=round((handed_at - asked) * 1000),
            reading_ms=round((read_at - handed_at) * 1000) if read_at is not None else None,
            catching_up_ms=round((done - read_at) * 1000) if read_at is not None else None,
        )

    async def _adopt(self, move: Move, rows: list[Any]) -> list[Session]:
        """The move's sessions here, from ``rows`` (``SessionRegistry.adopt``); the move is
        ended if that fails."""
        try:
            epoch = await self._checkpoints.next_start()
            return await self._sessions.adopt(move, rows, epoch, await self._pending.stored())
        except BaseException:
            self._sessions.adopted(move, {})  # nothing moved
            raise

    async def give(self, runtime_url: str, to: str) -> None:
        """Hand the runtime's session to process ``to``, if this process holds it."""
        lanes = self._lanes()

        def positions() -> dict[str, str]:
            # Where deliveries to it stop, room by room: what was complete before now.
            own = {
                lane.room_id: lane.delivered_through
                for lane in lanes
                if lane.room_id is not None and lane.delivered_through is not None
            }
            return {**self._siblings.positions(), **own}

        handed = await self._sessions.hand_over(runtime_url, positions)
        if handed is None:
            return
        session, stopped = handed
        # What the runtime sent here leaves with the lanes: the new holder reads it first.
        for lane in lanes:
            await lane.flush(CATCH_UP_SECONDS)
        sent = {lane.room_id: lane.last_number for lane in lanes if lane.room_id is not None}
        handover = orjson.dumps({"positions": stopped, "sent": sent}).decode()
        if not await self._rows.hand_over(session.id, to, handover):
            log.error("a session could not be handed over", runtime=runtime_url, to=to)

    def _adopted(
        self, move: Move, before: dict[int, list[Parcel]], handovers: dict[int, str]
    ) -> None:
        """Let the taken runtimes go on, with what was read again for them first (the move
        ends). Each session's handover stays in its row until that is settled (the runtime
        acknowledged or this process stored every message of it): should this process die
        before, the one taking over from it reads again from the same place."""
        tickets = {session.id: ReadAgain() for session in move.sessions}
        self._sessions.adopted(move, before, tickets)
        self._finishing.spawn(self._finished(handovers, tickets), name="handovers-finished")

    async def _finished(self, handovers: dict[int, str], tickets: dict[int, ReadAgain]) -> None:
        """Clear each handover once what was read again for its session is settled: at once
        where nothing was (in one statement), the others as each settles."""
        waiting = {i for i in handovers if i in tickets and tickets[i].pending > 0}

        async def clear(done: dict[int, str]) -> None:
            try:
                await self._rows.taken(done)
            except Exception as exc:  # noqa: BLE001 - a later take-over only reads more
                log.warning("a finished handover was not cleared", error=repr(exc))

        async def when_settled(session_id: int) -> None:
            await tickets[session_id].wait()
            await clear({session_id: handovers[session_id]})

        await clear({i: h for i, h in handovers.items() if i not in waiting})
        await asyncio.gather(*(when_settled(i) for i in waiting))

    async def close(self) -> None:
        """Stop waiting: a handover not finished stays in its row (a later take-over reads
        again from it, which costs a little more reading, never a message)."""
        await self._finishing.stop()

    def _after(self, rooms: dict[str, int]) -> None:
        """What the taken runtimes sent through the other process's lanes (up to these numbers)
        is read here before they go on; a third process reads it before what they send now,
        because this process's lanes tell it to (their next event names these rooms)."""
        for lane in self._lanes():
            lane.require_after(rooms)

    # -- a gone process's sessions --------------------------------------------------------------

    async def _take(self, gone: str, processes: list[Any]) -> None:
        positions = await self._checkpoints.positions(process=gone)
        found = await self._rows.take_over(
            gone, orjson.dumps({"positions": positions, "sent": {}}).decode()
        )
        if not found:
            return
        # In the same step as the transaction returns: a connection that finds one of these
        # sessions this process's from now on waits in its line until the session is here.
        move = self._sessions.moving(row.runtime_url for row, _handover in found)
        log.warning("taking over the sessions of a node process that is gone", process=gone)
        sessions = await self._adopt(move, [row for row, _handover in found])
        adopted = {session.id for session in sessions}
        handovers = {row.id: handover for row, handover in found}
        # Every process's lanes, this one's too (registered before it takes anything over).
        lanes = {room: n for row in processes for room, n in row.lanes}
        before: dict[int, list[Parcel]] = {}
        try:
            ends = {
                room: await self._siblings.newest_number(room)
                for row in processes
                if row.name == gone
                for room, _n in row.lanes
            }
            self._after(ends)
            # From the gone process's positions, or for a session handed to it that it had
            # not finished with, from where its previous holder stopped.
            before = await self._read_again_from(
                {i: h for i, h in handovers.items() if i in adopted}, lanes
            )
            for room, through in ends.items():
                await self._siblings.catch_up(room, CATCH_UP_SECONDS, through)
        except Exception:
            # Not expected (the homeserver away for long): what the gone process had not
            # settled may be missing for these runtimes; their sessions go on.
            log.exception("reading the rooms again for taken sessions failed", process=gone)
        finally:
            self._adopted(move, before, handovers)
        log.warning(
            "sessions taken over",
            process=gone,
            sessions=len(sessions),
            read_again=sum(len(p) for p in before.values()),
        )

    # -- this process's own unfinished handovers, after a restart ------------------------------

    async def hold_unfinished(self) -> None:
        """At start, before any lane is read: the sessions this process was taking over when
        it stopped (handed to it, or a gone process's) and had not finished with (what it
        read again for them may not have been stored). They are a move, as taken ones are:
        what is delivered to them is held, and their runtimes wait, until
        ``finish_unfinished`` has read it again."""
        unfinished = dict(await self._rows.unfinished())
        move = await self._sessions.hold(list(unfinished))
        self._unfinished = (move, {s.id: unfinished[s.id] for s in move.sessions})

    async def finish_unfinished(self) -> None:
        """Read again, for the sessions ``hold_unfinished`` found, from their handovers; before
        their runtimes may connect."""
        if self._unfinished is None:
            return
        move, handovers = self._unfinished
        self._unfinished = None
        if not handovers:
            self._sessions.adopted(move, {})
            return
        before: dict[int, list[Parcel]] = {}
        try:
            lanes = {room: n for row in await self._processes.all() for room, n in row.lanes}
            before = await self._read_again_from(handovers, lanes)
        except Exception:
            log.exception("reading the rooms again for unfinished handovers failed")
        finally:
            self._adopted(move, before, handovers)
        log.warning(
            "unfinished handovers read again",
            sessions=len(handovers),
            read_again=sum(len(p) for p in before.values()),
        )

    async def _read_again_from(
        self, handovers: dict[int, str], lanes: dict[str, int]
    ) -> dict[int, list[Parcel]]:
        """What the lanes carried for each session after the positions of its handover."""
        groups: dict[str, set[int]] = {}
        for session_id, handover in handovers.items():
            groups.setdefault(handover, set()).add(session_id)
        before: dict[int, list[Parcel]] = {}
        for handover, taken in groups.items():
            before |= await self._read_again(orjson.loads(handover)["positions"], taken, lanes)
        return before

    async def _read_again(
        self, positions: dict[str, str], taken: set[int], lanes: dict[str, int]
    ) -> dict[int, list[Parcel]]:
        """What the lanes carried for ``taken`` after ``positions``."""
        rooms = [
            await self._events_after(room, positions.get(room), n) for room, n in lanes.items()
        ]
        before: dict[int, list[Parcel]] = {}
        seen: dict[int, set[tuple[str, int]]] = {}
        # Each lane in its own order, the lanes interleaved in the homeserver's.
        for event in heapq.merge(*rooms, key=lambda e: e.get("origin_server_ts", 0)):
            try:
                routed = await carrier.decode_batch(
                    event.get("content"), self._bot.download, relayed=True
                )
            except carrier.CarrierError as exc:
                log.warning("unreadable lane event skipped", error=str(exc))
                continue
            for message in routed:
                sender = self._sessions.by_origin(message.sender.origin)
                targets = self._monitor.receivers(
                    message.to, sender.id if sender is not None else None
                ).sessions
                key = (message.sender.origin, message.oseq)
                for session_id in targets & taken:
                    if key in seen.setdefault(session_id, set()):
                        continue
                    seen[session_id].add(key)
                    before.setdefault(session_id, []).append(
                        Parcel(message.text, message.sender.origin, message.oseq)
                    )
        return before

    async def _events_after(
        self, room_id: str, position: str | None, start_n: int
    ) -> list[dict[str, Any]]:
        """The lane events of ``room_id`` after ``position``, or without one, numbered above
        ``start_n``; in the room's order."""
        if position is not None:
            found = await self._bot.context(room_id, position)
            if found is not None:
                return await self._forward(room_id, found.get("end"))
        events: list[dict[str, Any]] = []
        start: str | None = None
        while True:
            page = await self._bot.messages(
                room_id, start=start, direction="b", limit=PAGE, event_filter=self._filter
            )
            chunk = page["chunk"]
            done = not chunk
            for event in chunk:
                if event_number(event.get("content")) <= start_n:
                    done = True
                    break
                events.append(event)
            end = page.get("end")
            if done or not isinstance(end, str) or end == start:
                break
            start = end
        events.reverse()
        return events

    async def _forward(self, room_id: str, start: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        token = start if isinstance(start, str) else None
        while True:
            page = await self._bot.messages(
                room_id, start=token, direction="f", limit=PAGE, event_filter=self._filter
            )
            events.extend(page["chunk"])
            end = page.get("end")
            if not page["chunk"] or not isinstance(end, str) or end == token:
                return events
            token = end

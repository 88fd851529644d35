"""Taking over the sessions of a node process that is gone (killed, its machine lost, or
silent for longer than ``cluster.gone_after_seconds``).

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
from datetime import timedelta
from typing import Any

import structlog

from appservice.intent import Intent

from .. import carrier
from ..routing.federation import event_number
from ..routing_table import RoutingTable
from ..sessions.mailbox import Parcel
from ..sessions.registry import SessionRegistry
from ..storage.checkpoints import CheckpointStore
from ..storage.pending import PendingStore
from ..storage.processes import ProcessStore
from ..storage.sessions import SessionStore
from .sibling_lanes import SiblingLanes

log = structlog.get_logger(__name__)

PAGE = 100
CATCH_UP_SECONDS = 10.0


class TakeOver:
    def __init__(
        self,
        rows: SessionStore,
        processes: ProcessStore,
        checkpoints: CheckpointStore,
        pending: PendingStore,
        sessions: SessionRegistry,
        table: RoutingTable,
        bot: Intent,
        siblings: SiblingLanes,
        gone_after_seconds: float,
    ) -> None:
        self._rows = rows
        self._processes = processes
        self._checkpoints = checkpoints
        self._pending = pending
        self._sessions = sessions
        self._table = table
        self._bot = bot
        self._siblings = siblings
        self._gone_after = timedelta(seconds=gone_after_seconds)
        self._lock = asyncio.Lock()
        self._filter = {"types": [carrier.BATCH_EVENT], "senders": [bot.user_id]}

    async def __call__(self, holder: str) -> bool:
        """Take the sessions of ``holder`` if it is gone ("": sessions nobody holds); whether
        this process holds them now."""
        async with self._lock:
            processes = await self._processes.all()
            listed = {row.name: row for row in processes}
            if holder and holder in listed and ProcessStore.alive(listed[holder], self._gone_after):
                return False
            await self._take(holder, processes)
            return True

    async def _take(self, gone: str, processes: list[Any]) -> None:
        rows = await self._rows.take_over(gone)
        if not rows:
            return
        log.warning("taking over the sessions of a node process that is gone", process=gone)
        epoch = await self._checkpoints.next_start()
        stored = await self._pending.stored()
        sessions = self._sessions.adopt(rows, epoch, stored)
        taken = {session.id for session in sessions}
        # Every process's lanes, this one's too (registered before it takes anything over).
        lanes = {room: n for row in processes for room, n in row.lanes}
        before: dict[int, list[Parcel]] = {}
        try:
            before = await self._read_again(gone, taken, lanes)
            for row in processes:
                if row.name == gone:
                    for room, _n in row.lanes:
                        await self._siblings.catch_up(room, CATCH_UP_SECONDS)
        except Exception:
            # Not expected (the homeserver away for long): what the gone process had not
            # settled may be missing for these runtimes; their sessions go on.
            log.exception("reading the rooms again for taken sessions failed", process=gone)
        finally:
            self._sessions.adopted(sessions, before)
        log.warning(
            "sessions taken over",
            process=gone,
            sessions=len(sessions),
            read_again=sum(len(p) for p in before.values()),
        )

    async def _read_again(
        self, gone: str, taken: set[int], lanes: dict[str, int]
    ) -> dict[int, list[Parcel]]:
        """What the lanes carried for ``taken`` after the gone process's positions."""
        positions = await self._checkpoints.positions(process=gone)
        rooms = [
            await self._events_after(room, positions.get(room), n) for room, n in lanes.items()
        ]
        before: dict[int, list[Parcel]] = {}
        seen: dict[int, set[tuple[str, int]]] = {}
        # Each lane in its own order, the lanes interleaved in the homeserver's.
        for event in heapq.merge(*rooms, key=lambda e: e.get("origin_server_ts", 0)):
            try:
                routed = await carrier.decode_batch(event.get("content"), self._bot.download)
            except carrier.CarrierError as exc:
                log.warning("unreadable lane event skipped", error=str(exc))
                continue
            for message in routed:
                sender = self._sessions.by_origin(message.sender.origin)
                targets = self._table.destinations(
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

"""This node process among the domain's others: it registers the lanes it writes once they
are ready, keeps telling the others it is alive, and reads the lanes of every other process it
learns of (at its start, when one registers, and at each heartbeat, in case an announcement was
missed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog

from ..storage.processes import ProcessStore
from .sibling_lanes import SiblingLanes

log = structlog.get_logger(__name__)


class Membership:
    def __init__(
        self,
        store: ProcessStore,
        name: str,
        siblings: SiblingLanes,
        positions: dict[str, str],
        heartbeat_seconds: float,
        gone_after_seconds: float,
        take_over: Callable[[str], Awaitable[None]],
        on_struck: Callable[[], None],
        sends_on: bool = False,
    ) -> None:
        self._store = store
        # The federation process: it sends on to peer domains what every lane carries for
        # them, whoever's runtimes sent it, so it never skips what a lane holds.
        self._sends_on = sends_on
        self.name = name
        self._siblings = siblings
        self._positions = positions
        self._heartbeat = heartbeat_seconds
        self._gone_after = timedelta(seconds=gone_after_seconds)
        self._take_over = take_over
        # Another process took this one for gone and holds its sessions: it must stop now.
        self._on_struck = on_struck
        self._own_rooms: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._refreshing = asyncio.Lock()

    async def join(self, lanes: list[tuple[str, int]]) -> None:
        """Announce this process with its lanes (room id, last event number at start), then
        read the others' lanes and keep beating."""
        self._own_rooms = {room for room, _n in lanes}
        # A process new to the domain holds no session yet: nothing the others wrote before it
        # joined can be for it, so it reads their lanes from their current ends. Not so the
        # federation process: what the others' lanes took for peers while it was away (or
        # before it first started) is its to send on. "New" is also a process struck off while
        # it was down, whose row is gone.
        new = not self._sends_on and all(row.name != self.name for row in await self._store.all())
        await self._store.register(self.name, lanes)
        await self.refresh(from_end=new)
        self._task = asyncio.create_task(self._beat(), name="cluster-heartbeat")

    async def refresh(self, from_end: bool = False) -> None:
        """Follow the lanes of every process registered (alive or not: a process that is gone
        may have written events nobody here handled yet). A lane read for the first time is
        read from the event after the one its writer registered it with, or, ``from_end``,
        after its newest."""
        async with self._refreshing:
            for row in await self._store.all():
                if row.name == self.name:
                    continue
                for room_id, start_n in row.lanes:
                    if room_id in self._own_rooms or room_id in self._siblings.rooms:
                        continue
                    position = self._positions.get(room_id)
                    after = start_n
                    if position is None and from_end:
                        after = await self._siblings.newest_number(room_id)
                    self._siblings.follow(room_id, row.name, position, after)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat)
            try:
                if not await self._store.heartbeat(self.name):
                    log.critical("another node process took this one for gone; stopping")
                    self._on_struck()
                    return
                await self.refresh()
                await self._take_from_the_gone()
            except Exception as exc:  # noqa: BLE001 - the database away: beat again later
                log.warning("cluster heartbeat failed", error=repr(exc))

    async def _take_from_the_gone(self) -> None:
        """Sessions of a process that is gone need a holder even if their runtimes stay away:
        what is sent to them is kept, and they expire."""
        for row in await self._store.all():
            if row.name != self.name and not ProcessStore.alive(row, self._gone_after):
                await self._take_over(row.name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

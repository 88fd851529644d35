"""The domain's other node processes as a feature of the core: their lanes are read here, what
they change in the routing state reaches this process's table, and a process taken for gone has
its sessions taken over."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from ..core import Core
from ..core.state import load_routes
from ..retry import Backoff, retry
from ..storage.processes import ProcessStore
from .membership import Membership
from .shared_routes import SharedRoutes
from .sibling_lanes import SiblingLanes
from .takeover import TakeOver

log = structlog.get_logger(__name__)


class ClusterFeature:
    def __init__(self, on_struck: Callable[[], None]) -> None:
        # Another process of the domain took this one for gone and holds its sessions: it
        # must not serve them a moment longer (node.py says how the process ends).
        self._on_struck = on_struck
        self.siblings: SiblingLanes | None = None
        self.processes: ProcessStore | None = None
        self.shared_routes: SharedRoutes | None = None
        self.membership: Membership | None = None
        self.take_over: TakeOver | None = None

    def attach(self, core: Core) -> None:
        process = core.process
        assert process is not None, "chosen only for a domain on several processes"
        self._core, self._process = core, process
        self.processes = ProcessStore(core.db)
        self.shared_routes = SharedRoutes(
            core.db,
            process,
            core.table,
            self._reload_shared_routes,
            self._processes_changed,
            self._hand_over,
        )
        hooks = core.hooks
        hooks.catch_up = self.shared_routes.caught_up
        hooks.take_sessions = self._take_sessions_of
        hooks.assembled.append(self._assembled)
        hooks.before_load.append(self._listen_first)
        hooks.sessions_loaded.append(self._hold_unfinished)
        hooks.lanes_started.append(self._join)

    def _assembled(self) -> None:
        core = self._core
        assert core.rooms.lane_reader is not None and self.processes is not None
        self.siblings = SiblingLanes(
            core.api.bot,
            core.rooms.lane_reader,
            core.delivery,
            core.settlement,
            core.metrics,
            self._own_lane_delivered,
        )
        self.take_over = TakeOver(
            core.session_rows,
            self.processes,
            core.checkpoints,
            core.pending,
            core.sessions,
            core.monitor,
            core.api.bot,
            self.siblings,
            core.config.cluster.gone_after_seconds,
            self._process,
            lambda: list(core.lanes or []),
        )

    def _own_lane_delivered(self, room_id: str) -> int | None:
        """The number of the last event of this process's lane ``room_id`` delivered, or None
        when the room is not one of its lanes."""
        for lane in self._core.lanes or ():
            if lane.room_id == room_id:
                return lane.delivered_number
        return None

    # -- the start ----------------------------------------------------------------------------

    async def _listen_first(self) -> None:
        """Listening before the state is read: no change falls between the two."""
        assert self.processes is not None and self.shared_routes is not None
        await self.processes.install_announcements()
        self.shared_routes.start()
        async with asyncio.timeout(self._core.config.homeserver.request_timeout_seconds):
            await self.shared_routes.listening.wait()

    async def _hold_unfinished(self) -> None:
        assert self.take_over is not None
        await self.take_over.hold_unfinished()

    async def _join(self, positions: dict[str, str]) -> None:
        """Runtimes only once the other processes' lanes are read from here: a lane read from
        its end (a process new to the domain) must not start after a message for a runtime
        this process already took."""
        await self._join_cluster(positions)
        assert self.take_over is not None
        await self.take_over.finish_unfinished()

    async def _join_cluster(self, positions: dict[str, str]) -> None:
        """Once this process's lanes are ready: announce them, and read the others'."""
        core = self._core
        assert core.lanes is not None and self.siblings is not None
        assert self.processes is not None
        cluster, federation = core.config.cluster, core.config.federation
        lanes = list(core.lanes)
        for lane in lanes:
            await lane.ready.wait()
        membership = Membership(
            self.processes,
            self._process,
            self.siblings,
            positions,
            cluster.heartbeat_seconds,
            cluster.gone_after_seconds,
            self._take_from_the_gone,
            self._on_struck,
            sends_on=federation.enabled and cluster.federates_here,
        )
        await retry(  # the database or homeserver may be away
            lambda: membership.join([(lane.room_id or "", lane.last_number) for lane in lanes]),
            Backoff(0.25, 5.0),
            on_retry=lambda exc, _delay: log.warning(
                "joining the domain's processes failed; retrying", error=repr(exc)
            ),
        )
        self.membership = membership

    # -- while running ------------------------------------------------------------------------

    async def _reload_shared_routes(self) -> None:
        """The other processes' part of the routing table, read again whole (what they
        changed while this process did not listen was not heard)."""
        core = self._core

        def elsewhere(session_id: int) -> bool:
            return core.sessions.get(session_id) is None

        for session_id in core.table.sessions():
            if elsewhere(session_id):
                core.table.remove_session(session_id)
        await load_routes(core, elsewhere)

    async def _take_sessions_of(self, holder: str, runtime_url: str) -> bool:
        """Until this process has joined, its lanes are not listed with the others, and the
        reading again of a take-over would miss them: the runtime connects again later."""
        assert self.take_over is not None
        return self.membership is not None and await self.take_over(holder, runtime_url)

    async def _take_from_the_gone(self, holder: str) -> None:
        assert self.take_over is not None
        await self.take_over.gone(holder)

    def _hand_over(self, runtime_url: str, to: str) -> None:
        assert self.take_over is not None
        if self._core.running:
            self._core.spawn(self.take_over.give(runtime_url, to))

    async def _processes_changed(self) -> None:
        if self.membership is not None:
            await self.membership.refresh()

    async def start(self) -> None:
        """Nothing more: the process joined the others as its lanes started (``_join``)."""

    async def stop(self) -> None:
        if self.membership is not None:
            await self.membership.close()
        if self.siblings is not None:
            await self.siblings.close()
        if self.take_over is not None:
            await self.take_over.close()
        if self.shared_routes is not None:
            await self.shared_routes.close()

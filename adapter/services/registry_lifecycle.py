"""What changes a registration's status besides requests: its runtime's presence, and time.

``RegistryPresence`` is called by the node from the session lifecycle; ``RegistryExpiry`` is a
periodic task. Both publish every status change they make through the same notifier as the
registry's requests. Neither raises into its caller: the registry is secondary to the sessions
and the event loop they share.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from ..storage.registry_store import RegistryStore, StatusChange
from .registry_backend import StatusNotifier
from .registry_entries import RegistryEntries

log = structlog.get_logger(__name__)


class RegistryPresence:
    """Registrations follow the runtime that made them (``Entry.owner``, its runtimeURL).

    A runtime away — its socket dropped, or its session ended — for ``delay_seconds`` has its
    registrations marked disconnected; one that comes back (the same runtimeURL, in any
    session: a reload, a reconnect) finds what it registered live again, as long as the grace
    period has not removed it. Coming back within the delay changes nothing: reTHINK's
    runtimes reload and reconnect all the time, and dev-registry-domain, whose answers the
    runtimes expect, changes a status only when the runtime says so or its lease ends."""

    def __init__(
        self, store: RegistryStore, notifier: StatusNotifier, delay_seconds: float = 0.0
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._delay = delay_seconds
        self._away: dict[str, asyncio.Task[None]] = {}

    async def runtime_away(self, runtime_url: str) -> None:
        """The runtime's connection dropped, or its session ended."""
        if self._delay <= 0:
            await self._apply("away", runtime_url, self._store.detach)
            return
        if runtime_url not in self._away:
            self._away[runtime_url] = asyncio.create_task(self._away_later(runtime_url))

    async def _away_later(self, runtime_url: str) -> None:
        await asyncio.sleep(self._delay)
        self._away.pop(runtime_url, None)
        await self._apply("away", runtime_url, self._store.detach)

    async def runtime_back(self, runtime_url: str) -> None:
        """A connection of the runtime is attached (a resumed or a new session)."""
        pending = self._away.pop(runtime_url, None)
        if pending is not None:
            pending.cancel()  # back within the delay: nothing changed
            return
        await self._apply("back", runtime_url, self._store.resume)

    async def stop(self) -> None:
        """A stop of the node is not the runtimes going away: nothing pending is applied."""
        for task in self._away.values():
            task.cancel()
        self._away.clear()

    async def _apply(
        self,
        event: str,
        runtime_url: str,
        operation: Callable[[str], Awaitable[list[StatusChange]]],
    ) -> None:
        try:
            changes = await operation(runtime_url)
        except Exception:  # logged; the session goes on regardless
            log.exception("registry_presence_failed", runtime=runtime_url, change=event)
            return
        if changes:
            log.info("registry_presence", runtime=runtime_url, change=event, entries=len(changes))
        await self._notifier.publish(changes)


class RegistryExpiry:
    """Every ``interval_seconds``: registrations past their lifetime become disconnected, and
    those disconnected for longer than the grace period are removed."""

    def __init__(
        self,
        store: RegistryStore,
        notifier: StatusNotifier,
        interval_seconds: float,
        entries: RegistryEntries | None = None,
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None
        # The entries each client holds, read back after every round (registry_entries.py).
        self._entries = entries

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="registry-expiry")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sweep_once(self) -> tuple[int, int]:
        """One round; returns (entries disconnected, entries removed)."""
        changes, removed = await self._store.sweep()
        await self.recount()
        await self._notifier.publish(changes)
        if changes or removed:
            log.info("registry_expiry", disconnected=len(changes), removed=removed)
        return len(changes), removed

    async def recount(self) -> None:
        if self._entries is not None:
            self._entries.recount(await self._store.owners())

    async def _run(self) -> None:
        try:
            await self.recount()  # what the database holds from before this start
        except Exception:  # the first sweep tries again
            log.exception("registry_recount_failed")
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.sweep_once()
            except Exception:  # the next round tries again
                log.exception("registry_expiry_failed")

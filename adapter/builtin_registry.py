"""The built-in domain registry as a feature of the core: answered from the node's database
when no external registry is configured (services/registry_builtin.py builds it)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from .bounds import Bound
from .core import Core
from .services.registry_builtin import BuiltinRegistry, build_builtin_registry
from .services.registry_entries import RegistryEntries
from .sessions.session import Session


class RegistryFeature:
    def __init__(self) -> None:
        self.registry: BuiltinRegistry | None = None

    def attach(self, core: Core) -> None:
        self._core = core
        self.registry = registry = build_builtin_registry(
            core.config.registry,
            core.db,
            self._status_changed,
            monitor=core.monitor,
            claim=lambda who, address: core.allocation.claim(who, address),
            entries=self._entries(core),
            client_of=core.client_of,
        )
        assert registry is not None, "chosen only when the built-in registry is configured"
        core.hooks.registry_service = registry.service
        core.hooks.claim_in_use = registry.backend.claim_in_use
        core.hooks.appservice_routes.append(self._add_routes)
        self._follow_presence(registry)

    @staticmethod
    def _entries(core: Core) -> RegistryEntries:
        """Entries bounded per client and in total, each owner's counted under the client of
        its claim's sessions (registry_entries.py)."""
        settings = core.config.registry.builtin
        return RegistryEntries(
            Bound(
                "registry_entries",
                settings.entries_per_client,
                settings.entries_total,
                core.metrics.bound_refused,
            ),
            lambda: {s.claim: s.client for s in core.sessions},
        )

    async def _status_changed(self, url: str, status: str) -> None:
        await self._core.publisher.registration_status(url, status)

    def _follow_presence(self, registry: BuiltinRegistry) -> None:
        """Registrations follow their runtime's connection. A stop of the node itself is not
        the runtimes going away: they reconnect to the next run."""
        presence, core = registry.presence, self._core
        lifecycle = core.lifecycle

        def when_running(
            hook: Callable[[str], Coroutine[Any, Any, None]],
        ) -> Callable[[Session], None]:
            return lambda s: core.spawn(hook(s.claim)) if core.running else None

        lifecycle.detached.append(when_running(presence.runtime_away))
        lifecycle.attached.append(when_running(presence.runtime_back))
        lifecycle.released.append(when_running(presence.runtime_away))

    def _add_routes(self, app: web.Application) -> None:
        """Its REST API, and it starts (as the appservice's listener is set up)."""
        assert self.registry is not None
        if self.registry.rest_api is not None:
            self.registry.rest_api.add_routes(app)
        self.registry.start()

    async def start(self) -> None:
        """Started with the appservice's listener (``_add_routes``)."""

    async def stop(self) -> None:
        assert self.registry is not None
        await self.registry.stop()

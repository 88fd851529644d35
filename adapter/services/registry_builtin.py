"""The built-in domain registry as an MN service, and everything it is made of, built from
configuration.

The service is the relay's message -> REST mapping composed with the in-process back end
instead of an HTTP call: ``domain_call`` -> ``BuiltinRegistryBackend.call`` -> ``domain_reply``.
So a runtime gets, code for code and value for value, the answer the relay would bring back
from an external dev-registry-domain holding the same registrations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import structlog

from ..config import DomainRegistryConfig
from ..envelope import Message
from ..storage.clock import utcnow
from ..storage.database import Database
from ..storage.registry_store import RegistryStore, StatusChange
from .base import Requester, ServiceReply
from .registry_backend import (
    BuiltinRegistryBackend,
    RegistryBackend,
    StatusCallback,
    StatusNotifier,
)
from .registry_domain import BadRegistryRequest, domain_call, domain_reply
from .registry_fields import Lifetimes
from .registry_lifecycle import RegistryExpiry, RegistryPresence
from .registry_rest import REST_PREFIX, RegistryRestApi

log = structlog.get_logger(__name__)


class BuiltinDomainRegistry:
    """``domain://registry.<domain>`` answered by a ``RegistryBackend`` in process. Writes are
    attributed to the requesting runtime (presence follows it, and only it may change what it
    registered); its verified identity is the user it registers hyperties under."""

    def __init__(self, backend: RegistryBackend) -> None:
        self._backend = backend

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        try:
            call = domain_call(message)
        except BadRegistryRequest as bad:
            return ServiceReply(bad.code, desc=bad.desc)
        except Exception:  # a mapping bug must cost one answer, not the session
            log.exception("builtin_registry_failed", id=message.id)
            return ServiceReply(500, desc="domain registry failed")
        changes: list[StatusChange] = []
        answer = await self._backend.call(
            call, runtime=requester.runtime_url, identity=requester.identity, changes=changes
        )
        reply = domain_reply(call, answer)
        if not changes:
            return reply
        backend = self._backend
        return dataclasses.replace(reply, then=lambda: backend.publish(changes))


@dataclass(frozen=True, slots=True)
class BuiltinRegistry:
    """What the node wires: ``service`` for ``domain://registry.<d>``, ``presence`` for the
    session lifecycle, ``expiry`` to start and stop with the node, ``rest_api`` (None when
    off) to add to the appservice listener."""

    service: BuiltinDomainRegistry
    backend: BuiltinRegistryBackend
    presence: RegistryPresence
    expiry: RegistryExpiry
    rest_api: RegistryRestApi | None

    def start(self) -> None:
        self.expiry.start()

    async def stop(self) -> None:
        await self.presence.stop()
        await self.expiry.stop()


def build_builtin_registry(
    config: DomainRegistryConfig,
    db: Database,
    on_status_change: StatusCallback | None,
    *,
    clock: Callable[[], datetime] = utcnow,
    rest_prefix: str = REST_PREFIX,
) -> BuiltinRegistry | None:
    """The built-in registry, or None when an external one is configured (or it is disabled)."""
    if not config.uses_builtin:
        return None
    settings = config.builtin
    store = RegistryStore(db, grace_seconds=settings.disconnected_grace_seconds, clock=clock)
    notifier = StatusNotifier(on_status_change)
    backend = BuiltinRegistryBackend(
        store, notifier, Lifetimes(settings.lifetime_seconds, settings.max_lifetime_seconds)
    )
    rest_api = None
    if settings.rest_api != "off":
        rest_api = RegistryRestApi(
            backend, writable=settings.rest_api == "read-write", prefix=rest_prefix
        )
    return BuiltinRegistry(
        service=BuiltinDomainRegistry(backend),
        backend=backend,
        presence=RegistryPresence(store, notifier, settings.presence_delay_seconds),
        expiry=RegistryExpiry(store, notifier, settings.sweep_interval_seconds),
        rest_api=rest_api,
    )

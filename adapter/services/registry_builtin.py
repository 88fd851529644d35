"""The built-in domain registry as an MN service, and everything it is made of, built from
configuration.

The service is the relay's message -> REST mapping composed with the in-process back end
instead of an HTTP call: ``domain_call`` -> ``BuiltinRegistryBackend.call`` -> ``domain_reply``.
So a runtime gets, code for code and value for value, the answer the relay would bring back
from an external dev-registry-domain holding the same registrations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import structlog

from ..access import AccessMonitor, Claim, Refusal, no_claims
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
    Writer,
)
from .registry_domain import BadRegistryRequest, domain_call, domain_reply
from .registry_entries import RegistryEntries
from .registry_fields import Lifetimes
from .registry_http import RestCall
from .registry_lifecycle import RegistryExpiry, RegistryPresence
from .registry_rest import REST_PREFIX, RegistryRestApi

log = structlog.get_logger(__name__)


class BuiltinDomainRegistry:
    """``domain://registry.<domain>`` answered by a ``RegistryBackend`` in process. Writes are
    attributed to the requesting runtime's credential (presence follows it, and only it may
    change what it registered); its verified identity is the user it registers hyperties
    under. What it may register at all, the reference monitor decides."""

    def __init__(
        self,
        backend: RegistryBackend,
        monitor: AccessMonitor | None = None,
        claim: Callable[[Requester, str], Awaitable[Refusal | None]] = no_claims,
        entries: RegistryEntries | None = None,
        client_of: Callable[[int], str] = lambda _session: "",
    ) -> None:
        # Entries per client and in total: a creation takes a place first (registry_entries).
        self._entries = entries
        self._client_of = client_of
        self._backend = backend
        self._monitor = monitor
        # Allocates a self-made address a runtime registers (access.py, "Claim").
        self._claim = claim

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        try:
            call = domain_call(message)
        except BadRegistryRequest as bad:
            return ServiceReply(bad.code, desc=bad.desc)
        except Exception:  # a mapping bug must cost one answer, not the session
            log.exception("builtin_registry_failed", id=message.id)
            return ServiceReply(500, desc="domain registry failed")
        refused = await self._refusal(call, requester)
        if refused is not None:
            return ServiceReply(refused.code, desc=refused.reason)
        changes: list[StatusChange] = []
        if requester.claim is None and call.method != "GET":
            # Only a runtime's credential owns entries (a peer domain's runtime reads only).
            return ServiceReply(403, desc="only a runtime of this domain writes to its registry")
        writer = Writer(requester.runtime_url, requester.claim or "", requester.identity)
        entries = self._entries if _creates(call) and requester.claim else None
        if entries is not None:
            client = self._client_of(requester.session_id)
            if entries.refusal(writer.claim, client) is not None and await self._backend.holds(
                call, writer.claim
            ):
                # Its own entry registered again (a reloaded runtime): nothing more is held.
                entries = None
            elif (bounded := entries.take(writer.claim, client)) is not None:
                return ServiceReply(bounded.code, desc=bounded.reason)
        created: list[str] = []
        try:
            answer = await self._backend.call(call, writer=writer, changes=changes, created=created)
        finally:
            if entries is not None and not created:
                entries.give(writer.claim)
        reply = domain_reply(call, answer)
        if not changes:
            return reply
        backend = self._backend
        return dataclasses.replace(reply, then=lambda: backend.publish(changes))

    async def _refusal(self, call: RestCall, requester: Requester) -> Refusal | None:
        """The monitor's word on what a write names: a registration (creation) of an address
        the runtime was allocated (or claims), and, in a creation or an update, its own
        runtimeURL as the entry's runtime and its own hyperty as an object's reporter."""
        monitor = self._monitor
        if monitor is None or call.method != "PUT":
            return None
        match call.segments:
            case ("hyperty", "user", _, url) | ("hyperty", "dataobject", url):
                creation = True
            case ("hyperty", "url", url) | ("dataobject", "url", url):
                creation = False
            case _:
                return None
        fields = _fields(call)
        runtime, reporter = fields.get("runtime"), fields.get("reporter")
        if creation:
            verdict = monitor.register(
                requester, url, runtime if isinstance(runtime, str) else None
            )
            if isinstance(verdict, Claim):
                verdict = await self._claim(requester, verdict.address)
            if verdict is not None:
                return verdict
        elif runtime is not None and runtime != requester.runtime_url:
            return Refusal(403, f"a runtime registers under its own runtimeURL, not {runtime}")
        if reporter is None or monitor.holder(reporter) == requester.session_id:
            return None
        verdict = monitor.register(requester, reporter, None) if isinstance(reporter, str) else None
        if isinstance(verdict, Claim):
            return await self._claim(requester, verdict.address)
        return Refusal(403, f"{reporter!r} is not a hyperty of this runtime's")


def _creates(call: RestCall) -> bool:
    """Whether ``call`` registers an entry (a hyperty or a data object), new or again."""
    return call.method == "PUT" and call.segments[:2] in (
        ("hyperty", "user"),
        ("hyperty", "dataobject"),
    )


def _fields(call: RestCall) -> dict[str, Any]:
    try:
        body = orjson.loads(call.body or b"null")
    except orjson.JSONDecodeError:
        return {}  # the back end answers 400
    return body if isinstance(body, dict) else {}


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
    monitor: AccessMonitor | None = None,
    claim: Callable[[Requester, str], Awaitable[Refusal | None]] = no_claims,
    clock: Callable[[], datetime] = utcnow,
    rest_prefix: str = REST_PREFIX,
    entries: RegistryEntries | None = None,
    client_of: Callable[[int], str] = lambda _session: "",
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
        service=BuiltinDomainRegistry(backend, monitor, claim, entries, client_of),
        backend=backend,
        presence=RegistryPresence(store, notifier, settings.presence_delay_seconds),
        expiry=RegistryExpiry(store, notifier, settings.sweep_interval_seconds, entries),
        rest_api=rest_api,
    )

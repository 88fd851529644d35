"""Other reTHINK domains this node exchanges traffic with, and how to reach their nodes.

A reTHINK domain is served by one homeserver. A peer's is named in the configuration
(``federation.peers.<domain>.server_name``) or, when absent, is the domain itself, which must
then serve ``/.well-known/matrix/server`` (how Matrix finds a domain's homeserver). The peer's
node is its appservice's bot (``@_rethink_bot:<server name>`` unless configured). Only the
configured domains are peers: a message to any other domain is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

from ..addresses import domain_of as address_domain
from ..config import FederationConfig
from ..identity.model import ascii_lower
from ..routing.way_abroad import PeerRefused

__all__ = ["DEFAULT_BOT_LOCALPART", "Peer", "PeerRefused", "Peers", "well_known_url"]

DEFAULT_BOT_LOCALPART = "_rethink_bot"
# A failed discovery is tried again after this long, not on every message.
RETRY_DISCOVERY_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Peer:
    domain: str
    server_name: str
    bot: str
    # Whose identities its node may vouch for: its own domain's and these identity providers'.
    vouches_for: frozenset[str] = frozenset()
    max_subscriptions: int = 100_000
    max_rooms: int = 16
    max_origins: int = 10_000
    origin_idle_seconds: float = 3600.0


def well_known_url(domain: str) -> str:
    return f"https://{domain}/.well-known/matrix/server"


class Peers:
    def __init__(
        self,
        config: FederationConfig,
        local_domain: str,
        http: aiohttp.ClientSession,
        discovery_url: Callable[[str], str] = well_known_url,
    ) -> None:
        self._config = config
        self._local = ascii_lower(local_domain)
        self._http = http
        self._discovery_url = discovery_url
        self._known: dict[str, Peer] = {}
        self._failed: dict[str, tuple[float, PeerRefused]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        for domain, peer in config.peers.items():
            if peer.server_name is not None:
                self._known[domain] = self._peer(domain, peer.server_name)

    @property
    def enabled(self) -> bool:
        return self._config.enabled

    def _peer(self, domain: str, server_name: str) -> Peer:
        config = self._config.peers[domain]
        return Peer(
            domain,
            server_name,
            config.bot or f"@{DEFAULT_BOT_LOCALPART}:{server_name}",
            frozenset(ascii_lower(d) for d in (domain, *config.identity_providers)),
            config.max_subscriptions,
            config.max_rooms,
            config.max_origins,
            config.origin_idle_seconds,
        )

    def remote_domain(self, address: str) -> str | None:
        """The address's domain when it is not this node's own."""
        domain = address_domain(address)
        return domain if domain is not None and domain != self._local else None

    def known(self) -> list[Peer]:
        return list(self._known.values())

    def configured(self) -> list[Peer]:
        """Every peer of the allow list, with its bounds (a peer found by discovery named by its
        domain until it is resolved)."""
        return [
            self._known.get(domain) or self._peer(domain, domain) for domain in self._config.peers
        ]

    def by_bot(self, user_id: str) -> Peer | None:
        """The peer whose node acts as ``user_id`` (an inviter, a room's writer)."""
        return next((p for p in self._known.values() if p.bot == user_id), None)

    async def resolve(self, domain: str) -> Peer:
        """How to reach ``domain``'s node; raises PeerRefused."""
        peer = self._known.get(domain)
        if peer is not None:
            return peer
        if domain not in self._config.peers:
            raise PeerRefused(403, f"{domain} is not a domain this node exchanges traffic with")
        failed = self._failed.get(domain)
        if failed is not None and time.monotonic() - failed[0] < RETRY_DISCOVERY_SECONDS:
            raise failed[1]
        lock = self._locks.setdefault(domain, asyncio.Lock())
        async with lock:
            if (peer := self._known.get(domain)) is not None:
                return peer
            try:
                await self._discover(domain)
            except PeerRefused as refused:
                self._failed[domain] = (time.monotonic(), refused)
                raise
            peer = self._known[domain] = self._peer(domain, domain)
            self._failed.pop(domain, None)
            return peer

    async def _discover(self, domain: str) -> None:
        """The domain serves Matrix: its .well-known names a homeserver (delegation, which the
        homeserver follows itself); the server name is the domain."""
        timeout = aiohttp.ClientTimeout(total=self._config.discovery_timeout_seconds)
        try:
            async with self._http.get(self._discovery_url(domain), timeout=timeout) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PeerRefused(504, f"the homeserver of {domain} cannot be found: {exc}") from None
        if status != 200:
            raise PeerRefused(404, f"{domain} serves no Matrix homeserver (HTTP {status})")
        try:
            server = orjson.loads(body).get("m.server")
        except (orjson.JSONDecodeError, AttributeError):
            server = None
        if not isinstance(server, str) or not server:
            raise PeerRefused(404, f"{domain} serves no Matrix homeserver (no m.server)")

"""Building the registry connector services (domain registry, global registry) from
configuration, and the answer for an MN address that names no service."""

from __future__ import annotations

import aiohttp

from ..config import NodeConfig
from ..envelope import Message
from .base import MnService, Requester, ServiceReply
from .registry import DomainRegistryConnector, GlobalRegistryConnector


class UnknownService:
    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        return ServiceReply(404, desc=f"no MN service at {message.to_first}")


def build_connectors(
    config: NodeConfig, http: aiohttp.ClientSession, builtin_registry: MnService | None = None
) -> tuple[MnService, MnService, MnService]:
    """(domain registry, global registry, unknown MN address). The domain registry is
    ``builtin_registry`` when given (see registry_builtin.build_builtin_registry, which builds
    one only while no registry URL is configured), else the relay; an unconfigured relay
    answers 503 by itself."""
    registry = builtin_registry or DomainRegistryConnector(
        config.registry.url, http, config.registry.timeout_seconds
    )
    global_registry = GlobalRegistryConnector(
        config.global_registry.url, http, config.global_registry.timeout_seconds
    )
    return registry, global_registry, UnknownService()

"""Building the connector services (domain registry, global registry, IdM) from configuration,
and the answer for an MN address that names no service."""

from __future__ import annotations

import aiohttp

from ..config import NodeConfig
from ..messages import Message
from .base import MnService, Requester, ServiceReply
from .registry import DomainRegistryConnector, GlobalRegistryConnector, IdmConnector


class UnknownService:
    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        return ServiceReply(404, desc=f"no MN service at {message.to_first}")


def build_connectors(
    config: NodeConfig, http: aiohttp.ClientSession
) -> tuple[MnService, MnService, MnService, MnService]:
    """(domain registry, global registry, IdM, unknown MN address); an unconfigured registry
    answers 503 by itself."""
    registry = DomainRegistryConnector(config.registry.url, http, config.registry.timeout_seconds)
    global_registry = GlobalRegistryConnector(
        config.global_registry.url, http, config.global_registry.timeout_seconds
    )
    return registry, global_registry, IdmConnector(), UnknownService()

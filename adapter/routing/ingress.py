"""Where a runtime's message is decided.

Every frame a stub sends that is a reTHINK message comes here, and one of three things happens:
- it is for an MN service (allocation, subscription manager, registry, global registry, IdM):
  the service answers directly, without waiting for Matrix, and the exchange is journalled;
- it has destinations: it goes to the sender's outbox, and so through Matrix (delivery happens
  when the homeserver pushes the event back, see ``delivery.py``);
- it is refused (bad header 400, policy 403/429, unknown destination 404, backlog 503): the
  sender gets an error response at once and the refusal is journalled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ..messages import InvalidMessage, Message, answer, check_header, control_error, response
from ..observability import NodeMetrics
from ..policy import PolicyEngine
from ..services.base import MnService, Requester
from ..services.registry import (
    GLOBAL_REGISTRY_ADDRESS,
    domain_registry_address,
    idm_address,
    is_service_address,
)
from ..storage.routes import RouteStore
from ..stub.connection import StubConnection
from .carrier import Outgoing
from .journal import Journal
from .stream import BatchStream
from .table import RoutingTable

log = structlog.get_logger(__name__)


class ServiceDirectory:
    """Which MN service an address belongs to, if any."""

    def __init__(self, domain: str) -> None:
        self._msg_node = f"domain://msg-node.{domain}/"
        self._registry = domain_registry_address(domain)
        self._idm = idm_address(domain)
        self._endpoints: dict[str, MnService] = {}
        self._registry_service: MnService | None = None
        self._global_service: MnService | None = None
        self._idm_service: MnService | None = None
        self._unknown: MnService | None = None

    def add_endpoint(self, name: str, service: MnService) -> None:
        """A service at ``domain://msg-node.<domain>/<name>``."""
        self._endpoints[name] = service

    def set_connectors(
        self, registry: MnService, global_registry: MnService, idm: MnService, unknown: MnService
    ) -> None:
        self._registry_service = registry
        self._global_service = global_registry
        self._idm_service = idm
        self._unknown = unknown

    def lookup(self, address: str) -> MnService | None:
        if address.startswith(self._msg_node):
            return self._endpoints.get(address[len(self._msg_node) :].strip("/"), self._unknown)
        if is_service_address(address, self._registry):
            return self._registry_service
        if is_service_address(address, GLOBAL_REGISTRY_ADDRESS):
            return self._global_service
        if is_service_address(address, self._idm):
            return self._idm_service
        return None


class Ingress:
    def __init__(
        self,
        table: RoutingTable,
        services: ServiceDirectory,
        outbox_for: Callable[[Any], BatchStream[Outgoing]],
        journal: Journal,
        routes: RouteStore,
        policy: PolicyEngine,
        metrics: NodeMetrics,
        backpressure_timeout: float = 10.0,
    ) -> None:
        self._table = table
        self._services = services
        self._outbox_for = outbox_for
        self._journal = journal
        self._routes = routes
        self._policy = policy
        self._metrics = metrics
        self._backpressure_timeout = backpressure_timeout

    async def on_message(
        self, session: Any, connection: StubConnection, raw: str, parsed: dict[str, Any]
    ) -> None:
        try:
            message = check_header(raw, parsed)
        except InvalidMessage as exc:
            await self.refuse_frame(session, connection, raw, exc)
            return
        denial = self._policy.check(session.id, message)
        if denial is not None:
            await self._refuse(session, connection, message, denial.code, denial.reason)
            return

        service = self._services.lookup(message.to_first)
        if service is not None:
            if message.type == "response":
                # The MN sends no requests, so a response to one of its services answers nothing.
                self._metrics.messages_in.labels("response_to_service").inc()
                return
            await self._serve(service, session, connection, message)
            return

        if self._table.learn(session.id, message.from_):
            await self._routes.learn(session.id, message.from_)
        destinations = self._table.destinations(message.to, session.id)
        if not destinations.known:
            if message.type == "response":
                # Answering a response would start a loop of error answers; count and drop.
                self._metrics.messages_in.labels("unroutable_response").inc()
                return
            await self._refuse(
                session, connection, message, 404, f"no route to {' '.join(message.to)}"
            )
            return

        outbox = self._outbox_for(session)
        # A sender faster than the homeserver is slowed down, not refused: while this waits,
        # the node reads no further frame from this stub, and TCP holds the sender back. Only a
        # homeserver that stays unable to take the runtime's messages gets it a 503.
        if not outbox.has_room_for(len(raw)) and not await outbox.wait_for_room(
            len(raw), self._backpressure_timeout
        ):
            await self._refuse(
                session,
                connection,
                message,
                503,
                "the node is waiting for the homeserver; retry later",
            )
            return
        outbox.push(Outgoing(raw, message.to))
        self._metrics.messages_in.labels("routed").inc()

    async def _serve(
        self, service: MnService, session: Any, connection: StubConnection, message: Message
    ) -> None:
        try:
            reply = await service.handle(message, Requester(session.id, session.runtime_url))
        except Exception:
            log.exception("MN service failed", to=message.to_first, type=message.type)
            await self._refuse(session, connection, message, 500, "internal error in the MN")
            return
        text = answer(message, reply.code, value=reply.value, desc=reply.desc, extra=reply.extra)
        await connection.send(text)
        self._journal.service(session.runtime_url, message.raw, text, reply.affected)
        self._metrics.messages_in.labels("service").inc()

    async def _refuse(
        self, session: Any, connection: StubConnection, message: Message, code: int, reason: str
    ) -> None:
        text = answer(message, code, desc=reason)
        await connection.send(text)
        self._journal.rejected(session.runtime_url, message.raw, text)
        self._metrics.messages_in.labels(f"refused_{code}").inc()

    async def refuse_frame(
        self, session: Any, connection: StubConnection, raw: str | None, exc: InvalidMessage
    ) -> None:
        """A frame that is not a usable message: answer as a reTHINK response when it says who
        sent it, else with a control frame."""
        partial = exc.partial or {}
        sender = partial.get("from")
        if isinstance(sender, str) and sender:
            to = partial.get("to")
            origin = (
                to
                if isinstance(to, str) and to
                else (to[0] if isinstance(to, list) and to and isinstance(to[0], str) else "")
            )
            text = response(sender, origin, partial.get("id"), exc.code, desc=exc.reason)
        else:
            text = control_error(exc.code, exc.reason)
        await connection.send(text)
        self._journal.rejected(session.runtime_url if session else "", raw, text)
        self._metrics.messages_in.labels(f"refused_{exc.code}").inc()

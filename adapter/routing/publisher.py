"""Messages the node itself publishes to subscribers (a registration's status), routed like any
runtime's message: through a lane, so the room history holds them too, delivered to every
session subscribed to the address they are sent to, and once to each peer domain following it."""

from __future__ import annotations

from typing import Any, Protocol

import structlog

from ..access import AccessMonitor
from ..carrier import Routed, Sender
from ..envelope import dumps
from ..sessions.mailbox import EPOCH_SHIFT
from .lanes import Outbox, Outboxes, Outgoing
from .way_abroad import PeerRefused

log = structlog.get_logger(__name__)

# The origin of the node's own messages (never a session key: those are 16 hex digits).
NODE_ORIGIN = "mn.node"


def node_origin(process: str | None) -> str:
    """The origin of the node's own messages; each of a domain's processes numbers its own."""
    return NODE_ORIGIN if process is None else f"{NODE_ORIGIN}-{process}"


class PeerLinks(Protocol):
    async def link(self, domain: str) -> Outbox:
        """The stream to a peer domain; raises PeerRefused."""
        ...


class Publisher:
    def __init__(
        self,
        outboxes: Outboxes,
        sender: Sender,
        monitor: AccessMonitor,
        peers: PeerLinks | None = None,
    ) -> None:
        self._outboxes = outboxes
        self._sender = sender
        self._monitor = monitor
        self._peers = peers
        self._number = 0

    def begin(self, epoch: int) -> None:
        """Number from the node's start count up, so the numbers never repeat across restarts
        (a receiving stub drops a number it has seen from this origin)."""
        self._number = epoch << EPOCH_SHIFT

    def next_id(self) -> int:
        return self._number + 1

    def _numbered(self, text: str, to: tuple[str, ...]) -> Routed:
        self._number += 1
        return Routed(text, to, self._sender, self._number)

    def outgoing(self, text: str, to: tuple[str, ...]) -> Outgoing:
        """``text`` numbered as the node's own message, ready for an outbox."""
        return Outgoing(self._numbered(text, to), 0)

    def send(self, text: str, to: tuple[str, ...]) -> None:
        """``text`` as the node's own message, through its lane."""
        self._outboxes.for_node().push(self.outgoing(text, to))

    async def publish(self, from_: str, to: str, body: dict[str, Any]) -> None:
        text = dumps(
            {"id": f"mn-{self.next_id()}", "type": "update", "from": from_, "to": to, "body": body}
        )
        routed = self._numbered(text, (to,))
        self._outboxes.for_node().push(Outgoing(routed, 0))
        if self._peers is None:
            return
        for domain in sorted(self._monitor.receivers((to,), None).domains):
            try:
                link = await self._peers.link(domain)
            except PeerRefused as refused:
                log.warning("publication not sent to a peer", peer=domain, reason=refused.reason)
                continue
            link.push(Outgoing(routed, 0))

    async def registration_status(self, url: str, status: str) -> None:
        """The built-in registry's status change of ``url``, to the subscribers of
        ``<url>/registration`` (reTHINK's registration-status publication)."""
        await self.publish(url, f"{url}/registration", {"attribute": "status", "value": status})

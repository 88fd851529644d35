"""The ingress's way to other reTHINK domains, as the core sees it: a hook the federation feature
fills (adapter/federation/abroad.py). Nothing here knows how peers are reached; the core only
asks which domains a message goes to and where it leaves for them."""

from __future__ import annotations

from typing import Protocol

from ..access import AccessMonitor
from .lanes import Outbox

# The origins of what peers send this domain start so (federation/peer_traffic.peer_origin):
# never sent on.
PEER_ORIGIN_PREFIX = "peer:"


class PeerRefused(Exception):
    """No traffic to that domain: not on the allow list (403), no homeserver found (404), or
    its homeserver's discovery unreachable (504)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class PeerDirectory(Protocol):
    """Which domain an address belongs to when it is another reTHINK domain's."""

    def remote_domain(self, address: str) -> str | None:
        """The address's domain when it is not this node's own."""
        ...


def remote_domains(
    peers: PeerDirectory,
    monitor: AccessMonitor,
    to: tuple[str, ...],
    session_id: int | None,
    subscribed: frozenset[str],
) -> set[str]:
    """The peer domains a message goes to: those of addresses this domain has no route for
    itself, and ``subscribed``, those whose runtimes subscribed to one of its addresses (the
    monitor's ``receivers(to).domains``)."""
    found = set(subscribed)
    for address in to:
        domain = peers.remote_domain(address)
        if domain is not None and not monitor.receivers((address,), session_id).known:
            found.add(domain)
    return found


class Abroad(Protocol):
    """The ingress's way to other domains."""

    @property
    def peers(self) -> PeerDirectory:
        """The peer domains this node knows of."""
        ...

    async def outbox(self, domain: str) -> Outbox | None:
        """Where a message for ``domain`` goes besides the sender's lane, or None when the lane
        carries it there; raises PeerRefused (403, 404, 504)."""
        ...

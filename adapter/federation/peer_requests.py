"""What this domain's subscription manager asks of peer domains' nodes: to send it what is
published to streams there its runtimes subscribe to, or no longer. The federation process asks
them itself and waits for their answers (peer_traffic.py); the other processes of a domain on
several put the request in their lane, and the federation process sends it on (abroad.py)."""

from __future__ import annotations

from typing import Protocol

import orjson

from ..routing.publisher import Publisher
from .peers import Peers

# A peer's node asks to be sent what is published to these addresses, or not any more.
SUBSCRIBE, UNSUBSCRIBE = "subscribe", "unsubscribe"


def subscription_manager(domain: str) -> str:
    return f"domain://msg-node.{domain}/sm"


def subscription_request(
    request_id: str, local_domain: str, domain: str, kind: str, body: dict[str, object]
) -> str:
    """The request of this domain's subscription manager to ``domain``'s."""
    return orjson.dumps(
        {
            "id": request_id,
            "type": kind,
            "from": subscription_manager(local_domain),
            "to": subscription_manager(domain),
            "body": body,
        }
    ).decode()


def by_domain(peers: Peers, addresses: list[str]) -> dict[str, list[str]]:
    """Other domains' addresses among ``addresses``, by domain."""
    found: dict[str, list[str]] = {}
    for address in addresses:
        domain = peers.remote_domain(address)
        if domain is not None:
            found.setdefault(domain, []).append(address)
    return found


class PeerSubscriptions(Protocol):
    """What the subscription manager tells peers (peer_traffic.py ``PeerFeeds``, or below)."""

    async def subscription_changed(
        self, kind: str, addresses: list[str], runtime: str
    ) -> str | None:
        """A runtime (un)subscribed to other domains' streams; why a peer refused, or None."""
        ...

    def runtime_left(self, runtime: str, subscriptions: set[str]) -> None:
        """A runtime is gone: its subscriptions in other domains end too."""
        ...


class SubscriptionsThroughLanes:
    """A process of a domain on several that is not its federation process: its runtimes'
    subscriptions in other domains are asked through its lane. The runtime is answered once the
    request is on its way, without the peer's confirmation (only the federation process hears
    it); a peer's refusal is logged there."""

    def __init__(self, local_domain: str, peers: Peers, publisher: Publisher) -> None:
        self._local = local_domain
        self._peers = peers
        self._publisher = publisher

    def _ask(self, domain: str, kind: str, body: dict[str, object]) -> None:
        request_id = f"sub-{self._publisher.next_id()}"
        text = subscription_request(request_id, self._local, domain, kind, body)
        self._publisher.send(text, (subscription_manager(domain),))

    async def subscription_changed(
        self, kind: str, addresses: list[str], runtime: str
    ) -> str | None:
        for domain, resources in by_domain(self._peers, addresses).items():
            self._ask(domain, kind, {"resources": resources, "source": runtime})
        return None

    def runtime_left(self, runtime: str, subscriptions: set[str]) -> None:
        for domain in by_domain(self._peers, sorted(subscriptions)):
            self._ask(domain, UNSUBSCRIBE, {"source": runtime})

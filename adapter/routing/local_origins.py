"""Which of this domain's runtimes' sender ids (origins) this node keeps marks for.

A mark (the highest number delivered from an origin) lets the node drop a message a stub sends
twice. A runtime's session numbers its messages in an origin per stub instance (a reloaded
page starts a new one) and one for what the node numbers: a client that reconnects with a fresh
stub instance again and again, from many sessions, mints origins. So, as for a peer's senders
(federation/peer_origins.py), one client keeps at most ``per_client`` of them and the node
``total``; beyond either, the client's (or the node's) oldest goes, counted. An origin whose
sender is gone (a replaced stub instance, a released session; at a start, one of a session that
is no more) goes too, once the lanes are through with its last messages. What goes leaves
memory and the database; a message of a dropped origin that its stub sends again is delivered
again, the price of a bound a client cannot push. Origins of sessions this process does not
hold (another process of the domain holds them) count towards the total only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from .publisher import NODE_ORIGIN
from .way_abroad import PEER_ORIGIN_PREFIX

# Let go: the origins (their marks leave memory and the database).
Drop = Callable[[list[str]], None]


def is_local(origin: str) -> bool:
    """Whether ``origin`` is a runtime's of this domain (not a peer's sender, not the
    node's own numbering)."""
    return not origin.startswith((PEER_ORIGIN_PREFIX, NODE_ORIGIN))


class LocalOrigins:
    def __init__(
        self,
        client_of: Callable[[str], str],
        drop: Drop,
        per_client: int,
        total: int,
        count_refused: Callable[[str, str], None] = lambda _resource, _scope: None,
    ) -> None:
        self._client_of = client_of
        self._drop = drop
        self.per_client = per_client
        self.total = total
        self._count_refused = count_refused
        # Every origin kept, oldest first, with its client; and per client, the same.
        self._all: OrderedDict[str, str] = OrderedDict()
        self._by_client: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def held(self, client: str) -> int:
        return len(self._by_client.get(client, ()))

    def seen(self, origin: str) -> None:
        """``origin`` got its first mark: kept, and what goes beyond the bounds let go (never
        ``origin`` itself). Costs what goes, never the whole set."""
        if origin in self._all or not is_local(origin):
            return
        client = self._client_of(origin)
        self._keep(origin, client)
        gone: list[str] = []
        held = self._by_client.get(client)
        if client and held is not None:
            while len(held) > self.per_client:
                gone.append(self._forget(next(iter(held))))
                self._count_refused("marks", "client")
        while len(self._all) > self.total:
            gone.append(self._forget(next(iter(self._all))))
            self._count_refused("marks", "total")
        if gone:
            self._drop(gone)

    def restore(self, origins: Iterable[str]) -> None:
        """The local origins whose marks the database kept, as of a start: each under its
        session's client, held to the bounds."""
        for origin in origins:
            self.seen(origin)

    def gone(self, origins: list[str]) -> None:
        """Their senders are gone: let go, from memory and the database."""
        local = [origin for origin in origins if is_local(origin)]
        for origin in local:
            self._forget(origin)
        if local:
            self._drop(local)

    def _keep(self, origin: str, client: str) -> None:
        self._all[origin] = client
        if client:
            self._by_client.setdefault(client, OrderedDict())[origin] = None

    def _forget(self, origin: str) -> str:
        client = self._all.pop(origin, "")
        held = self._by_client.get(client)
        if held is not None:
            held.pop(origin, None)
            if not held:
                del self._by_client[client]
        return origin

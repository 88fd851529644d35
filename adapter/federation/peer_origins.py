"""Which of a peer domain's sender ids (origins) this node keeps marks for.

A mark (the highest number delivered from an origin) lets the node drop a message a peer's node
sends twice. The origins are the peer's to mint, one per message if it likes: so per peer at
most ``max_origins`` are kept, and beyond that the longest idle goes (counted); one idle for
``origin_idle_seconds`` goes too (its sender is gone: a peer's runtime that stops sends nothing
more from that origin). At a start, what the database kept is held to the same bound, and the
marks of domains that are no peers any more go. What goes leaves memory and the database
(``Settlement.drop``); a message of a dropped origin that its node sends again is delivered
again, the price of a bound a peer cannot push.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from ..routing.way_abroad import PEER_ORIGIN_PREFIX
from .peers import Peer

# Let go: the origins and the peer they belonged to (None: no peer any more).
Drop = Callable[[list[str], Peer | None], None]


class PeerOrigins:
    def __init__(
        self,
        prefix_of: Callable[[str], tuple[str, ...]],
        drop: Drop,
        count_refused: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # The spellings a peer's origins start with here (peer_traffic.peer_origin).
        self._prefix_of = prefix_of
        self._drop = drop
        self._count_refused = count_refused
        self._clock = clock
        # Per peer domain: origin -> when it last delivered, the longest idle first.
        self._by_domain: dict[str, OrderedDict[str, float]] = {}

    def held(self, domain: str) -> int:
        return len(self._by_domain.get(domain, ()))

    def seen(self, peer: Peer, origins: Iterable[str]) -> None:
        """``origins`` just delivered messages of ``peer``: kept, and what goes beyond the
        bounds let go. Costs what the event carried and what goes, never the whole set."""
        held = self._by_domain.setdefault(peer.domain, OrderedDict())
        now = self._clock()
        for origin in origins:
            held[origin] = now
            held.move_to_end(origin)
        gone: list[str] = []
        while len(held) > peer.max_origins:
            gone.append(held.popitem(last=False)[0])
        if gone:
            self._count_refused(len(gone))
        idle_since = now - peer.origin_idle_seconds
        while held and next(iter(held.values())) < idle_since:
            gone.append(held.popitem(last=False)[0])
        if gone:
            self._drop(gone, peer)

    def restore(self, peers: Iterable[Peer], origins: Iterable[str]) -> None:
        """The peer origins whose marks the database kept: each peer's up to its bound (as if
        all had just delivered); the rest, and those of domains no longer peers, let go."""
        prefixes = [(prefix, peer) for peer in peers for prefix in self._prefix_of(peer.domain)]
        strangers: list[str] = []
        found: dict[str, tuple[Peer, list[str]]] = {}
        for origin in origins:
            if not origin.startswith(PEER_ORIGIN_PREFIX):
                continue
            owner = next((peer for prefix, peer in prefixes if origin.startswith(prefix)), None)
            if owner is None:
                strangers.append(origin)
            else:
                found.setdefault(owner.domain, (owner, []))[1].append(origin)
        if strangers:
            self._drop(strangers, None)
        for peer, kept in found.values():
            self.seen(peer, kept)

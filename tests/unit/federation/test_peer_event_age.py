"""How old a peer domain's events are when this node handles them
(``rethink_mn_peer_event_age_seconds``): the peer's homeserver stamps them, so the stamp is the
peer's to choose, and no stamp may fail the feed."""

from __future__ import annotations

import time
from typing import Any, cast

from prometheus_client import CollectorRegistry

from adapter.carrier import MAX_NUMBER
from adapter.federation.peer_feed import PeerFeed
from adapter.federation.peers import Peer
from adapter.observability import NodeMetrics
from appservice.intent import Intent


async def _handled(_event: dict[str, Any], _deadline: float) -> None:
    return None


def feed() -> tuple[PeerFeed, CollectorRegistry]:
    registry = CollectorRegistry()
    peer = Peer("b.example", "hs.b.example", "@_rethink_bot:hs.b.example")
    bot = cast(Intent, object())  # never called: nothing here confirms or reads the room
    metrics = NodeMetrics(registry)
    return PeerFeed("!r:b", peer, None, _handled, bot, metrics, confirm=False), registry


def ages(registry: CollectorRegistry) -> tuple[float, float]:
    count = registry.get_sample_value("rethink_mn_peer_event_age_seconds_count") or 0.0
    total = registry.get_sample_value("rethink_mn_peer_event_age_seconds_sum") or 0.0
    return count, total


def test_an_event_is_as_old_as_its_homeservers_stamp_and_odd_stamps_are_not_counted() -> None:
    f, registry = feed()
    now_ms = int(time.time() * 1000)
    f._observe_age({"origin_server_ts": now_ms - 1500})
    count, total = ages(registry)
    assert count == 1 and 1.4 < total < 5
    # A stamp from the future (the peer's clock ahead) counts as no age, not a negative one.
    f._observe_age({"origin_server_ts": now_ms + 60_000})
    assert ages(registry) == (2, total)
    # What no event may hold, or no number at all: not counted, and nothing raises (an integer
    # beyond a float would, divided).
    for stamp in (10**400, MAX_NUMBER + 1, 0, -5, True, 1.5e12, "1700000000000", None):
        f._observe_age({"origin_server_ts": stamp})
    f._observe_age({})
    assert ages(registry) == (2, total)

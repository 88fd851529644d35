"""Flow control toward a peer domain (adapter/routing/flow.py): when the next event may leave."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from adapter.observability import NodeMetrics
from adapter.routing.flow import PeerPace


def pace(window: int = 2, max_hold: float = 5.0) -> tuple[PeerPace, CollectorRegistry]:
    registry = CollectorRegistry()
    return PeerPace("b.example", window, max_hold, NodeMetrics(registry)), registry


def paced(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value(
        "rethink_mn_peer_paced_total", {"peer": "b.example", "outcome": outcome}
    )
    return value or 0.0


async def leaves_at_once(p: PeerPace) -> bool:
    try:
        async with asyncio.timeout(0.05):
            await p.pace()
    except TimeoutError:
        return False
    return True


async def test_a_peer_that_never_confirmed_is_not_paced() -> None:
    # An older node, or a registration without receive_ephemeral: flow control stays out of it.
    p, _registry = pace()
    for n in range(1, 20):
        p.sent(n, f"$e{n}")
    assert p.in_flight == 19
    assert await leaves_at_once(p)


async def test_a_full_window_holds_the_next_event_until_the_peer_confirms() -> None:
    p, registry = pace(window=2)
    p.sent(1, "$e1")
    assert p.confirmed("$e1")  # the peer confirms: from now on it is paced
    p.sent(2, "$e2")
    assert await leaves_at_once(p)  # one in flight: room in the window
    p.sent(3, "$e3")
    assert not await leaves_at_once(p)  # two in flight: the window is full

    waiting = asyncio.create_task(p.pace())
    await asyncio.sleep(0.02)
    assert not waiting.done()
    assert p.confirmed("$e2")
    await asyncio.wait_for(waiting, 1)
    assert p.in_flight == 1
    assert paced(registry, "confirmed") == 1


async def test_a_receipt_confirms_every_event_before_it_and_unknown_ones_are_ignored() -> None:
    p, _registry = pace(window=3)
    for n in range(1, 6):
        p.sent(n, f"$e{n}")
    assert not p.confirmed("$not-ours")
    assert p.in_flight == 5
    assert p.confirmed("$e4")
    assert p.in_flight == 1
    # An older receipt arriving late takes nothing back.
    assert not p.confirmed("$e2")
    assert p.in_flight == 1


async def test_a_peer_that_stops_confirming_still_gets_an_event_per_max_hold() -> None:
    p, registry = pace(window=1, max_hold=0.1)
    p.sent(1, "$e1")
    p.confirmed("$e1")
    p.sent(2, "$e2")  # never confirmed: the peer's node went away
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(p.pace(), 2)
    assert 0.09 <= loop.time() - started < 1.0
    assert paced(registry, "max_hold") == 1


async def test_window_zero_turns_flow_control_off() -> None:
    p, _registry = pace(window=0)
    p.sent(1, "$e1")
    assert not p.confirmed("$e1")  # nothing remembered
    p.sent(2, "$e2")
    assert await leaves_at_once(p)


async def test_after_a_restart_the_numbering_goes_on_with_nothing_in_flight() -> None:
    p, _registry = pace(window=1)
    p.start_at(41)
    assert p.in_flight == 0
    p.sent(42, "$e42")
    assert p.in_flight == 1
    assert p.confirmed("$e42")
    assert p.in_flight == 0

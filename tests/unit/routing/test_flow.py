"""Flow control toward a peer domain (adapter/routing/flow.py): when the next event may leave,
and when the peer counts as behind."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from adapter.observability import NodeMetrics
from adapter.routing import flow
from adapter.routing.flow import PeerPace, RoundTrips


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pace(window: int = 2, max_hold: float = 5.0) -> tuple[PeerPace, Clock, CollectorRegistry]:
    registry, clock = CollectorRegistry(), Clock()
    p = PeerPace("b.example", window, max_hold, NodeMetrics(registry), clock=clock)
    return p, clock, registry


def paced(registry: CollectorRegistry, outcome: str) -> float:
    value = registry.get_sample_value(
        "rethink_mn_peer_paced_total", {"peer": "b.example", "outcome": outcome}
    )
    return value or 0.0


def fell_behind(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "rethink_mn_peer_fell_behind_total", {"peer": "b.example", "reason": reason}
    )
    return value or 0.0


def behind_gauge(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("rethink_mn_peer_behind", {"peer": "b.example"})


def leaves_at_once(p: PeerPace) -> bool:
    """Whether the next event may leave without waiting at all: ``pace()`` returns without
    suspending (no clock involved, so a slow machine cannot change the answer)."""
    step = p.pace().__await__()
    try:
        next(step)
    except StopIteration:
        return True
    step.close()
    return False


async def settle() -> None:
    """Let the tasks started run until they wait for something."""
    for _ in range(5):
        await asyncio.sleep(0)


def round_trip(p: PeerPace, clock: Clock, n: int, seconds: float) -> None:
    """Event ``n`` leaves now and is confirmed ``seconds`` later."""
    p.sent(n, f"$e{n}")
    clock.now += seconds
    assert p.confirmed(f"$e{n}")


def fall_behind(p: PeerPace, clock: Clock, start: int, window: int) -> int:
    """Confirmations slow down from 50 ms to 400 ms with the window full: the peer is behind.
    Nothing is left in flight; returns the next number."""
    n = start
    for _ in range(3):
        round_trip(p, clock, n, 0.05)
        n += 1
    for _ in range(20):
        first = n
        for _ in range(window + 1):
            p.sent(n, f"$e{n}")
            n += 1
        clock.now += 0.4
        assert p.confirmed(f"$e{first}")  # judged with the window still full
        assert p.confirmed(f"$e{n - 1}")
        if p.behind:
            return n
    raise AssertionError("never fell behind")


async def test_a_peer_that_never_confirmed_is_not_paced() -> None:
    # An older node, or a registration without receive_ephemeral: flow control stays out of it.
    p, _clock, _registry = pace()
    for n in range(1, 20):
        p.sent(n, f"$e{n}")
    assert p.in_flight == 19
    assert leaves_at_once(p)


async def test_while_the_peer_keeps_up_a_full_window_does_not_hold_anything() -> None:
    # Light load: events leave one after another faster than confirmations come back.
    p, clock, registry = pace(window=2)
    round_trip(p, clock, 1, 0.06)
    for n in range(2, 6):
        p.sent(n, f"$e{n}")
        clock.now += 0.05
        assert leaves_at_once(p)
    assert p.in_flight == 4 and not p.behind
    assert p.confirmed("$e4")
    assert paced(registry, "confirmed") == paced(registry, "max_hold") == 0
    assert behind_gauge(registry) == 0


async def test_slow_confirmations_with_room_in_the_window_change_nothing() -> None:
    # Light load on a jittery path: round trips jump, but the window would hold nothing.
    p, clock, registry = pace(window=4)
    for n in range(1, 4):
        round_trip(p, clock, n, 0.05)
    for n in range(4, 40):
        round_trip(p, clock, n, 0.5)
    assert not p.behind and fell_behind(registry, "round_trip") == 0


async def test_slow_confirmations_put_the_window_in_force_until_the_peer_confirms() -> None:
    p, clock, registry = pace(window=2)
    n = fall_behind(p, clock, 1, 2)
    assert behind_gauge(registry) == 1
    assert fell_behind(registry, "round_trip") == 1
    p.sent(n, f"$e{n}")
    assert leaves_at_once(p)  # one in flight: room in the window
    p.sent(n + 1, f"$e{n + 1}")
    assert not leaves_at_once(p)  # two in flight: the window is full

    waiting = asyncio.create_task(p.pace())
    await settle()
    assert not waiting.done()
    clock.now += 0.4
    assert p.confirmed(f"$e{n}")
    await waiting
    assert p.in_flight == 1
    assert paced(registry, "confirmed") == 1


async def test_falling_behind_with_a_full_window_lets_one_event_ask_for_a_confirmation() -> None:
    """The events in flight when the link falls behind were sent while the peer kept up and
    asked for no confirmation at once: waiting for them would wait for the peer's next periodic
    receipt (a whole CONFIRM_EVERY in the worst case, a second-long stall of everything sent).
    One event goes past the full window asking to be confirmed at once; then the window holds."""
    p, clock, registry = pace(window=2)
    for n in range(1, 4):
        round_trip(p, clock, n, 0.05)
    for n in range(4, 10):  # a crowd while keeping up: six events, none asking
        p.sent(n, f"$e{n}")
        clock.now += 0.03
        assert leaves_at_once(p) and not p.confirm_now()
    clock.now += 0.4
    assert p.confirmed("$e4")  # slow, with the window full: behind
    assert p.behind and p.in_flight == 5
    assert leaves_at_once(p)  # past the full window, once
    assert p.confirm_now()  # and it asks to be confirmed at once
    p.sent(10, "$e10", messages=50)  # what gathered meanwhile
    assert not leaves_at_once(p)  # from here on the window holds
    waiting = asyncio.create_task(p.pace())
    await settle()
    assert not waiting.done()
    clock.now += 0.1
    assert p.confirmed("$e10")  # the peer answered the one that asked, and all before it
    await waiting
    assert p.in_flight == 0 and paced(registry, "confirmed") == 1


async def test_heavy_traffic_is_paced_before_the_peers_queue_can_show_in_a_round_trip() -> None:
    """An event carrying many messages says they gather faster than events leave: the window
    applies at once, with every event confirmed at once, instead of after a periodic receipt
    has measured a queue the peer built meanwhile. Light traffic (an event per message) is
    never held."""
    p, clock, registry = pace(window=2)
    for n in range(1, 4):
        round_trip(p, clock, n, 0.05)
    for n in range(4, 30):  # light: one message per event, nothing held, nothing asked
        p.sent(n, f"$e{n}", messages=1)
        assert leaves_at_once(p) and not p.confirm_now()
    assert not p.behind
    p.sent(30, "$e30", messages=flow.FEW_MESSAGES + 1)
    assert p.behind and fell_behind(registry, "load") == 1
    assert leaves_at_once(p) and p.confirm_now()  # the one that asks
    p.sent(31, "$e31", messages=40)
    assert not leaves_at_once(p)
    # The crowd passes: small events confirmed as fast as before, and nothing is held again.
    clock.now += 0.05
    assert p.confirmed("$e31")
    p.sent(32, "$e32", messages=1)
    clock.now += 0.05
    assert p.confirmed("$e32")
    assert not p.behind and behind_gauge(registry) == 0
    assert fell_behind(registry, "round_trip") == fell_behind(registry, "overdue") == 0


async def test_a_peer_whose_confirmations_are_fast_again_has_caught_up() -> None:
    p, clock, registry = pace(window=1)
    n = fall_behind(p, clock, 1, 1)
    while p.behind:
        round_trip(p, clock, n, 0.05)
        n += 1
    p.sent(n, f"$e{n}")
    p.sent(n + 1, f"$e{n + 1}")
    assert leaves_at_once(p)
    assert behind_gauge(registry) == 0


async def test_a_link_behind_for_longer_than_the_floor_is_remembered_measures_it_afresh() -> None:
    p, clock, _registry = pace(window=1)
    n = fall_behind(p, clock, 1, 1)
    for _ in range(10):
        round_trip(p, clock, n, 0.4)  # measures the peer's queue: still behind
        n += 1
    assert p.behind
    clock.now += flow.FLOOR_SPAN
    round_trip(p, clock, n, 0.4)
    # The path itself may have become slower: the floor is measured again, from this pace.
    assert not p.behind
    round_trip(p, clock, n + 1, 0.4)
    assert not p.behind


def test_the_floor_is_a_low_quantile_of_the_round_trips_of_the_last_span() -> None:
    clock = Clock()
    trips = RoundTrips(clock)
    assert trips.floor is None
    for ms in (80, 50, 60, 70, 90):
        trips.observe(ms / 1000, keeping_up=True)
    trips.observe(0.01, keeping_up=False)  # measured while behind: not the path
    assert trips.floor == 0.06  # the 25th percentile, not the least
    clock.now += flow.FLOOR_SPAN / 2
    trips.observe(0.2, keeping_up=True)
    assert trips.floor == 0.06
    clock.now += flow.FLOOR_SPAN / 2 + 1
    assert trips.floor == 0.2  # the older ones are forgotten
    clock.now += flow.FLOOR_SPAN
    assert trips.floor is None


async def test_a_crowd_held_by_the_window_stays_paced_while_its_round_trips_are_short() -> None:
    """With the window holding what a crowd sends, the round trip is short because the window
    works: it must not count as caught up, or the crowd floods the peer again."""
    p, clock, _registry = pace(window=1)
    n = fall_behind(p, clock, 1, 1)
    for _ in range(40):
        p.sent(n, f"$e{n}", messages=90)  # what gathered while the window was full
        clock.now += 0.05  # confirmed as fast as when the peer kept up
        assert p.confirmed(f"$e{n}")
        assert p.behind
        n += 1
    # The crowd stops: events carry a message or two again, and the peer has caught up.
    p.sent(n, f"$e{n}", messages=1)
    clock.now += 0.05
    assert p.confirmed(f"$e{n}")
    assert not p.behind


async def test_a_peer_that_stops_confirming_is_behind_and_still_gets_an_event_per_max_hold() -> (
    None
):
    p, clock, registry = pace(window=1, max_hold=0.1)
    round_trip(p, clock, 1, 0.05)
    p.sent(2, "$e2")  # never confirmed: the peer's node went away
    clock.now += 0.05
    assert leaves_at_once(p)  # not yet overdue: nothing says it is behind
    # Overdue: BEHIND times the floor and the peer's confirmation interval have passed.
    clock.now += flow.BEHIND * (0.05 + flow.CONFIRM_EVERY)
    # Event 2 asked for no confirmation at once: one event goes to ask for it...
    assert leaves_at_once(p)
    assert p.behind and p.confirm_now()
    p.sent(3, "$e3")
    # ...and with that one unanswered too, the next waits out max_hold.
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not leaves_at_once(p)
    await p.pace()
    # It waited max_hold (at least: an upper bound is the machine's, not the node's) and left
    # because max_hold ran out, not because something was confirmed.
    assert loop.time() - started >= 0.09
    assert paced(registry, "max_hold") == 1
    assert fell_behind(registry, "overdue") == 1 and fell_behind(registry, "round_trip") == 0


async def test_the_peer_is_asked_to_confirm_at_once_only_while_its_confirmations_matter() -> None:
    p, clock, _registry = pace(window=2)
    assert p.confirm_now()  # not confirming yet: every event asks, to start the measure
    round_trip(p, clock, 1, 0.05)
    assert not p.confirm_now()  # keeping up: the peer confirms at its own interval
    fall_behind(p, clock, 2, 2)
    assert p.confirm_now()  # the window waits on every confirmation
    off, _clock, _registry = pace(window=0)
    assert not off.confirm_now()


async def test_a_receipt_confirms_every_event_before_it_and_unknown_ones_are_ignored() -> None:
    p, _clock, _registry = pace(window=3)
    for n in range(1, 6):
        p.sent(n, f"$e{n}")
    assert not p.confirmed("$not-ours")
    assert p.in_flight == 5
    assert p.confirmed("$e4")
    assert p.in_flight == 1
    # An older receipt arriving late takes nothing back.
    assert not p.confirmed("$e2")
    assert p.in_flight == 1


async def test_window_zero_turns_flow_control_off() -> None:
    p, _clock, _registry = pace(window=0)
    p.sent(1, "$e1")
    assert not p.confirmed("$e1")  # nothing remembered
    p.sent(2, "$e2")
    assert leaves_at_once(p)


async def test_after_a_restart_the_numbering_goes_on_with_nothing_in_flight() -> None:
    p, _clock, _registry = pace(window=1)
    p.start_at(41)
    assert p.in_flight == 0
    p.sent(42, "$e42")
    assert p.in_flight == 1
    assert p.confirmed("$e42")
    assert p.in_flight == 0


async def test_events_waiting_for_the_peers_once_a_second_confirmation_are_not_overdue() -> None:
    # At light load the peer confirms once every CONFIRM_EVERY: an event may wait that long
    # for its confirmation, on top of the path, even beyond max_hold, and the peer keeps up.
    p, clock, registry = pace(window=2, max_hold=flow.CONFIRM_EVERY / 2)
    for n in range(1, 5):
        round_trip(p, clock, n, 0.08)
    for n in range(5, 25):  # 20 events in the second before the next confirmation
        p.sent(n, f"$e{n}")
        clock.now += flow.CONFIRM_EVERY / 20
    clock.now += 0.08
    assert leaves_at_once(p)
    assert not p.behind and fell_behind(registry, "overdue") == 0
    assert p.confirmed("$e24")
    assert not p.behind


async def test_steady_load_confirmed_once_a_second_keeps_up() -> None:
    # Five events a second, the peer confirming once a second the last event it handled, which
    # waited there a while: the round trips are above twice the floor of light load, but what
    # the window would hold after each receipt is one event, so nothing is behind.
    p, clock, registry = pace(window=4)
    for n in range(1, 5):
        round_trip(p, clock, n, 0.05)
    n = 4
    for _second in range(20):
        for _ in range(5):
            n += 1
            p.sent(n, f"$e{n}")
            clock.now += 0.2
        assert p.confirmed(f"$e{n - 1}")  # sent 0.4 s ago
        assert not p.behind
    assert fell_behind(registry, "round_trip") == fell_behind(registry, "overdue") == 0
    assert leaves_at_once(p)


def test_events_say_how_often_they_want_confirmations() -> None:
    off, _clock, _registry = pace(window=0)
    assert off.asks() == {}
    p, clock, _registry = pace(window=2)
    every = round(flow.CONFIRM_EVERY * 1000)
    # Until the peer has confirmed anything, at once.
    assert p.asks() == {flow.CONFIRM_EVERY_FIELD: every, flow.CONFIRM_NOW: True}
    round_trip(p, clock, 1, 0.05)
    assert p.asks() == {flow.CONFIRM_EVERY_FIELD: every}


def test_the_confirmation_interval_a_peer_asks_for_is_bounded() -> None:
    interval = flow.confirm_interval
    assert interval({}) == flow.LEGACY_CONFIRM_EVERY  # a node from before the field
    assert interval({flow.CONFIRM_EVERY_FIELD: 1000}) == 1.0
    assert interval({flow.CONFIRM_EVERY_FIELD: 1}) == 0.05
    assert interval({flow.CONFIRM_EVERY_FIELD: 10**12}) == 5.0
    assert interval({flow.CONFIRM_EVERY_FIELD: 10**400}) == 5.0
    assert interval({flow.CONFIRM_EVERY_FIELD: -(10**400)}) == 0.05
    for odd in (1.0, True, "1000", None, [1000]):
        assert interval({flow.CONFIRM_EVERY_FIELD: odd}) == flow.LEGACY_CONFIRM_EVERY

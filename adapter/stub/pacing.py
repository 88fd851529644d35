"""Pacing of what one stub connection sends: messages per second and bytes per second.

A token bucket each, with a burst a runtime may send at full speed. A frame beyond the rate is
not refused: the connection's socket is simply not read until the rate allows it (TCP then slows
the sender), so nothing the runtime sent is lost and one sender's flood takes no more of the
node than its rate. A crowd of honest runtimes, each sending a few messages a second, never
meets the defaults (config.example.yaml, ``stub.messages_per_second``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from functools import partial


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; taking beyond what is there leaves a debt,
    and the wait before the next take is how long paying it back takes."""

    __slots__ = ("_burst", "_clock", "_rate", "_stamp", "_tokens")

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()

    def take(self, amount: float) -> float:
        """Take ``amount``; the seconds to wait before going on (0 within the rate)."""
        if self._rate <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        self._tokens -= amount
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def full_at(self) -> float:
        """When the bucket holds its whole burst again (on its clock), if nothing is taken."""
        if self._rate <= 0:
            return 0.0
        return self._stamp + (self._burst - self._tokens) / self._rate


class Pace:
    """A connection's two buckets: messages and bytes."""

    __slots__ = ("_bytes", "_messages")

    def __init__(
        self,
        messages_per_second: float,
        messages_burst: int,
        bytes_per_second: float,
        bytes_burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._messages = TokenBucket(messages_per_second, messages_burst, clock)
        self._bytes = TokenBucket(bytes_per_second, bytes_burst, clock)

    def take(self, size: int) -> float:
        """One frame of ``size`` bytes: the seconds to wait before reading the next."""
        return max(self._messages.take(1), self._bytes.take(size))

    def rested_at(self) -> float:
        """When both buckets are full again: from then on a new pace is the same as this one."""
        return max(self._messages.full_at(), self._bytes.full_at())


class ClientPaces:
    """One ``Pace`` per client, shared by all its connections: a host opening many sockets
    sends no faster than one client's rate in all (the attacker review of issue 41: 50 sockets
    of one host, each within its own rate, took the node from every honest runtime).

    A client's pace is kept while it has a connection open, and after its last one closes until
    its buckets are full again: had it gone with the last connection, a client that sends its
    burst, disconnects and connects again would get a fresh burst each time (the attacker review
    of issue 44 took 142 times the configured rate that way). So the node holds one pace per
    connected client, and one per client that left within a burst's refill time."""

    __slots__ = ("_clock", "_held", "_new_pace", "_rested", "_resting")

    def __init__(
        self,
        messages_per_second: float,
        messages_burst: int,
        bytes_per_second: float,
        bytes_burst: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._new_pace = partial(
            Pace, messages_per_second, messages_burst, bytes_per_second, bytes_burst, clock
        )
        self._clock = clock
        # Each client's pace and how many of its connections use it.
        self._held: dict[str, tuple[Pace, int]] = {}
        # The paces of clients with no connection left, until they have rested (when).
        self._resting: dict[str, Pace] = {}
        self._rested: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._held) + len(self._resting)

    def join(self, client: str) -> Pace:
        """The pace a new connection of ``client`` shares with its others."""
        self._forget_rested()
        held = self._held.get(client)
        if held is not None:
            pace, connections = held
        else:
            resting = self._resting.pop(client, None)
            pace, connections = (resting if resting is not None else self._new_pace()), 0
        self._held[client] = (pace, connections + 1)
        return pace

    def leave(self, client: str) -> None:
        """A connection of ``client`` closed: with its last one, its pace rests."""
        held = self._held.get(client)
        if held is None:
            return
        pace, connections = held
        if connections > 1:
            self._held[client] = (pace, connections - 1)
            return
        del self._held[client]
        rested_at = pace.rested_at()
        if rested_at > self._clock():
            self._resting[client] = pace
            heapq.heappush(self._rested, (rested_at, client))
        self._forget_rested()

    def _forget_rested(self) -> None:
        now, rested, resting = self._clock(), self._rested, self._resting
        while rested and rested[0][0] <= now:
            _at, client = heapq.heappop(rested)
            pace = resting.get(client)
            # An entry is stale when the client came back since (and maybe left again).
            if pace is not None and pace.rested_at() <= now:
                del resting[client]

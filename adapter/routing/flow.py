"""Flow control toward one peer domain: the far side sets the pace.

Taking a federated event costs the receiving homeserver far more than persisting one costs the
sending one (tens of milliseconds of CPU each on a small machine). A sender that makes one event
per message while its own homeserver answers quickly therefore outruns a busy far side: the far
homeserver's queue grows and latency runs away. So a peer link keeps at most ``window`` events
in flight that the peer's node has not yet confirmed; while the window is full, what the link's
runtimes send waits and leaves together, in one event, when the next confirmation comes. A lone
message at light load finds the window open and leaves at once.

The confirmation is the peer node's read receipt (``m.read``) on the last event of this node's
room it has handled (peer_feed.py sends it). Receipts reach this node as ephemeral events of
the homeserver's push (the registration's ``receive_ephemeral``). Nothing depends on them:

- a peer that has never confirmed anything (an older node, a registration without
  ``receive_ephemeral``) is not paced at all, as before flow control;
- a full window is held at most ``max_hold`` seconds: a peer node that stopped confirming (it
  is down, its homeserver or the link is away) still gets one event per ``max_hold``, carrying
  everything that waited, so nothing here waits for a peer for ever and the events are in the
  room for the peer to read when it is back.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from ..observability import NodeMetrics

# Events sent and not yet confirmed that are remembered (their ids, to place a receipt).
_REMEMBERED = 4096


class PeerPace:
    def __init__(self, domain: str, window: int, max_hold: float, metrics: NodeMetrics) -> None:
        self._window = window
        self._max_hold = max_hold
        self._gauge = metrics.peer_unconfirmed.labels(domain)
        self._held_until_confirmed = metrics.peer_paced.labels(domain, "confirmed")
        self._held_until_max = metrics.peer_paced.labels(domain, "max_hold")
        self._round_trip = metrics.peer_confirm_seconds
        self._sent = 0  # the number of the last event the homeserver persisted
        self._confirmed = 0  # the number of the last event the peer's node handled
        self._confirming = False  # whether the peer's node has ever confirmed anything
        # event id -> its number and when it was persisted
        self._unconfirmed: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._progress = asyncio.Event()

    @property
    def last_sent(self) -> int:
        """The number of the last event the homeserver persisted."""
        return self._sent

    @property
    def confirming(self) -> bool:
        """Whether the peer's node has confirmed anything (only then is the link paced)."""
        return self._confirming

    @property
    def in_flight(self) -> int:
        """Events persisted here that the peer's node has not confirmed."""
        return self._sent - self._confirmed

    def start_at(self, n: int) -> None:
        """The room's numbering goes on from ``n`` (after a restart): nothing is in flight."""
        self._sent = self._confirmed = n

    def sent(self, n: int, event_id: str) -> None:
        self._sent = n
        self._gauge.set(self.in_flight)
        if self._window:
            self._unconfirmed[event_id] = (n, time.monotonic())
            while len(self._unconfirmed) > _REMEMBERED:
                self._unconfirmed.popitem(last=False)

    def confirmed(self, event_id: str) -> bool:
        """The peer's node has handled ``event_id`` and every event before it; False for an
        event this link does not remember sending (ignored)."""
        found = self._unconfirmed.get(event_id)
        if found is None:
            return False
        n, persisted = found
        self._round_trip.observe(time.monotonic() - persisted)
        while self._unconfirmed:
            _first, (first_n, _at) = next(iter(self._unconfirmed.items()))
            if first_n > n:
                break
            self._unconfirmed.popitem(last=False)
        self._confirming = True
        if n > self._confirmed:
            self._confirmed = n
            self._gauge.set(self.in_flight)
            self._progress.set()
        return True

    async def pace(self) -> None:
        """Return when the next event may leave: at once while the window has room."""
        if not self._window or not self._confirming or self.in_flight < self._window:
            return
        deadline = asyncio.get_running_loop().time() + self._max_hold
        while self.in_flight >= self._window:
            self._progress.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._progress.wait()
            except TimeoutError:
                self._held_until_max.inc()
                return
        self._held_until_confirmed.inc()

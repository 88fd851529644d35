"""Flow control toward one peer domain: the far side sets the pace, when it is behind.

Taking a federated event costs the receiving homeserver far more than persisting one costs the
sending one (tens of milliseconds of CPU each on a small machine). A sender that makes one event
per message while its own homeserver answers quickly therefore outruns a busy far side: the far
homeserver's queue grows and latency runs away. The peer's node confirms the events it has
handled (a read receipt, ``m.read``, on the last one; peer_feed.py sends it), and this link
compares how long confirmations take with how long they took lately while it kept up (the
path itself, its floor):

- **keeping up** (the round trip near that floor): every event leaves at once. A lone message
  at light load is never held, and the peer confirms at most every ``CONFIRM_EVERY`` seconds,
  so at light load confirmations cost its homeserver a fraction of an event each;
- **behind** (the smoothed round trip above ``BEHIND`` times the floor with the window full, or
  the oldest event in flight unconfirmed for longer than that allows; or, before either can
  show, an event carried more than ``FEW_MESSAGES`` messages: heavy traffic, which would fill
  the peer's queue for up to ``CONFIRM_EVERY`` before a periodic receipt told): at most
  ``window`` events are in flight that the peer has not confirmed. While the window is full,
  what the link's runtimes send waits and leaves together, in one event, when the next
  confirmation comes, and each event asks the peer to confirm at once (``confirm_now`` in its
  content); the first event after falling behind goes past a full window to ask, since those
  in flight did not. The link is back to keeping up once the round trip falls under
  ``CAUGHT_UP`` times the floor with little waiting (events of at most ``FEW_MESSAGES``
  messages).

The floor is a low quantile of the round trips measured while keeping up, over the last
``FLOOR_SPAN`` seconds; round trips measured while behind say how long the queue is, not how
long the path is, and are left out of it (they would raise it step by step under a long
overload). A link that stays behind longer than the span forgets its floor and measures it
afresh.

Receipts reach this node as ephemeral events of the homeserver's push (the registration's
``receive_ephemeral``). Nothing depends on them:

- a peer that has never confirmed anything (an older node, a registration without
  ``receive_ephemeral``) is not paced at all;
- a full window is held at most ``max_hold`` seconds: a peer node that stopped confirming (it
  is down, its homeserver or the link is away) still gets one event per ``max_hold``, carrying
  everything that waited, so nothing here waits for a peer for ever and the events are in the
  room for the peer to read when it is back.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from ..observability import NodeMetrics

# Events sent and not yet confirmed that are remembered (their ids, to place a receipt).
_REMEMBERED = 4096

# The content field of an event to a peer that asks its node to confirm at once.
CONFIRM_NOW = "confirm_now"
# While its sender keeps up, a peer's node confirms at most this often (peer_feed.py). Each
# receipt is a federation transaction for both homeservers: at 0.2 s (five a second) they made
# the light-load latency across 1.17-2.61 times the bare homeservers'; once a second, 0.92-1.22
# (docs/benchmark.md). While behind, events ask for confirmation at once instead.
CONFIRM_EVERY = 1.0
# The sender says in each event how often it expects confirmations (in ms: event content holds
# no floats), since how long it waits before it calls the peer behind follows from it; the two
# domains' nodes need not run the same release. A sender that does not say (an older node)
# expects the 0.2 s it was built with. What a peer asks is kept within bounds: more often than
# the least is a receipt per event, which `confirm_now` can ask for anyway.
CONFIRM_EVERY_FIELD = "confirm_every_ms"
LEGACY_CONFIRM_EVERY = 0.2
_CONFIRM_EVERY_BOUNDS_MS = (50, 5000)
# The round trip, as a multiple of the floor, above which the peer is behind, and under which
# it has caught up again. The same line: what keeps the link from flapping is that falling
# behind also takes a full window, and catching up small events (FEW_MESSAGES). With 1.5 the
# extra receipts of being behind (one per event) kept a link at light load from ever
# measuring under the line again.
BEHIND = 2.0
CAUGHT_UP = 2.0
# An event of at most this many messages says little waits: a crowd held by the window sends
# events of tens to hundreds.
FEW_MESSAGES = 4
# The floor: a low quantile (not the least: a round trip is timed from this node's homeserver
# answering the send, which under load can come after federation already carried the event, so
# the least is too low to judge by) of the round trips measured while keeping up, of the last
# ``FLOOR_SPAN`` seconds and at most ``FLOOR_SAMPLES`` of them.
FLOOR_QUANTILE = 0.25
FLOOR_SPAN = 300.0
FLOOR_SAMPLES = 256
# The weight of a new round trip in the smoothed one (TCP's srtt gain): one slow round trip at
# light load does not make the peer behind.
_SMOOTHING = 0.125


def confirm_interval(content: dict[str, Any]) -> float:
    """How often, in seconds, the writer of an event with ``content`` wants its events
    confirmed while it keeps up."""
    value = content.get(CONFIRM_EVERY_FIELD)
    if not isinstance(value, int) or isinstance(value, bool):
        return LEGACY_CONFIRM_EVERY
    least, most = _CONFIRM_EVERY_BOUNDS_MS
    # Clamped as an integer: a huge one would not even divide into a float.
    return max(least, min(value, most)) / 1000


class RoundTrips:
    """Confirmation round trips of one link: the floor (sampled only while the peer keeps up)
    and a smoothed current value."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=FLOOR_SAMPLES)  # (when, s)
        self.smoothed: float | None = None

    def observe(self, seconds: float, keeping_up: bool) -> None:
        self.smoothed = (
            seconds
            if self.smoothed is None
            else self.smoothed + _SMOOTHING * (seconds - self.smoothed)
        )
        if keeping_up:
            self._samples.append((self._clock(), seconds))

    @property
    def floor(self) -> float | None:
        """The ``FLOOR_QUANTILE`` of the round trips of the last ``FLOOR_SPAN`` seconds measured
        while keeping up (None: none)."""
        horizon = self._clock() - FLOOR_SPAN
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        if not self._samples:
            return None
        ordered = sorted(seconds for _when, seconds in self._samples)
        return ordered[int(FLOOR_QUANTILE * (len(ordered) - 1))]


class PeerPace:
    def __init__(
        self,
        domain: str,
        window: int,
        max_hold: float,
        metrics: NodeMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._max_hold = max_hold
        self._clock = clock
        self._gauge = metrics.peer_unconfirmed.labels(domain)
        self._behind_gauge = metrics.peer_behind.labels(domain)
        self._fell_behind = {
            reason: metrics.peer_fell_behind.labels(domain, reason)
            for reason in ("round_trip", "overdue", "load")
        }
        self._held_until_confirmed = metrics.peer_paced.labels(domain, "confirmed")
        self._held_until_max = metrics.peer_paced.labels(domain, "max_hold")
        self._round_trip = metrics.peer_confirm_seconds
        self._round_trips = RoundTrips(clock)
        self._sent = 0  # the number of the last event the homeserver persisted
        self._confirmed = 0  # the number of the last event the peer's node handled
        self._confirming = False  # whether the peer's node has ever confirmed anything
        self._behind = False
        # Whether an event has left since the link fell behind (it asked to be confirmed at once).
        self._asked_since_behind = False
        self._last_batch = 0  # messages in the last event sent
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
    def behind(self) -> bool:
        """Whether the window applies: the peer's confirmations lag behind what is sent."""
        return self._behind

    @property
    def patience(self) -> float:
        """How long the oldest event in flight may wait for its confirmation before the peer
        counts as behind (while it keeps up): the peer confirms only every ``CONFIRM_EVERY``
        then, so an event may wait that long on top of the round trip (its floor; none when
        measured afresh), and jitter comes on top of both. Not capped by ``max_hold``: that
        bounds holding a full window once behind, and the wait for the next confirmation alone
        can be longer."""
        return BEHIND * ((self._round_trips.floor or 0.0) + CONFIRM_EVERY)

    @property
    def in_flight(self) -> int:
        """Events persisted here that the peer's node has not confirmed."""
        return self._sent - self._confirmed

    def start_at(self, n: int) -> None:
        """The room's numbering goes on from ``n`` (after a restart): nothing is in flight."""
        self._sent = self._confirmed = n

    def confirm_now(self) -> bool:
        """Whether the next event asks the peer to confirm it at once: while behind (the window
        waits on it), and until the peer has confirmed anything."""
        return bool(self._window) and (self._behind or not self._confirming)

    def asks(self) -> dict[str, Any]:
        """What the next event's content asks of the peer's confirmations: nothing with flow
        control off; how often otherwise, and whether at once."""
        if not self._window:
            return {}
        asked: dict[str, Any] = {CONFIRM_EVERY_FIELD: round(CONFIRM_EVERY * 1000)}
        if self.confirm_now():
            asked[CONFIRM_NOW] = True
        return asked

    def sent(self, n: int, event_id: str, messages: int = 1) -> None:
        self._sent = n
        self._last_batch = messages
        self._gauge.set(self.in_flight)
        if self._window:
            self._unconfirmed[event_id] = (n, self._clock())
            while len(self._unconfirmed) > _REMEMBERED:
                self._unconfirmed.popitem(last=False)
            if self._confirming and messages > FEW_MESSAGES:
                # Messages gather while each event is sent: the traffic is heavier than one
                # event per message. Left to the periodic receipts, the peer's queue could grow
                # for up to CONFIRM_EVERY before a round trip showed it, and everything sent
                # then waits for that queue (crowds had second-long tails). Paced from the
                # first such event, every event is confirmed at once and the queue stays short.
                self._falling_behind("load")

    def confirmed(self, event_id: str) -> bool:
        """The peer's node has handled ``event_id`` and every event before it; False for an
        event this link does not remember sending (ignored)."""
        found = self._unconfirmed.get(event_id)
        if found is None:
            return False
        n, persisted = found
        seconds = self._clock() - persisted
        self._round_trip.observe(seconds)
        self._round_trips.observe(seconds, keeping_up=not self._behind)
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
        # After the count moved: "the window is full" means what it would hold now, not the
        # events this receipt just confirmed (with a receipt a second, at a few events a
        # second, those alone fill it).
        self._judge()
        return True

    def _judge(self) -> None:
        """Decide from the round trips whether the peer is behind (the window applies)."""
        floor, smoothed = self._round_trips.floor, self._round_trips.smoothed
        if floor is None:
            # Behind for longer than the floor is remembered: measure it afresh.
            self._keeping_up()
        elif smoothed is not None and smoothed > BEHIND * floor:
            # Slow round trips with fewer events in flight than the window allows: the window
            # would hold nothing, so nothing changes (jitter at light load, mostly).
            if self.in_flight >= self._window:
                self._falling_behind("round_trip")
        elif (
            smoothed is not None
            and smoothed < CAUGHT_UP * floor
            and self._last_batch <= FEW_MESSAGES
        ):
            # Only once what waits is little again: while a crowd's messages gather in large
            # events, the round trip is short because the window works, not because the peer
            # has caught up.
            self._keeping_up()
        self._check_overdue()

    def _check_overdue(self) -> None:
        """No confirmation for too long says the peer is behind, before any round trip can."""
        if not self._behind and self._unconfirmed:
            _first, (_n, persisted) = next(iter(self._unconfirmed.items()))
            if self._clock() - persisted > self.patience:
                self._falling_behind("overdue")

    def _falling_behind(self, reason: str) -> None:
        if not self._behind:
            self._behind = True
            self._asked_since_behind = False
            self._behind_gauge.set(1)
            self._fell_behind[reason].inc()

    def _keeping_up(self) -> None:
        if self._behind:
            self._behind = False
            self._behind_gauge.set(0)

    async def pace(self) -> None:
        """Return when the next event may leave: at once while the peer keeps up or the window
        has room."""
        if not self._window or not self._confirming:
            return
        self._check_overdue()
        if not self._behind:
            return
        if self.in_flight < self._window or not self._asked_since_behind:
            # Past a full window only the first event since the link fell behind: the events in
            # flight were sent while the peer kept up, none asked to be confirmed at once, and
            # the peer would confirm them at its next periodic receipt, up to CONFIRM_EVERY
            # away. This one asks (confirm_now), so the wait is one round trip from here on.
            self._asked_since_behind = True
            return
        deadline = asyncio.get_running_loop().time() + self._max_hold
        while self._behind and self.in_flight >= self._window:
            self._progress.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._progress.wait()
            except TimeoutError:
                self._held_until_max.inc()
                return
        self._held_until_confirmed.inc()

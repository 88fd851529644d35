"""Which of a stub's numbered messages are durable: the node's side of the stub's resend buffer.

A stub speaking the acknowledged protocol numbers every message it sends (1, 2, 3, … per stub
instance) and keeps each one until the node acknowledges it. A message is done when it is
durable: carried in an event the homeserver has persisted, answered by an MN service, or
refused with an answer. Messages finish out of order (a service answer comes at once, a routed
message when its event is persisted), but the acknowledgement is cumulative: the highest number
below which everything is done.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class Pending:
    """One accepted message that is not done yet."""

    __slots__ = ("done", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.done = False


class Upstream:
    def __init__(self, origin: str, on_progress: Callable[[Upstream], None]) -> None:
        # The numbering the stub's messages belong to: its session's key and the stub instance.
        self.origin = origin
        self.accepted = 0  # highest number taken in
        self.acked = 0  # everything up to here is done
        self._pending: deque[Pending] = deque()
        self._on_progress = on_progress
        # (number, how often, since when) of the last message given back
        self._given_back: tuple[int, int, float] = (0, 0, 0.0)

    def take(self, seq: int) -> Pending | None:
        """Accept message ``seq``; None when it was accepted before (a resend after a
        reconnect), in which case it must not be routed again."""
        if seq <= self.accepted:
            return None
        self.accepted = seq
        pending = Pending(seq)
        self._pending.append(pending)
        return pending

    def give_back(self, pending: Pending) -> tuple[int, float]:
        """A message that failed inside the node before it was decided (the database away): not
        taken after all, so its resend after the reconnect is taken again. Returns how many
        times in a row this number was given back, and for how many seconds."""
        if self._pending and self._pending[-1] is pending:
            self._pending.pop()
            self.accepted = pending.seq - 1
        number, times, since = self._given_back
        now = time.monotonic()
        if number == pending.seq:
            times += 1
        else:
            times, since = 1, now
        self._given_back = (pending.seq, times, since)
        return times, now - since

    def done(self, pending: Pending) -> None:
        pending.done = True
        advanced = False
        queue = self._pending
        while queue and queue[0].done:
            self.acked = queue.popleft().seq
            advanced = True
        if advanced:
            self._on_progress(self)


class Settles:
    """A delivery of the node's answer to a numbered request, as a mailbox ticket: the request
    is done — and acknowledged to its stub — once its answer is settled (acknowledged by the
    stub, or stored), never while the answer lives only in the node's memory."""

    __slots__ = ("_held", "_pending", "_upstream")

    event_id = None  # not part of a lane event

    def __init__(self, upstream: Upstream, pending: Pending) -> None:
        self._upstream = upstream
        self._pending = pending
        self._held = 0

    def hold(self) -> None:
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        if self._held <= 0:
            self._upstream.done(self._pending)

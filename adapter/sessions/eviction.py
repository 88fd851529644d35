"""Which detached session goes first when the node must let one go before its lifetime ends.

A flood of new sessions must never cost an honest runtime its session. So the newest go first,
and of those the ones never used (no frame sent, never come back to) before any that was:
whoever makes sessions by the thousand only ever evicts its own. The longest-detached, which
is what an honest runtime briefly away is not, is not what decides.

Kept as two heaps (never used, used), newest on top, with stale entries skipped as they come
up (a session attached again, released, or used since it was pushed), so that a pick costs a
logarithm of the detached sessions rather than a walk over them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Evictable(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def used(self) -> bool: ...


S = TypeVar("S", bound=Evictable)


class EvictionOrder(Generic[S]):
    def __init__(self, detached: Callable[[int], S | None], count: Callable[[], int]) -> None:
        # The detached session with this id, or None: what makes a heap entry current.
        self._detached = detached
        self._count = count  # how many sessions are detached
        self._unused: list[tuple[int, int]] = []  # (-id, id)
        self._used: list[tuple[int, int]] = []

    def push(self, session: S) -> None:
        """``session`` was detached (or read back detached at a start)."""
        heap = self._used if session.used else self._unused
        heapq.heappush(heap, (-session.id, session.id))
        self._compact()

    def pick(self) -> S | None:
        """The detached session to let go first (not removed: its caller releases it)."""
        for heap, used in ((self._unused, False), (self._used, True)):
            while heap:
                session = self._detached(heap[0][1])
                if session is not None and session.used == used:
                    return session
                heapq.heappop(heap)
                if session is not None and session.used and not used:
                    # Used since it was pushed: it belongs in the other heap.
                    heapq.heappush(self._used, (-session.id, session.id))
        return None

    def pick_unused(self) -> S | None:
        """The newest detached session never used, or None."""
        session = self.pick()
        return session if session is not None and not session.used else None

    def _compact(self) -> None:
        # Sessions detached and attached again many times leave stale entries behind: dropped
        # once they are most of a heap (a walk now and then, paid for by the pushes before it).
        limit = 2 * self._count() + 1024
        for name in ("_unused", "_used"):
            heap: list[tuple[int, int]] = getattr(self, name)
            if len(heap) > limit:
                kept = [e for e in heap if self._detached(e[1]) is not None]
                heapq.heapify(kept)
                setattr(self, name, kept)

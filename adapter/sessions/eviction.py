"""Which detached session goes first when the node must let one go before its lifetime ends.

A flood of new sessions must never cost an honest runtime its session. So the sessions of the
client that holds the most go first, and of a client's, the newest, the ones never used (no frame
sent, never come back to) before any that was: whoever makes sessions by the thousand, used or
not, only ever evicts its own, and a runtime briefly away on another host keeps its session
however new it is and whether or not it has sent anything yet. The longest-detached, which is
what an honest runtime briefly away is not, is not what decides.

Each client's detached sessions are kept as two heaps (never used, used), newest on top, and the
clients in a heap of how many sessions each holds. Stale entries are skipped as they come up (a
session attached again, released, or used since it was pushed; a client whose count changed
since), so that a pick costs a logarithm of the detached sessions rather than a walk over them.
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

    @property
    def client(self) -> str: ...


S = TypeVar("S", bound=Evictable)


class _ClientQueue:
    """One client's detached sessions, newest on top: (-id, id)."""

    __slots__ = ("unused", "used")

    def __init__(self) -> None:
        self.unused: list[tuple[int, int]] = []
        self.used: list[tuple[int, int]] = []


class EvictionOrder(Generic[S]):
    def __init__(
        self,
        detached: Callable[[int], S | None],
        count: Callable[[], int],
        held: Callable[[str], int] = lambda _client: 0,
    ) -> None:
        # The detached session with this id, or None: what makes a heap entry current.
        self._detached = detached
        self._count = count  # how many sessions are detached
        self._held = held  # how many sessions a client holds (bounds.py), attached or not
        self._queues: dict[str, _ClientQueue] = {}
        # (-sessions held, client) as of when pushed: the client to take from first on top.
        self._clients: list[tuple[int, str]] = []

    def push(self, session: S) -> None:
        """``session`` was detached (or read back detached at a start)."""
        queue = self._queues.get(session.client)
        if queue is None:
            queue = self._queues[session.client] = _ClientQueue()
        heapq.heappush(queue.used if session.used else queue.unused, (-session.id, session.id))
        heapq.heappush(self._clients, (-self._held(session.client), session.client))
        self._compact(queue)

    def pick(self) -> S | None:
        """The detached session to let go first (not removed: its caller releases it)."""
        clients = self._clients
        while clients:
            weight, client = clients[0]
            held = self._held(client)
            if -weight != held:
                # Its count moved since: in again at its place now.
                heapq.heapreplace(clients, (-held, client))
                continue
            session = self._newest(client)
            if session is not None:
                return session
            heapq.heappop(clients)
        return None

    def pick_unused(self) -> S | None:
        """The next detached session to go if it was never used, else None."""
        session = self.pick()
        return session if session is not None and not session.used else None

    def _newest(self, client: str) -> S | None:
        """The client's newest detached session never used, else its newest used; None (and
        the client forgotten) when it has none detached any more."""
        queue = self._queues.get(client)
        if queue is None:
            return None
        for heap, used in ((queue.unused, False), (queue.used, True)):
            while heap:
                session = self._detached(heap[0][1])
                if session is not None and session.used == used and session.client == client:
                    return session
                heapq.heappop(heap)
                if session is not None and session.used and not used:
                    # Used since it was pushed: it belongs in the other heap.
                    heapq.heappush(queue.used, (-session.id, session.id))
        del self._queues[client]
        return None

    def _compact(self, queue: _ClientQueue) -> None:
        # Sessions detached and attached again many times leave stale entries behind, and each
        # push adds a client entry: dropped once they are most of a heap (a walk now and then,
        # paid for by the pushes before it).
        limit = 2 * self._count() + 1024
        if len(self._clients) > limit:
            self._clients = [(-self._held(client), client) for client in self._queues]
            heapq.heapify(self._clients)
        for name in ("unused", "used"):
            heap: list[tuple[int, int]] = getattr(queue, name)
            if len(heap) > limit:
                kept = [e for e in heap if self._detached(e[1]) is not None]
                heapq.heapify(kept)
                setattr(queue, name, kept)

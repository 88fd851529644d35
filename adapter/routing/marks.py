"""The senders' marks: per origin (a sender id), the highest message number routed.

A mark lets the node drop a message its sender, or a lane, carries twice. One ``SenderMarks``
holds them for the node, in the three forms they take:
- routed: what delivery has handed to mailboxes, checked and moved for every message;
- settled: as of the lanes' positions, folded in from each lane event once it is settled; this
  is what a restarted node reads back, since it reads its lanes again from those positions;
- due: the settled marks that moved since the last checkpoint stored them, and the origins let
  go whose rows the next checkpoint deletes.
Each lane event (``Ticket``) also holds its own messages' marks until it settles: its share of
the settled marks. Delivery and settlement are handed the same instance (core.py); every write
to any of these is made here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settlement import Ticket


class SenderMarks:
    def __init__(self) -> None:
        self._routed: dict[str, int] = {}
        self._settled: dict[str, int] = {}
        self._due: set[str] = set()
        # Origins let go for good whose rows are deleted at the next checkpoint.
        self._rows_dropped: set[str] = set()
        # Told of an origin's first mark (the node bounds how many it keeps per client:
        # local_origins.py); may let other origins go, never this one.
        self.on_new_origin: Callable[[str], None] = lambda _origin: None

    @property
    def routed(self) -> Mapping[str, int]:
        return self._routed

    @property
    def settled(self) -> Mapping[str, int]:
        return self._settled

    def routed_through(self, origin: str) -> int:
        return self._routed.get(origin, 0)

    def restore(self, marks: Mapping[str, int]) -> None:
        """At a start: the settled marks the database kept, which are the routed ones too
        (the lanes are read again from the positions they are as of)."""
        self._routed.update(marks)
        self._settled.update(marks)

    def route(self, origin: str, seq: int, ticket: Ticket | None) -> None:
        """``seq`` of ``origin`` (above its mark) was handed to its mailboxes, as part of
        ``ticket``'s event (None: no event, the relay baseline)."""
        routed = self._routed
        if origin not in routed:
            self.on_new_origin(origin)
        routed[origin] = seq
        if ticket is not None:
            ticket.marks[origin] = seq

    def settle(self, ticket: Ticket) -> None:
        """A lane event is settled and its lane's position moves past it: its marks are the
        settled ones now, due to be stored."""
        settled = self._settled
        for origin, seq in ticket.marks.items():
            if seq > settled.get(origin, 0):
                settled[origin] = seq
                self._due.add(origin)

    def due(self) -> tuple[dict[str, int], list[str]]:
        """What the next checkpoint writes: the settled marks that moved, and the origins
        whose rows go."""
        settled = self._settled
        return {origin: settled[origin] for origin in self._due}, sorted(self._rows_dropped)

    def has_due(self) -> bool:
        return bool(self._due or self._rows_dropped)

    def stored(self, marks: Collection[str], dropped: Collection[str]) -> None:
        """A checkpoint wrote what ``due`` gave (what moved since stays due)."""
        self._due.difference_update(marks)
        self._rows_dropped.difference_update(dropped)

    def let_go(self, origins: Collection[str], open_events: Iterable[Ticket]) -> None:
        """Origins whose marks go for good (their senders gone, beyond a bound, a peer's idle
        ones): out of memory now, out of the ``open_events`` (the only ones that may carry
        them), and their rows deleted at the next checkpoint. A message of one sent again
        later is delivered again."""
        routed, settled, due = self._routed, self._settled, self._due
        for origin in origins:
            routed.pop(origin, None)
            settled.pop(origin, None)
            due.discard(origin)
        self._rows_dropped.update(origins)
        for ticket in open_events:
            marks = ticket.marks
            if len(marks) <= len(origins):
                for origin in [o for o in marks if o in origins]:
                    del marks[origin]
            else:
                for origin in origins:
                    marks.pop(origin, None)

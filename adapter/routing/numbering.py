"""The numbering of the events this node writes into a room: the lanes (lanes.py) and the links
to peer domains (federation/links.py) number theirs the same way, here; the lanes' and peers'
readers (federation/, cluster/) read the numbers back with ``event_number``.

An event carries ``n``, one more than the last event this node persisted in that room, so a
reader sees a gap (an event not yet fetched, or lost) as a missing number. A number counts once
the homeserver has persisted the event; at a start the numbering continues from the last number
the room holds. ``event_number`` reads a number back, the same way for every reader."""

from __future__ import annotations

from typing import Any

from .. import carrier


def event_number(content: Any) -> int:
    """An event's number ``n``; 0 for one without a usable number (never delivered)."""
    n = content.get("n") if isinstance(content, dict) else None
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= carrier.MAX_NUMBER:
        return n
    return 0


class RoomNumbering:
    """The numbers of one room's events written by this node."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0  # the number of the last event persisted

    @property
    def next(self) -> int:
        """The number the event being sent carries."""
        return self.last + 1

    def persisted(self) -> int:
        """The event being sent was persisted: its number, now the last."""
        self.last += 1
        return self.last

    def continue_from(self, last: int) -> None:
        """At a start: the room's last event written by this node had this number."""
        self.last = last

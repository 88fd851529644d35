"""The one numbering of the events this node writes into a room (adapter/routing/numbering.py),
used by the lanes and the links to peers alike."""

from __future__ import annotations

from adapter import carrier
from adapter.routing.numbering import RoomNumbering, event_number


def test_numbers_are_consecutive_and_count_once_persisted() -> None:
    numbers = RoomNumbering()
    assert (numbers.last, numbers.next) == (0, 1)
    assert numbers.next == 1  # asking for the header's number twice does not spend it
    assert numbers.persisted() == 1
    assert numbers.persisted() == 2
    assert (numbers.last, numbers.next) == (2, 3)


def test_a_start_continues_from_the_rooms_last_number() -> None:
    numbers = RoomNumbering()
    numbers.continue_from(41)
    assert numbers.next == 42
    assert numbers.persisted() == 42


def test_a_number_reads_back_only_when_usable() -> None:
    assert event_number({"n": 7}) == 7
    for content in [None, {}, {"n": 0}, {"n": -1}, {"n": True}, {"n": "7"}, {"n": 1.0}]:
        assert event_number(content) == 0
    assert event_number({"n": carrier.MAX_NUMBER + 1}) == 0

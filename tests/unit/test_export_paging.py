"""How a reader beside live traffic paces its requests to the homeserver."""

from __future__ import annotations

from adapter.export.runner import Paging


def test_the_cli_reads_without_pausing() -> None:
    assert Paging().pause_after(2.0) == 0.0


def test_a_slow_answer_makes_the_next_request_wait_longer() -> None:
    paging = Paging(size=50, pause_seconds=0.1, pause_factor=4.0)
    assert paging.pause_after(0.01) == 0.1  # a quick answer: the floor
    assert paging.pause_after(0.5) == 2.0  # a busy homeserver: four times what it took

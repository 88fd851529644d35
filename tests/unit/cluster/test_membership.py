"""A node process struck off by another (taken for gone) stops serving at once."""

from __future__ import annotations

import asyncio
from typing import Any

from adapter.cluster.membership import Membership


class Store:
    """The processes' table: this process's row is struck after the first heartbeat."""

    def __init__(self) -> None:
        self.beats = 0

    async def heartbeat(self, name: str) -> bool:
        self.beats += 1
        return self.beats < 2

    async def all(self) -> list[Any]:
        return []


async def test_a_process_whose_row_is_struck_stops_at_its_next_heartbeat() -> None:
    struck = asyncio.Event()
    taken: list[str] = []

    async def take_over(name: str) -> None:
        taken.append(name)

    membership = Membership(
        Store(),  # type: ignore[arg-type]
        "p1",
        None,  # type: ignore[arg-type]
        {},
        heartbeat_seconds=0.01,
        gone_after_seconds=1.0,
        take_over=take_over,
        on_struck=struck.set,
    )
    membership._task = asyncio.create_task(membership._beat())
    async with asyncio.timeout(2):
        await struck.wait()
    await asyncio.sleep(0.05)
    assert membership._task.done()  # no beat after it was struck
    await membership.close()

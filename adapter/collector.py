"""Python's garbage collector, run on the node's schedule instead of by allocation counts.

Python collects its youngest generation every 700 net allocations of container objects, and the
whole heap every hundred of those. A node holding a few thousand sessions tracks ~300,000
objects, so a full collection holds the event loop for ~200 ms on the 2-core reference machine;
at 10,000 msg/s that came every three seconds and found next to nothing (23 full collections,
72 objects, over one run: docs/benchmark.md). The messages a node handles rarely form cycles,
so collecting less often costs little memory.

So, while the node runs, automatic collection is off and the objects that exist once it has
started (modules, classes, configuration) are frozen out of every collection. Every
``CHECK_SECONDS`` the node collects the oldest generation whose count passed its threshold, and
no generation more often than its minimum interval; a collection of a generation collects the
younger ones too. (Synapse runs its collector the same way, for the same reason.)
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence

CHECK_SECONDS = 0.1


class Collector:
    def __init__(
        self,
        thresholds: Sequence[int],
        min_intervals: Sequence[float],
        clock: Callable[[], float] = time.monotonic,
        collect: Callable[[int], int] = gc.collect,
        counts: Callable[[], tuple[int, int, int]] = gc.get_count,
    ) -> None:
        self._thresholds = tuple(thresholds)
        self._min_intervals = tuple(min_intervals)
        self._clock = clock
        self._collect = collect
        self._counts = counts
        now = clock()
        self._last = [now, now, now]

    def step(self) -> int | None:
        """Collect the oldest generation that is due; returns it, or None if none was."""
        now = self._clock()
        counts = self._counts()
        for generation in (2, 1, 0):
            if (
                counts[generation] > self._thresholds[generation]
                and now - self._last[generation] >= self._min_intervals[generation]
            ):
                self._collect(generation)
                for younger in range(generation + 1):
                    self._last[younger] = now
                return generation
        return None

    async def run(self) -> None:
        """Take the collector over until cancelled; then hand it back to Python."""
        gc.disable()
        gc.freeze()
        try:
            while True:
                await asyncio.sleep(CHECK_SECONDS)
                self.step()
        finally:
            gc.unfreeze()
            gc.enable()

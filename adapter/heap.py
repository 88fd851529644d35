"""The node process's heap and the garbage collector.

A full collection walks every tracked object, and the event loop waits meanwhile: measured under
churn (1,000 runtimes coming and going, bench/churn.py), one every ~12 s, 100 to 250 ms each, which
every connect and message in flight then waits out. About a hundred thousand of those objects
are the modules, configuration and state loaded at start, which live as long as the process:
frozen once the node is up, no collection looks at them again.

Even so, Python's own schedule (the youngest generation every 700 net allocations of container
objects, the whole heap every hundred of those) is made for programs that are not serving a
crowd: at 2,000 runtimes x 5 msg/s a node tracks ~300,000 objects of its sessions, and one run
had 23 full collections of ~220 ms each, which together found 72 objects (docs/benchmark.md).
The messages a node handles rarely form cycles, so collecting less often costs little memory.
While a node runs, the ``Collector`` therefore takes the schedule over: every ``CHECK_SECONDS``
it collects the oldest generation whose count passed its threshold (as Python counts), and no
generation more often than its minimum interval; a collection of a generation collects the
younger ones too. (Synapse runs its collector the same way, for the same reason.)

The middle generation's count is the number of young collections since its last one, so its
interval is at least ten of the youngest's: with the youngest held to once a second it ran
every ~11 s, over ~11 s of survivors, for ~170-190 ms at 10,000 msg/s (found by the stall watch,
adapter/stalls.py). The youngest every 0.1 s keeps each of them short (docs/benchmark.md).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence

CHECK_SECONDS = 0.1


def freeze_start_up_objects() -> int:
    """Collect what start-up left over, then move every object alive now out of the
    collector's sight for good. For the process that runs nodes (not a test process that
    starts and drops many: what it froze would never be freed). Returns how many objects
    were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


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
        """Take the schedule over until cancelled; then hand it back to Python."""
        gc.disable()
        try:
            while True:
                await asyncio.sleep(CHECK_SECONDS)
                self.step()
        finally:
            gc.enable()

"""The node's schedule for Python's garbage collector: a generation is collected once its count
passes its threshold, never more often than its minimum interval, the oldest due first."""

from __future__ import annotations

import asyncio
import gc

from adapter.heap import Collector


class Heap:
    """gc.get_count and gc.collect as a test drives them, on a clock it sets."""

    def __init__(self) -> None:
        self.now = 0.0
        self.counts = (0, 0, 0)
        self.collected: list[int] = []

    def collect(self, generation: int) -> int:
        self.collected.append(generation)
        counts = list(self.counts)
        for younger in range(generation + 1):
            counts[younger] = 0
        if generation < 2:
            counts[generation + 1] += 1
        self.counts = (counts[0], counts[1], counts[2])
        return 0

    def collector(self) -> Collector:
        return Collector(
            (700, 10, 10), (1.0, 10.0, 60.0), lambda: self.now, self.collect, lambda: self.counts
        )


def test_nothing_is_collected_below_the_thresholds() -> None:
    heap = Heap()
    collector = heap.collector()
    heap.now, heap.counts = 100.0, (700, 10, 10)
    assert collector.step() is None and heap.collected == []


def test_a_generation_waits_for_its_minimum_interval() -> None:
    heap = Heap()
    collector = heap.collector()
    heap.now, heap.counts = 0.5, (50_000, 0, 0)
    assert collector.step() is None
    heap.now = 1.0
    assert collector.step() == 0
    heap.counts = (50_000, 1, 0)
    heap.now = 1.5
    assert collector.step() is None  # a second after the last, not before
    assert heap.collected == [0]


def test_the_oldest_due_generation_goes_first_and_counts_for_the_younger() -> None:
    heap = Heap()
    collector = heap.collector()
    heap.now, heap.counts = 61.0, (50_000, 11, 11)
    assert collector.step() == 2
    # Collected with it: neither younger generation is due again at once.
    heap.counts = (50_000, 11, 0)
    heap.now = 61.5
    assert collector.step() is None
    heap.now = 71.0
    assert collector.step() == 1
    assert heap.collected == [2, 1]


def test_a_full_collection_comes_at_most_once_a_minute_however_busy() -> None:
    heap = Heap()
    collector = heap.collector()
    for tick in range(1, 1201):  # two minutes in steps of 0.1 s, always far over
        heap.now = tick / 10
        heap.counts = (heap.counts[0] + 100_000, heap.counts[1], heap.counts[2])
        collector.step()
    assert heap.collected.count(2) <= 2
    assert heap.collected.count(0) >= 100  # the young generation still goes every second


async def test_running_takes_the_collector_over_and_gives_it_back() -> None:
    assert gc.isenabled()
    task = asyncio.create_task(Collector((700, 10, 10), (1.0, 10.0, 60.0)).run())
    await asyncio.sleep(0.05)
    assert not gc.isenabled()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert gc.isenabled()

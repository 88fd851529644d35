"""The stall watch: a loop held past the threshold is reported once, with the code holding it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from adapter.observability import NodeMetrics, watch_event_loop
from adapter.stalls import StallWatch


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


async def _watched(threshold: float, hold: float) -> list[str]:
    stacks: list[str] = []
    watch = StallWatch(threshold, 0.02, stacks.append)
    watch.start()
    probe = asyncio.create_task(
        watch_event_loop(NodeMetrics(CollectorRegistry()).loop_lag, every=0.02, beat=watch.beat)
    )
    try:
        await asyncio.sleep(0.1)
        _hold_the_loop(hold)
        await asyncio.sleep(0.3)
    finally:
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
        watch.stop()
    return stacks


async def test_a_stall_is_reported_once_with_the_function_holding_the_loop() -> None:
    [stack] = await _watched(threshold=0.15, hold=0.6)
    assert "_hold_the_loop" in stack and "time.sleep(seconds)" in stack


async def test_a_loop_held_below_the_threshold_is_not_reported() -> None:
    assert await _watched(threshold=0.4, hold=0.1) == []


def test_a_collection_within_the_stall_is_named_with_its_length() -> None:
    now = [100.0]
    stacks: list[str] = []
    watch = StallWatch(0.15, 0.1, stacks.append, clock=lambda: now[0])
    watch.beat()
    now[0] += 0.3
    watch.collected(2, 0.2)
    with capture_logs() as logs:
        assert watch.check() is not None
        assert watch.check() is None  # once per stall
    [report] = logs
    assert (report["gc_generation"], report["gc_ms"], report["held_ms"]) == (2, 200, 200)

"""The event-loop lag probe: a callback that holds the loop shows as one late wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

from prometheus_client import CollectorRegistry

from adapter.observability import NodeMetrics, watch_event_loop, watch_garbage_collector


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


async def test_a_loop_held_for_300_ms_is_one_sample_over_250_ms() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry)
    probe = asyncio.create_task(watch_event_loop(metrics.loop_lag, every=0.02))
    try:
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # a callback holding the loop
        await asyncio.sleep(0.1)
    finally:
        probe.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe
    name = "rethink_mn_event_loop_lag_seconds"
    samples = _value(registry, f"{name}_count")
    late = samples - _value(registry, f"{name}_bucket", le="0.25")
    assert samples >= 5 and late == 1


def test_every_collection_is_observed_by_generation_until_unwatched() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry)
    unwatch = watch_garbage_collector(metrics.gc_pause)
    try:
        gc.collect()
    finally:
        unwatch()
    name = "rethink_mn_gc_pause_seconds_count"
    assert _value(registry, name, generation="2") >= 1
    before = _value(registry, name, generation="2")
    gc.collect()
    assert _value(registry, name, generation="2") == before

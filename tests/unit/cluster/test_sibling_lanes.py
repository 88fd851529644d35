"""A lane event that names rooms to read first (cluster/sibling_lanes.py): it waits for this
process's own lane too, delivered by a task of its own, and not for a room it does not know."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from adapter.cluster import sibling_lanes
from adapter.cluster.sibling_lanes import SiblingLanes
from adapter.observability import NodeMetrics


@pytest.mark.asyncio(loop_scope="session")
async def test_an_event_naming_this_processs_own_lane_waits_until_that_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No bound on the wait here: it must end because the lane was delivered, not because the
    # bound ran out (a wait that never notices would hang to the test's timeout).
    monkeypatch.setattr(sibling_lanes, "AFTER_SECONDS", 3600.0)
    delivered = {"!own:hs": 2}
    registry = CollectorRegistry()
    unused = cast(Any, None)  # nothing of these is touched before a room is followed
    siblings = SiblingLanes(unused, unused, unused, unused, NodeMetrics(registry), delivered.get)
    waiting = asyncio.create_task(siblings._read_before({"!own:hs": 3, "!struck:hs": 9}))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    delivered["!own:hs"] = 3
    await waiting
    assert registry.get_sample_value("rethink_mn_lane_waits_total") == 1
    # Already delivered that far, or a room of a process struck before this one started: it
    # returns without waiting at all.
    step = siblings._read_before({"!own:hs": 3, "!struck:hs": 9}).__await__()
    with pytest.raises(StopIteration):
        next(step)

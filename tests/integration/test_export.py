"""`rethink-mn export` on rooms filled by real traffic through the test session's Synapse."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from adapter.export.runner import export
from adapter.storage import migrate

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
D = "mn.test"
MN = f"domain://msg-node.{D}"


def read(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist()


async def test_export_counts_match_the_traffic_and_runs_are_incremental(
    start_node: NodeFactory, databases: Databases, tmp_path: Path
) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url)
    stub = f"ws://127.0.0.1:{node.stub_port}/stub/connect"
    reporter = await PyRuntime(stub, f"runtime://{D}/x-reporter").connect()
    subs = [await PyRuntime(stub, f"runtime://{D}/x-sub{i}").connect() for i in range(3)]
    out = tmp_path / "export"
    try:
        [obj] = await reporter.allocate(D, scheme="comm", endpoint="address-allocation")
        for s in subs:
            answer = await s.request(f"{MN}/sm", "subscribe", {"resources": [f"{obj}/changes"]})
            assert answer["body"]["code"] == 200
        updates = 37
        for i in range(updates):
            await reporter.send(
                {
                    "id": i,
                    "type": "update",
                    "from": obj,
                    "to": f"{obj}/changes",
                    "body": {"value": i},
                }
            )
        for s in subs:
            await s.receive_n(updates)
        await reporter.send(
            {"id": "lost", "type": "read", "from": obj, "to": f"hyperty://{D}/nobody"}
        )
        assert (await reporter.receive(5))["body"]["code"] == 404
        assert node.journal is not None and node.journal.stream is not None
        await asyncio.sleep(0.2)
        assert await node.journal.stream.flush(15)

        first = await export(node.config, out)
        # The session's homeserver is shared: the journal room also holds earlier tests' entries.
        ours = {reporter.runtime_url, *(s.runtime_url for s in subs)}
        rows = [r for r in read(out / "messages") if r["runtime"] in ours]
        receipts = read(out / "receipts")
        routed = [r for r in rows if r["kind"] == "routed"]
        assert len([r for r in routed if r["type"] == "update"]) == updates
        assert {r["to"] for r in routed} == {f"{obj}/changes"}
        assert all(r["runtime"] == reporter.runtime_url for r in routed)
        update_events = {r["event_id"] for r in routed}
        fan_out = [r["delivered"] for r in receipts if r["event_id"] in update_events]
        assert len(fan_out) == updates and set(fan_out) == {3}
        service = [r for r in rows if r["kind"] == "service_request"]
        assert sum(1 for r in service if r["service"] == "subscription") == 3
        allocation = [
            r for r in rows if r["kind"] == "service_response" and r["service"] == "allocation"
        ]
        assert [r["addresses"] for r in allocation] == [1]
        rejected = [r for r in rows if r["kind"] == "rejected_response"]
        assert [r["response_code"] for r in rejected] == [404]
        assert first.undecodable == {}

        # Nothing new: the second run adds nothing.
        second = await export(node.config, out)
        assert second.events == 0
        assert len([r for r in read(out / "messages") if r["runtime"] in ours]) == len(rows)

        # New traffic: only it is added, and no event appears twice.
        for i in range(5):
            await reporter.send(
                {"id": 100 + i, "type": "update", "from": obj, "to": f"{obj}/changes", "body": {}}
            )
        await subs[0].receive_n(5)
        await asyncio.sleep(0.2)
        await node.journal.stream.flush(15)
        third = await export(node.config, out)
        assert third.events >= 1
        after = [r for r in read(out / "messages") if r["runtime"] in ours]
        keys = [(r["event_id"], r["index_in_event"]) for r in after]
        assert len(keys) == len(set(keys))
        assert len([r for r in after if r["kind"] == "routed"]) == updates + 5
    finally:
        await reporter.close()
        for s in subs:
            await s.close()


async def test_export_cli_reports_and_survives_bad_events(
    start_node: NodeFactory, databases: Databases, tmp_path: Path
) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    node = await start_node(url)
    stub = f"ws://127.0.0.1:{node.stub_port}/stub/connect"
    rt = await PyRuntime(stub, f"runtime://{D}/x-bad").connect()
    peer = await PyRuntime(stub, f"runtime://{D}/x-peer").connect()
    try:
        [a] = await rt.allocate(D)
        [b] = await peer.allocate(D)
        await rt.send({"id": 1, "type": "ping", "from": a, "to": b})
        await peer.receive(15)
        # Garbage of our event type lands in the runtime's lane: a lane batch with neither
        # messages nor media, and an old-format batch carrying things that are not messages.
        session = node.sessions.by_runtime(rt.runtime_url)
        assert session is not None and node.lanes is not None
        room_id = node.lanes.for_session(session).room_id
        assert room_id is not None
        bot = node.api.bot
        await bot.send_event(room_id, "eu.rethink-project.mn.batch", {"v": 2, "junk": True})
        await bot.send_event(
            room_id,
            "eu.rethink-project.mn.batch",
            {"v": 1, "count": 1, "messages": ["not json", 5]},
        )
        summary = await export(node.config, tmp_path / "out")
        assert summary.undecodable.get("neither inline items nor a media reference") == 1
        rows = read(tmp_path / "out" / "messages")
        odd = [r for r in rows if r["kind"] == "routed" and r["type"] is None]
        assert len(odd) == 2  # rows for undecodable texts, with only the event columns
    finally:
        await rt.close()
        await peer.close()

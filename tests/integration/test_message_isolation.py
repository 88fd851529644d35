"""One message never harms another, through a real node and Synapse (issue 41, rows 1 and 2).

A poison message — a float id and a body nested ~1,000 deep — is refused where it enters; and
whatever slips past the door (put straight onto a lane here) stays with its own message: its
lane event's other messages are delivered, and the dashboard's and the export's rows of the
room history go on past it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest

from adapter.carrier import Routed
from adapter.export.runner import export
from adapter.node import Node
from adapter.ops.ingest import ingest_spool
from adapter.ops.layout import DashboardLayout
from adapter.ops.worker import DashboardWorker
from adapter.routing.lanes import Outgoing

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def poison_text(msg_id: str, frm: str, to: str, depth: int) -> str:
    """A message nested ``depth`` levels in its body, written as a hostile runtime would (no
    JSON library writes it: orjson refuses beyond 254 levels, the standard library recurses)."""
    head = f'{{"id":{msg_id},"type":"ping","from":{orjson.dumps(frm).decode()},'
    return f'{head}"to":{orjson.dumps(to).decode()},"body":{{"v":{deep(depth)}}}}}'


async def _pair(node: Node, name: str, acked: bool = True) -> tuple[PyRuntime, PyRuntime, str, str]:
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/{name}-alice", acked=acked).connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/{name}-bob", acked=acked).connect()
    [a] = await alice.allocate(D)
    [b] = await bob.allocate(D)
    return alice, bob, a, b


def _ping(msg_id: int, a: str, b: str) -> str:
    return orjson.dumps({"id": msg_id, "type": "ping", "from": a, "to": b}).decode()


def _lane_event(node: Node, runtime_url: str, texts: list[tuple[str, str, Any]]) -> None:
    """Put messages straight onto the lane of ``runtime_url``'s session, in one go (so that
    they travel in one event): (text, destination, the sending session) each."""
    first = node.sessions.by_runtime(runtime_url)
    assert first is not None and node.lanes is not None
    lane = node.lanes.for_session(first)
    for n, (text, to, session) in enumerate(texts, start=1):
        routed = Routed(text, (to,), session.sender(f"{session.key}.isolation"), n)
        lane.push(Outgoing(routed, session.id))


async def test_a_poison_message_is_refused_at_the_door_and_past_it_harms_no_neighbour(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice, bob, a, b = await _pair(node, "iso")
    mallory = await PyRuntime(stub_url(node), f"runtime://{D}/iso-mallory", acked=True).connect()
    try:
        [m] = await mallory.allocate(D)
        gone = f"hyperty://{D}/iso-gone"
        # At the door: answered 400 with the reason (before: 500, after a RecursionError).
        await mallory.send(poison_text("1.5", m, gone, 1000))
        refusal = await mallory.receive(10)
        assert refusal["body"]["code"] == 400, refusal
        await mallory.send(poison_text("7", m, b, 200))
        refusal = await mallory.receive(10)
        assert refusal["id"] == 7 and refusal["body"]["code"] == 400
        assert "nest" in refusal["body"]["desc"]

        # Past the door, in one lane event between an honest runtime's two messages: the
        # poison's destination went away before delivery, so its sender is to be told.
        alice_session = node.sessions.by_runtime(alice.runtime_url)
        mallory_session = node.sessions.by_runtime(mallory.runtime_url)
        _lane_event(
            node,
            alice.runtime_url,
            [
                (_ping(1, a, b), b, alice_session),
                (poison_text("1.5", m, gone, 1000), gone, mallory_session),
                (_ping(2, a, b), b, alice_session),
            ],
        )
        got = await bob.receive_n(2, 15)
        assert [g["id"] for g in got] == [1, 2]
        # Routing goes on, and no lane event was given up.
        await alice.send({"id": 3, "type": "ping", "from": a, "to": b})
        assert (await bob.receive(10))["id"] == 3
        failed = node.metrics.registry.get_sample_value(
            "rethink_mn_matrix_events_received_total", {"outcome": "delivery_failed"}
        )
        assert not failed
    finally:
        for runtime in (alice, bob, mallory):
            await runtime.close()


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist()


async def test_the_dashboard_and_the_export_go_on_past_a_deeply_nested_message(
    start_node: NodeFactory,
    databases: Databases,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row 2: a delivered message nested 300 levels deep (beyond what orjson writes) sits in
    the room history between two others. Before, every dashboard cycle failed on the spool
    holding it, for good, and the export over that range failed too."""

    async def no_stop(_self: DashboardWorker) -> None:
        return None

    # The node's tap spools the events; the worker's export step runs here, without Spark.
    monkeypatch.setattr(DashboardWorker, "start", lambda _self: None)
    monkeypatch.setattr(DashboardWorker, "stop", no_stop)
    state = tmp_path / "dashboard"
    node = await start_node(
        await databases.migrated_sqlite(),
        **{"dashboard.worker": True, "dashboard.state_dir": str(state)},
    )
    alice, bob, a, b = await _pair(node, "deep")
    try:
        # The deep message goes to a stream nobody follows (this test's runtimes could not
        # read it either: they dedupe by writing each message with orjson).
        [obj] = await alice.allocate(D, scheme="comm", endpoint="object-address-allocation")
        session = node.sessions.by_runtime(alice.runtime_url)
        texts = [
            (_ping(1, a, b), b, session),
            (poison_text("2", obj, f"{obj}/changes", 300), f"{obj}/changes", session),
            (_ping(3, a, b), b, session),
        ]
        _lane_event(node, alice.runtime_url, texts)
        got = await bob.receive_n(2, 15)
        assert [g["id"] for g in got] == [1, 3]
        # The homeserver pushes the lane event to the node, whose tap spools it.
        layout = DashboardLayout(state)
        tap = node.dashboard_tap
        assert tap is not None
        async with asyncio.timeout(15):
            while not any(obj in p.read_text() for p in layout.spool_dir.glob("*.jsonl")):
                await tap.flush()
                await asyncio.sleep(0.1)

        summary = await ingest_spool(node.config, layout)
        rows = [
            r for r in _read(layout.export_dir / "messages") if r["runtime"] == alice.runtime_url
        ]
        routed = sorted(r["msg_id"] for r in rows if r["kind"] == "routed")
        assert routed == ["1", "2", "3"], summary.as_dict()
        assert list(layout.spool_dir.glob("claimed-*")) == []  # the claim is consumed

        out = tmp_path / "export"
        await export(node.config, out)
        rows = [r for r in _read(out / "messages") if r["runtime"] == alice.runtime_url]
        assert sorted(r["msg_id"] for r in rows if r["kind"] == "routed") == ["1", "2", "3"]
    finally:
        await alice.close()
        await bob.close()

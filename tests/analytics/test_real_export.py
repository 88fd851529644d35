"""Traffic routed through the test session's Synapse, exported, analysed with Spark and drawn:
the figures equal the traffic that was sent."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from adapter.analytics.dashboard import build_dashboard
from adapter.analytics.job import run_analysis
from adapter.export.runner import export
from adapter.storage import migrate
from tests.conftest import Databases, NodeFactory
from tests.support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
D = "mn.test"
MN = f"domain://msg-node.{D}"
UPDATES = 37
PINGS = 5


def table(output: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(output / name).to_pylist()


async def route_traffic(stub_url: str) -> str:
    """The traffic whose figures the test knows; returns the publication's `to` address."""
    reporter = await PyRuntime(stub_url, f"runtime://{D}/ax-reporter").connect()
    subs = [await PyRuntime(stub_url, f"runtime://{D}/ax-sub{i}").connect() for i in range(3)]
    alice = await PyRuntime(stub_url, f"runtime://{D}/ax-alice").connect()
    bob = await PyRuntime(stub_url, f"runtime://{D}/ax-bob").connect()
    try:
        [obj] = await reporter.allocate(D, scheme="comm", endpoint="address-allocation")
        changes = f"{obj}/changes"
        for s in subs:
            answer = await s.request(f"{MN}/sm", "subscribe", {"resources": [changes]})
            assert answer["body"]["code"] == 200
        for i in range(UPDATES):
            await reporter.send(
                {"id": i, "type": "update", "from": obj, "to": changes, "body": {"value": i}}
            )
        for s in subs:
            await s.receive_n(UPDATES)

        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        for i in range(PINGS):
            await alice.send({"id": f"p{i}", "type": "ping", "from": a, "to": b})
            await bob.receive(15)
            await bob.send(
                {"id": f"p{i}", "type": "response", "from": b, "to": a, "body": {"code": 200}}
            )
            await alice.receive(15)
        await alice.send({"id": "lost", "type": "read", "from": a, "to": f"hyperty://{D}/none"})
        assert (await alice.receive(10))["body"]["code"] == 404

        await alice.allocate(D, number=3, key="ax-block")
        deleted = await alice.request(
            f"{MN}/hyperty-address-allocation", "delete", {"resource": "ax-block"}
        )
        assert deleted["body"]["code"] == 200
        return changes
    finally:
        for rt in (reporter, alice, bob, *subs):
            await rt.close()


async def test_figures_of_a_real_export_match_the_traffic(
    spark: SparkSession, start_node: NodeFactory, databases: Databases, tmp_path: Path
) -> None:
    url = databases.sqlite()
    await migrate.upgrade(url)
    # Rooms of their own (the session's homeserver is shared with other tests).
    prefix = f"_rethink_ax{secrets.token_hex(3)}_"
    node = await start_node(url, **{"appservice.alias_prefix": prefix})
    changes = await route_traffic(f"ws://127.0.0.1:{node.stub_port}/stub/connect")
    assert node.journal is not None and node.journal.stream is not None
    await asyncio.sleep(0.3)  # the last receipts reach the journal stream
    assert await node.journal.stream.flush(15)

    summary = await export(node.config, tmp_path / "export")
    assert summary.undecodable == {}
    output = tmp_path / "aggregates"
    result = await asyncio.to_thread(run_analysis, spark, tmp_path / "export", output)
    assert result["status"] == "ok"

    per_minute = table(output, "messages_per_minute")
    assert sum(r["messages"] for r in per_minute if r["type"] == "update") == UPDATES
    assert sum(r["messages"] for r in per_minute if r["type"] == "ping") == PINGS

    [fanout] = [r for r in table(output, "fanout_by_address") if r["to"] == changes]
    assert fanout["updates"] == UPDATES
    assert fanout["delivered_max"] == 3 and fanout["delivered_total"] == 3 * UPDATES

    [latency] = table(output, "latency_overall")
    assert latency["pairs"] == PINGS

    codes = {r["response_code"]: r["responses"] for r in table(output, "response_codes")}
    assert codes[404] == 1
    assert codes[200] >= PINGS  # the pongs, and the MN services' answers

    churn = table(output, "churn_per_minute")
    assert sum(r["allocated"] or 0 for r in churn) == 1 + 2 + 3  # object, two hyperties, block
    assert sum(r["deleted"] or 0 for r in churn) == 3  # the block, deleted by its key
    assert sum(r["subscribed"] or 0 for r in churn) == 3

    batching = table(output, "batching")
    routed_events = sum(
        r["events"] for r in batching if r["event_type"] == "eu.rethink-project.mn.batch"
    )
    carried = sum(
        r["events"] * r["messages_in_event"]
        for r in batching
        if r["event_type"] == "eu.rethink-project.mn.batch"
    )
    assert carried == UPDATES + 2 * PINGS and routed_events <= carried

    page = build_dashboard(output, tmp_path / "dashboard.html")
    assert page.stat().st_size > 0

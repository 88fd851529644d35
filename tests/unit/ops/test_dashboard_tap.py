"""The dashboard's export from the node's own transactions: the tap keeps the carrier events of
handled transactions, bounded in memory and on disk; the worker turns each claim of spool files
into rows exactly once, even when it dies half-way."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from adapter import carrier
from adapter.carrier import LaneEncoder, Routed, Sender
from adapter.config import NodeConfig, parse_config
from adapter.observability import NodeMetrics
from adapter.ops.ingest import claim, ingest_spool
from adapter.ops.layout import DashboardLayout
from adapter.ops.tap import EventTap, TappedTransactions
from adapter.routing.lanes import Outgoing

ALICE = Sender("k1.s", "runtime://tap.test/alice", "@_rethink_a:localhost")


def batch_event(n: int, messages: int) -> dict[str, Any]:
    items = [
        Outgoing(
            Routed(
                json.dumps(
                    {
                        "id": i,
                        "type": "read",
                        "from": "hyperty://tap.test/a",
                        "to": "hyperty://tap.test/b",
                    }
                ),
                ("hyperty://tap.test/b",),
                ALICE,
                i + 1,
            ),
            1,
        )
        for i in range(messages)
    ]
    inline = LaneEncoder().encode({"lane": 0, "n": n}, items).inline
    assert inline is not None
    return {
        "type": carrier.BATCH_EVENT,
        "event_id": f"$e{n}",
        "room_id": "!lane:hs",
        "sender": ALICE.user,
        "origin_server_ts": int(time.time() * 1000),
        "content": json.loads(inline),
    }


def spooled_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.jsonl"))


def dropped(metrics: NodeMetrics, reason: str) -> float:
    return metrics.dashboard_dropped.labels(reason)._value.get()  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def metrics() -> NodeMetrics:
    return NodeMetrics(CollectorRegistry())


async def test_only_carrier_events_reach_the_spool_in_owner_only_files(
    tmp_path: Path, metrics: NodeMetrics
) -> None:
    tap = EventTap(tmp_path, metrics, keep_seconds=3600)
    member = {"type": "m.room.member", "event_id": "$m", "content": {"membership": "join"}}
    tap.observe([batch_event(1, 3), member, batch_event(2, 1)])
    await tap.flush()
    await tap.flush()  # nothing new: no empty file
    [spooled] = spooled_files(tmp_path)
    assert stat.S_IMODE(spooled.stat().st_mode) == 0o600
    ids = [json.loads(line)["event_id"] for line in spooled.read_bytes().splitlines()]
    assert ids == ["$e1", "$e2"]


async def test_a_full_buffer_or_spool_drops_and_counts(
    tmp_path: Path, metrics: NodeMetrics
) -> None:
    event = batch_event(1, 2)
    size = len(json.dumps(event, separators=(",", ":")))
    tap = EventTap(
        tmp_path, metrics, keep_seconds=3600, max_buffered_bytes=2 * size + 10, max_spool_bytes=0
    )
    tap.observe([event, event, event])
    assert dropped(metrics, "buffer_full") == 1
    await tap.flush()  # nothing may be spooled at all
    assert list(os.listdir(tmp_path)) == []
    assert dropped(metrics, "spool_full") == 2


async def test_spool_files_older_than_the_window_are_deleted(
    tmp_path: Path, metrics: NodeMetrics
) -> None:
    old = tmp_path / f"{int((time.time() - 7200) * 1000):013d}-1-1.jsonl"
    old.write_bytes(b"{}\n")
    tap = EventTap(tmp_path, metrics, keep_seconds=3600)
    tap.observe([batch_event(1, 1)])
    await tap.flush()
    assert not old.exists() and len(spooled_files(tmp_path)) == 1


class FailingOnce:
    def __init__(self) -> None:
        self.calls = 0

    async def handle_events(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("database away")

    async def handle_ephemeral(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        pass


async def test_a_transaction_that_fails_is_kept_once_when_it_comes_again(
    tmp_path: Path, metrics: NodeMetrics
) -> None:
    tap = EventTap(tmp_path, metrics, keep_seconds=3600)
    handler = TappedTransactions(FailingOnce(), tap)
    events = [batch_event(1, 1)]
    with pytest.raises(RuntimeError):
        await handler.handle_events("t1", events)
    await handler.handle_events("t1", events)
    await tap.flush()
    [spooled] = spooled_files(tmp_path)
    assert len(spooled.read_bytes().splitlines()) == 1


async def worker_with_one_batch(
    tmp_path: Path, metrics: NodeMetrics
) -> tuple[DashboardLayout, NodeConfig, EventTap]:
    """A worker's layout and configuration, and a tap that has spooled one batch of 3."""
    layout = DashboardLayout(tmp_path / "dashboard")
    layout.prepare()
    config = parse_config({"appservice": {"as_token": "a" * 20, "hs_token": "h" * 20}})
    tap = EventTap(layout.spool_dir, metrics, keep_seconds=3600)
    tap.observe([batch_event(1, 3)])
    await tap.flush()
    return layout, config, tap


def message_ids(layout: DashboardLayout) -> list[int]:
    table = pq.read_table(layout.export_dir / "messages")
    return sorted(int(i) for i in table.column("msg_id").to_pylist())


async def test_the_worker_writes_each_spooled_message_once_even_after_dying_half_way(
    tmp_path: Path, metrics: NodeMetrics
) -> None:
    layout, config, tap = await worker_with_one_batch(tmp_path, metrics)
    # A worker claims that file, then dies before writing its rows.
    [claimed] = claim(layout.spool_dir)
    assert spooled_files(layout.spool_dir) == []
    # More traffic meanwhile; the next worker takes the old claim and a new one.
    tap.observe([batch_event(2, 2)])
    await tap.flush()
    summary = await ingest_spool(config, layout)
    assert (summary.events, summary.message_rows) == (2, 5)
    assert not claimed.directory.exists()
    assert message_ids(layout) == [0, 0, 1, 1, 2]
    # Nothing new: nothing changes.
    assert (await ingest_spool(config, layout)).events == 0
    assert message_ids(layout) == [0, 0, 1, 1, 2]


async def test_the_worker_rewrites_rather_than_repeats_a_claim_it_had_finished(
    tmp_path: Path, metrics: NodeMetrics
) -> None:
    """Died after writing the rows but before deleting the claim: the same files again."""
    layout, config, _tap = await worker_with_one_batch(tmp_path, metrics)
    [claimed] = claim(layout.spool_dir)
    shutil.copytree(claimed.directory, tmp_path / "kept")
    await ingest_spool(config, layout)
    assert message_ids(layout) == [0, 1, 2]
    shutil.copytree(tmp_path / "kept", claimed.directory)  # as if never deleted
    assert (await ingest_spool(config, layout)).events == 1
    assert message_ids(layout) == [0, 1, 2]


async def test_a_backlog_is_claimed_a_part_at_a_time(tmp_path: Path, metrics: NodeMetrics) -> None:
    tap = EventTap(tmp_path, metrics, keep_seconds=3600)
    for n in range(5):
        tap.observe([batch_event(n, 2)])
        await tap.flush()
    size = max(path.stat().st_size for path in spooled_files(tmp_path))
    claims = claim(tmp_path, max_bytes=2 * size)
    assert [len(c.events()) for c in claims] == [2, 2, 1]
    assert [e["event_id"] for c in claims for e in c.events()] == [f"$e{n}" for n in range(5)]

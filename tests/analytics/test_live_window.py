"""The live dashboard's incremental path (increments.py, window.py, ops/live_state.py) gives the
batch job's aggregates, when the same rows arrive a slice at a time."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from adapter.analytics import names
from adapter.analytics.aggregates import MINUTE_MS
from adapter.analytics.increments import OPEN_SCHEMAS, PARTIAL_LIMIT, TALKERS, increment
from adapter.analytics.job import run_analysis
from adapter.analytics.spark_schema import MESSAGES_SCHEMA, RECEIPTS_SCHEMA
from adapter.analytics.window import WRITTEN
from adapter.ops.live_state import LiveState
from tests.analytics.conftest import SPEC, AnalysedExport

SLICES = 3
HEADLINE = ("rows_read", "events", "time_range", "responses", "latency", "delivery_latency")


def _tables(export: Path, table: str) -> pa.Table:
    return pq.read_table(export / table)


def _slice_into(source: Path, live_export: Path, edges: list[int], index: int) -> None:
    """Write the rows of both tables whose `ts` falls in slice `index` as one claim's files,
    as the worker's ingest does (part-<claim>.parquet in the row's date partition)."""
    for table in ("messages", "receipts"):
        rows = _tables(source, table)
        ts = rows.column("ts")
        chosen = rows.filter(
            pc.and_(pc.greater_equal(ts, edges[index]), pc.less(ts, edges[index + 1]))
        )
        for date in set(chosen.column("date").to_pylist()):
            part = chosen.filter(pc.equal(chosen.column("date"), date)).drop_columns(["date"])
            target = live_export / table / f"date={date}"
            target.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, target / f"part-{index:03d}.parquet")


def _sorted(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rounded = [
        tuple((k, round(v, 9) if isinstance(v, float) else v) for k, v in sorted(row.items()))
        for row in rows
    ]
    return sorted(rounded, key=lambda r: tuple((v is None, str(v)) for _, v in r))


def _live(
    spark: SparkSession, source: Path, root: Path, since_ms: int, output: Path
) -> dict[str, Any]:
    messages_ts = _tables(source, "messages").column("ts")
    receipts_ts = _tables(source, "receipts").column("ts")
    low = min(pc.min(messages_ts).as_py(), pc.min(receipts_ts).as_py())
    high = max(pc.max(messages_ts).as_py(), pc.max(receipts_ts).as_py()) + 1
    edges = [low + (high - low) * i // SLICES for i in range(SLICES)] + [high]
    live = LiveState(root / "live", root / "export")
    for index in range(SLICES):
        _slice_into(source, root / "export", edges, index)
        assert live.advance(lambda: spark, since_ms) > 0
    return live.merge(output, since_ms, SPEC.top_n)


@dataclass(frozen=True)
class LiveRun:
    since: int
    root: Path  # its export (the slices) and live state
    output: Path
    merged: dict[str, Any]


def _floor(ts: int) -> int:
    return ts - ts % MINUTE_MS


@pytest.fixture(scope="module")
def whole_window(
    spark: SparkSession, analysed: AnalysedExport, tmp_path_factory: pytest.TempPathFactory
) -> LiveRun:
    """The live path over the whole export, a slice at a time (two tests compare with it)."""
    since = _floor(pc.min(_tables(analysed.export, "messages").column("ts")).as_py())
    root = tmp_path_factory.mktemp("whole-window")
    output = root / "live-out"
    return LiveRun(since, root, output, _live(spark, analysed.export, root, since, output))


@pytest.mark.parametrize("window", ["whole", "cut"])
def test_slices_give_the_batch_jobs_aggregates(
    spark: SparkSession,
    analysed: AnalysedExport,
    whole_window: LiveRun,
    tmp_path: Path,
    window: str,
) -> None:
    if window == "whole":
        since, output, got = whole_window.since, whole_window.output, whole_window.merged
    else:
        ts = _tables(analysed.export, "messages").column("ts")
        since = _floor((pc.min(ts).as_py() + pc.max(ts).as_py()) // 2)
        output = tmp_path / "live-out"
        got = _live(spark, analysed.export, tmp_path, since, output)
    batch = tmp_path / "batch"
    expected = run_analysis(spark, analysed.export, batch, top_n=SPEC.top_n, since_ms=since)

    assert expected["rows_read"]["messages"] > 1000
    for key in HEADLINE:
        assert got[key] == expected[key], key
    for name in WRITTEN:
        want = pq.read_table(batch / name).to_pylist()
        assert want, f"{name}: the export must exercise it"
        assert _sorted(pq.read_table(output / name).to_pylist()) == _sorted(want), name
    assert json.loads((output / names.SUMMARY_FILE).read_text()) == got


def test_a_worker_that_died_before_publishing_counts_nothing_twice(
    spark: SparkSession, whole_window: LiveRun, tmp_path: Path
) -> None:
    since, reference = whole_window.since, whole_window.merged
    root = tmp_path / "b"
    shutil.copytree(whole_window.root / "export", root / "export")
    live = LiveState(root / "live", root / "export")
    assert live.advance(lambda: spark, since) > 0
    # A generation written but not published: what a worker killed at that point leaves.
    half_done = root / "live" / "1"
    shutil.copytree(root / "live" / "0", half_done)
    assert live.advance(lambda: spark, since) == 0  # everything was read by generation 0
    assert not half_done.exists()
    again = live.merge(tmp_path / "b-out", since, SPEC.top_n)
    for key in HEADLINE:
        assert again[key] == reference[key], key


def test_an_unreadable_export_file_fails_one_cycle_not_every_one(
    spark: SparkSession, analysed: AnalysedExport, tmp_path: Path
) -> None:
    ts = _tables(analysed.export, "messages").column("ts")
    since = pc.min(ts).as_py() - pc.min(ts).as_py() % MINUTE_MS
    _slice_into(analysed.export, tmp_path / "export", [since, since + 10 * MINUTE_MS], 0)
    broken = next((tmp_path / "export" / "messages").glob("date=*")) / "part-broken.parquet"
    broken.write_bytes(b"PAR1 not really parquet PAR1")
    live = LiveState(tmp_path / "live", tmp_path / "export")
    with pytest.raises(Exception, match="part-broken"):
        live.advance(lambda: spark, since)
    assert not broken.exists() and broken.with_name(broken.name + ".unreadable").exists()
    assert live.advance(lambda: spark, since) > 0
    assert live.merge(tmp_path / "out", since, SPEC.top_n)["rows_read"]["messages"] > 0


def test_a_refused_request_is_its_runtimes_never_the_addresses_it_claims(
    spark: SparkSession,
) -> None:
    """Refused requests carry whatever `from` and `to` the runtime wrote: they count for the
    runtime that sent them (the node knows its session), never for the hyperty or the domains
    they name, so no runtime puts another's hyperty at the top of the talkers, or a made-up
    domain among the peers. Admitted senders are kept by address up to the cycle's bound."""
    forged = PARTIAL_LIMIT * 3
    fields = MESSAGES_SCHEMA.fieldNames()
    base = dict.fromkeys(fields)
    base.update(from_scheme="hyperty", ts=60_000)
    rows = [
        {
            **base,
            "kind": "rejected_request",
            "runtime": "rt-hostile",
            "from": "hyperty://x/victim",
            "from_domain": f"made-up-{i}.example",
            "to_domain": "x",
            "msg_id": str(i),
        }
        for i in range(forged)
    ]
    rows += [
        {**base, "kind": "routed", "runtime": f"rt-{i}", "from": f"hyperty://x/{i}"}
        | {"from_domain": "x", "to_domain": "x", "msg_id": f"b{i}"}
        for i in range(forged)
    ]
    messages = spark.createDataFrame([tuple(r[f] for f in fields) for r in rows], MESSAGES_SCHEMA)
    opened = {t: spark.createDataFrame([], schema) for t, schema in OPEN_SCHEMAS.items()}
    receipts = spark.createDataFrame([], RECEIPTS_SCHEMA)
    talkers = increment(messages, receipts, opened, 0, 60_000)[TALKERS].collect()
    hyperties = {r["sender_hyperty"] for r in talkers}
    assert "hyperty://x/victim" not in hyperties
    assert len(hyperties - {None}) == PARTIAL_LIMIT
    assert "rt-hostile" in {r["sender_runtime"] for r in talkers}
    domains = {r["from_domain"] for r in talkers} | {r["to_domain"] for r in talkers}
    assert not any(str(d).startswith("made-up-") for d in domains), domains
    assert sum(r["rows"] for r in talkers) == 2 * forged

"""Bad input gives counts and a clear message, never a crash."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from adapter.analytics import names
from adapter.analytics.job import run_analysis
from tests.support.synthetic.export import SyntheticSpec, generate_export
from tests.support.synthetic.known_answers import KnownAnswers

REPO = Path(__file__).resolve().parents[2]
SMALL = SyntheticSpec(rows=1_500, seed=5, rate_per_s=2.0, chunk_rows=800)


@pytest.fixture(scope="module")
def small_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, KnownAnswers]:
    export = tmp_path_factory.mktemp("small-export")
    return export, generate_export(export, SMALL)


@pytest.fixture
def export_copy(small_export: tuple[Path, KnownAnswers], tmp_path: Path) -> Path:
    copy = tmp_path / "export"
    shutil.copytree(small_export[0], copy)
    return copy


def _message_files(export: Path) -> list[Path]:
    return sorted((export / "messages").glob("date=*/*.parquet"))


def _rows(spark: SparkSession, output: Path, name: str) -> list[dict[str, Any]]:
    return [row.asDict() for row in spark.read.parquet(str(output / name)).collect()]


def _skipped(summary: dict[str, Any], dataset: str) -> dict[str, str]:
    return {Path(s["path"]).name: s["reason"] for s in summary["inputs"][dataset]["skipped"]}


def test_unreadable_files_among_good_ones_are_skipped_and_named(
    spark: SparkSession, small_export: tuple[Path, KnownAnswers], export_copy: Path, tmp_path: Path
) -> None:
    good = _message_files(export_copy)[0]
    (good.parent / "part-garbage.parquet").write_bytes(b"this is not parquet at all" * 10)
    (good.parent / "part-truncated.parquet").write_bytes(good.read_bytes()[:-200])
    receipts_dir = next((export_copy / "receipts").glob("date=*"))
    (receipts_dir / "part-empty.parquet").write_bytes(b"")

    summary = run_analysis(spark, export_copy, tmp_path / "out")

    known = small_export[1]
    assert summary["status"] == "partial"
    assert summary["rows_read"] == known.summary["rows_read"]
    skipped = _skipped(summary, "messages")
    assert set(skipped) == {"part-garbage.parquet", "part-truncated.parquet"}
    assert all("not a readable Parquet file" in reason for reason in skipped.values())
    assert set(_skipped(summary, "receipts")) == {"part-empty.parquet"}
    assert any("part-garbage.parquet" in note for note in summary["notes"])
    # The good files still give exactly the known answers.
    expected = known.aggregates[names.FANOUT_DISTRIBUTION]
    assertDataFrameEqual(
        spark.read.parquet(str(tmp_path / "out" / names.FANOUT_DISTRIBUTION)),
        [Row(**row) for row in expected.to_pylist()],
        checkRowOrder=False,
    )


def _corrupt_column_data(path: Path, column: str) -> None:
    """Overwrite the start of one column's data pages, keeping the footer valid."""
    metadata = pq.ParquetFile(path).metadata
    columns = [metadata.row_group(0).column(i).path_in_schema for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(columns.index(column))
    with path.open("r+b") as handle:
        handle.seek(chunk.data_page_offset + 16)
        handle.write(b"\xff" * min(256, chunk.total_compressed_size - 16))


def test_corrupt_data_behind_a_valid_footer_excludes_the_file_from_every_aggregate(
    spark: SparkSession, export_copy: Path, tmp_path: Path
) -> None:
    victim = _message_files(export_copy)[-1]
    victim_rows = pq.ParquetFile(victim).metadata.num_rows
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in _message_files(export_copy))
    # `ts` is read by some pipelines and not others: only a strict read keeps them consistent.
    _corrupt_column_data(victim, "ts")

    summary = run_analysis(spark, export_copy, tmp_path / "out")

    assert summary["status"] == "partial"
    assert summary["rows_read"]["messages"] == total - victim_rows
    assert "corrupt data" in _skipped(summary, "messages")[victim.name]
    out = tmp_path / "out"
    per_minute = sum(r["messages"] for r in _rows(spark, out, names.MESSAGES_PER_MINUTE))
    per_domain = sum(r["messages"] for r in _rows(spark, out, names.DOMAIN_TRAFFIC))
    assert per_minute == per_domain == total - victim_rows


def test_missing_columns_are_read_as_null_and_counted(
    spark: SparkSession, small_export: tuple[Path, KnownAnswers], export_copy: Path, tmp_path: Path
) -> None:
    files = _message_files(export_copy)
    for path in files:
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["service", "addresses", "body_size"]), path)

    summary = run_analysis(spark, export_copy, tmp_path / "out")

    assert summary["status"] == "ok"
    assert summary["rows_read"] == small_export[1].summary["rows_read"]
    missing = summary["inputs"]["messages"]["files_missing_column"]
    assert missing == {"addresses": len(files), "body_size": len(files), "service": len(files)}
    assert any("lack column 'service'" in note for note in summary["notes"])
    # Without `service` no row is an allocation or subscription: no churn, no crash.
    assert _rows(spark, tmp_path / "out", names.CHURN_PER_MINUTE) == []
    assert all(r["bytes"] == 0 for r in _rows(spark, tmp_path / "out", names.DOMAIN_TRAFFIC))


def test_a_column_of_the_wrong_type_skips_that_file(
    spark: SparkSession, export_copy: Path, tmp_path: Path
) -> None:
    victim = _message_files(export_copy)[0]
    table = pq.read_table(victim)
    ts_index = table.schema.get_field_index("ts")
    as_text = table.set_column(ts_index, "ts", table.column("ts").cast(pa.string()))
    pq.write_table(as_text, victim)

    summary = run_analysis(spark, export_copy, tmp_path / "out")

    assert summary["status"] == "partial"
    assert "column 'ts' has type string" in _skipped(summary, "messages")[victim.name]
    assert summary["rows_read"]["messages"] > 0


def test_missing_receipts_mean_no_receipt_for_every_routed_message(
    spark: SparkSession, export_copy: Path, tmp_path: Path
) -> None:
    shutil.rmtree(export_copy / "receipts")

    summary = run_analysis(spark, export_copy, tmp_path / "out")

    assert summary["status"] == "ok"
    assert any("receipts: no directory" in note for note in summary["notes"])
    distribution = _rows(spark, tmp_path / "out", names.FANOUT_DISTRIBUTION)
    assert [r["delivered"] for r in distribution] == [None]
    assert distribution[0]["messages"] == summary["messages"]["rows_routed"]


def test_empty_export_reports_nothing_read_and_removes_stale_aggregates(
    spark: SparkSession, tmp_path: Path
) -> None:
    export, out = tmp_path / "export", tmp_path / "out"
    (export / "messages" / "date=2025-11-21").mkdir(parents=True)
    (out / names.BATCHING).mkdir(parents=True)  # left by an earlier run

    summary = run_analysis(spark, export, out)

    assert summary["status"] == "empty"
    assert summary["rows_read"] == {"messages": 0, "receipts": 0}
    assert summary["aggregates"] == []
    assert "nothing could be read: no aggregate written" in summary["notes"]
    assert any("messages: no Parquet files" in note for note in summary["notes"])
    assert not (out / names.BATCHING).exists()
    assert json.loads((out / "summary.json").read_text())["status"] == "empty"


def test_all_files_unreadable_is_empty_not_a_crash(spark: SparkSession, tmp_path: Path) -> None:
    export = tmp_path / "export"
    for dataset in ("messages", "receipts"):
        (export / dataset / "date=2025-11-21").mkdir(parents=True)
        (export / dataset / "date=2025-11-21" / "part-0.parquet").write_text("garbage")

    summary = run_analysis(spark, export, tmp_path / "out")

    assert summary["status"] == "empty"
    assert summary["inputs"]["messages"]["files_skipped"] == 1
    assert summary["inputs"]["receipts"]["files_skipped"] == 1


def _run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "adapter" / "analytics" / "job.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",  # as spark-submit would: the script must find its package by itself
        check=False,
    )


def test_script_exits_non_zero_with_a_clear_message_when_nothing_can_be_read(
    tmp_path: Path,
) -> None:
    (tmp_path / "export" / "messages" / "date=2025-11-21").mkdir(parents=True)
    (tmp_path / "export" / "messages" / "date=2025-11-21" / "part-0.parquet").write_text("x")

    result = _run_script("--input", str(tmp_path / "export"), "--output", str(tmp_path / "out"))

    assert result.returncode == 1
    assert "part-0.parquet: not a readable Parquet file" in result.stderr
    assert "nothing could be read" in result.stderr
    assert result.stdout.startswith("empty: read 0 message rows")
    assert (tmp_path / "out" / "summary.json").exists()


def test_script_usage_error_exits_2() -> None:
    assert _run_script("--input", "/nowhere").returncode == 2


def test_distinct_values_a_runtime_chooses_cannot_grow_the_aggregates(
    spark: SparkSession, export_copy: Path, tmp_path: Path
) -> None:
    """One runtime sending 400 distinct types, codes and domains: each aggregate keeps the
    CATEGORY_LIMIT most frequent values and counts the rest as OTHER; nothing is lost."""
    good = _message_files(export_copy)[0]
    table = pq.read_table(good)
    hostile = pa.concat_tables([table] * (400 // table.num_rows + 1)).slice(0, 400)
    values = range(hostile.num_rows)
    for column, data, arrow_type in (
        ("type", ["response"] * 50 + [f"t{i}" for i in values][50:], pa.string()),
        ("response_code", [1000 + i for i in values], pa.int32()),
        ("to_domain", [f"d{i}.example" for i in values], pa.string()),
    ):
        at = hostile.schema.get_field_index(column)
        hostile = hostile.set_column(at, column, pa.array(data, arrow_type))
    pq.write_table(hostile, good.parent / "part-hostile.parquet")

    summary = run_analysis(spark, export_copy, tmp_path / "out")

    out = tmp_path / "out"
    per_minute = _rows(spark, out, names.MESSAGES_PER_MINUTE)
    types = {r["type"] for r in per_minute} - {None}
    assert len(types) <= names.CATEGORY_LIMIT + 1 and names.OTHER in types
    assert sum(r["messages"] for r in per_minute) == summary["rows_read"]["messages"]
    codes = {r["response_code"] for r in _rows(spark, out, names.RESPONSE_CODES)} - {None}
    assert all(100 <= code <= 599 for code in codes), codes
    domains = _rows(spark, out, names.DOMAIN_TRAFFIC)
    assert len({r["to_domain"] for r in domains}) <= names.CATEGORY_LIMIT + 2  # + null
    assert sum(r["messages"] for r in domains) == summary["rows_read"]["messages"]

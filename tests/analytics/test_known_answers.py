"""The job's aggregates of a synthetic export equal the answers the generator knows."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from adapter.analytics.names import AGGREGATE_NAMES
from tests.analytics.conftest import AnalysedExport


@pytest.mark.parametrize("name", AGGREGATE_NAMES)
def test_aggregate_equals_known_answer(
    spark: SparkSession, analysed: AnalysedExport, name: str
) -> None:
    expected = analysed.known.aggregates[name]
    assert expected.num_rows > 0, "the synthetic export must exercise every aggregate"
    actual = spark.read.parquet(str(analysed.output / name)).select(*expected.column_names)
    assertDataFrameEqual(actual, [Row(**row) for row in expected.to_pylist()], checkRowOrder=False)


def test_written_schema_is_the_documented_one(
    spark: SparkSession, analysed: AnalysedExport
) -> None:
    for name in AGGREGATE_NAMES:
        written = spark.read.parquet(str(analysed.output / name)).columns
        assert written == analysed.known.aggregates[name].column_names, name


def test_summary_totals_equal_known_answers(analysed: AnalysedExport) -> None:
    summary = analysed.summary
    assert summary["status"] == "ok"
    assert summary["notes"] == []
    for key, expected in analysed.known.summary.items():
        if isinstance(expected, dict):
            for inner, value in expected.items():
                assert summary[key][inner] == value, f"{key}.{inner}"
        else:
            assert summary[key] == expected, key


def test_summary_file_is_written(analysed: AnalysedExport) -> None:
    on_disk = json.loads((analysed.output / "summary.json").read_text())
    assert on_disk["rows_read"] == analysed.known.summary["rows_read"]
    assert sorted(on_disk["aggregates"]) == sorted(AGGREGATE_NAMES)

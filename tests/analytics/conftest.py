"""Fixtures of the analytics tests: one local Spark session, one analysed synthetic export."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from adapter.analytics.job import build_spark, run_analysis
from tests.support.synthetic.export import SyntheticSpec, generate_export
from tests.support.synthetic.known_answers import KnownAnswers

# Small, but crosses midnight (two date partitions), spans ~20 minutes and is made in three
# chunks, so ids and event numbers must stay unique across chunks.
SPEC = SyntheticSpec(rows=6_000, seed=11, rate_per_s=5.0, chunk_rows=2_500, top_n=10)


@dataclass(frozen=True)
class AnalysedExport:
    export: Path
    output: Path
    known: KnownAnswers
    summary: dict[str, Any]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_spark(
        master="local[1]",
        app_name="rethink-mn-analytics-tests",
        shuffle_partitions=2,
        driver_memory="1g",
        extra_conf={"spark.sql.catalogImplementation": "in-memory"},
    )
    session.sparkContext.setLogLevel("OFF")  # expected read failures would print stack traces
    yield session
    session.stop()


@pytest.fixture(scope="session")
def analysed(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> AnalysedExport:
    export = tmp_path_factory.mktemp("export")
    known = generate_export(export, SPEC)
    output = tmp_path_factory.mktemp("aggregates")
    summary = run_analysis(spark, export, output, top_n=SPEC.top_n)
    return AnalysedExport(export, output, known, summary)

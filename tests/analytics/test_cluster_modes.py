"""The job runs unchanged on a Spark standalone cluster and through Spark Connect, and its
aggregates there equal the known answers (as they do on local mode, test_known_answers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from adapter.analytics.names import AGGREGATE_NAMES
from tests.analytics.conftest import SPEC, AnalysedExport
from tests.support.spark_cluster import connect_server, spark_env, standalone_cluster

REPO = Path(__file__).resolve().parents[2]


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    rows = [
        tuple(round(v, 9) if isinstance(v, float) else v for v in row.values())
        for row in table.to_pylist()
    ]
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


def _run_job(master: str, analysed: AnalysedExport, output: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapter.analytics.job",
            *("--input", str(analysed.export), "--output", str(output)),
            *("--master", master, "--top-n", str(SPEC.top_n)),
            # Spark's default of 200 would make tiny tasks the whole cost.
            *("--shuffle-partitions", "2"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["status"] == "ok"
    for name in AGGREGATE_NAMES:
        expected = analysed.known.aggregates[name]
        actual = pq.read_table(output / name).select(expected.column_names)
        assert _rows(actual) == _rows(expected), name


def test_the_job_on_a_standalone_cluster(analysed: AnalysedExport, tmp_path: Path) -> None:
    with standalone_cluster(tmp_path / "cluster") as master:
        _run_job(master, analysed, tmp_path / "out", spark_env(tmp_path / "client"))


def test_the_job_through_spark_connect(analysed: AnalysedExport, tmp_path: Path) -> None:
    with connect_server(tmp_path / "connect") as remote:
        _run_job(remote, analysed, tmp_path / "out", spark_env(tmp_path / "client"))


def test_an_unreachable_connect_server_is_one_clear_line(
    analysed: AnalysedExport, tmp_path: Path
) -> None:
    # The Connect client alone would retry for ever.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapter.analytics.job",
            *("--input", str(analysed.export), "--output", str(tmp_path / "out")),
            *("--master", "sc://127.0.0.1:1"),
        ],
        cwd=REPO,
        env=spark_env(tmp_path / "client"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "analytics job failed: ConnectionError: Spark Connect server sc://127.0.0.1:1 "
        "unreachable: [Errno 111] Connection refused"
    ]

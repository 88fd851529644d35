"""Spark vs DuckDB on synthetic room-event exports of 1M and 10M rows.

    .venv/bin/python -m bench.analytics_bench            # 1M and 10M rows
    .venv/bin/python -m bench.analytics_bench --quick    # 10k and 100k rows, a smoke run

Exports are generated once and cached (`--data-dir`, default bench/results/analytics-data/,
git-ignored). One Spark session runs the job on each size in turn (its start-up is timed on its
own, and not counted in the job times); DuckDB then runs the same aggregations on the same files.
Both write their aggregates, which are compared row for row. Prints a table and writes a JSON
file of everything measured.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow.parquet as pq
import pyspark

from adapter.analytics.job import build_spark, run_analysis
from adapter.analytics.names import AGGREGATE_NAMES
from bench.analytics_duckdb import run_duckdb
from bench.provenance import Source, write_results
from tests.support.synthetic.export import SyntheticSpec, generate_export

REPO: Final = Path(__file__).resolve().parents[1]

GENERATOR_VERSION: Final = 1
"""Bump when the generator's output changes, so cached exports are made again."""
RESULTS: Final = REPO / "bench" / "results"
TOP_N: Final = 20


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _export(data_dir: Path, rows: int, seed: int) -> tuple[Path, dict[str, Any]]:
    """The cached export of `rows` rows, made first if needed."""
    spec = SyntheticSpec(rows=rows, seed=seed, top_n=TOP_N)
    path = data_dir / f"rows-{rows}-seed-{seed}-gen{GENERATOR_VERSION}"
    marker = path / "_synthetic.json"
    if marker.exists():
        info: dict[str, Any] = json.loads(marker.read_text())
        info["cached"] = True
        return path, info
    started = time.perf_counter()
    known = generate_export(path, spec)
    info = {
        "spec": asdict(spec),
        "rows": known.summary["rows_read"],
        "generate_s": round(time.perf_counter() - started, 2),
    }
    marker.write_text(json.dumps(info, indent=2))
    info["cached"] = False
    return path, info


def _sorted_rows(directory: Path) -> list[tuple[Any, ...]]:
    table = pq.read_table(directory)
    rows = [
        tuple(round(v, 9) if isinstance(v, float) else v for v in row.values())
        for row in table.to_pylist()
    ]
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


def _compare(spark_out: Path, duckdb_out: Path) -> dict[str, bool]:
    return {
        name: _sorted_rows(spark_out / name) == _sorted_rows(duckdb_out / name)
        for name in AGGREGATE_NAMES
    }


def _growth(times: list[float | None]) -> float | None:
    if len(times) < 2 or times[0] in (None, 0) or times[-1] is None:
        return None
    return round(times[-1] / times[0], 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=RESULTS / "analytics-data")
    parser.add_argument("--sizes", default="1000000,10000000", help="rows, comma-separated")
    parser.add_argument("--quick", action="store_true", help="sizes 10000,100000")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="results file to write")
    parser.add_argument("--no-duckdb", action="store_true")
    args = parser.parse_args(argv)
    sizes = [10_000, 100_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    args.data_dir.mkdir(parents=True, exist_ok=True)

    source = Source.begin(argv)
    results: dict[str, Any] = {
        "versions": {"pyspark": pyspark.__version__, "duckdb": duckdb.__version__},
        "runs": [],
    }
    exports = []
    for rows in sizes:
        path, info = _export(args.data_dir, rows, args.seed)
        state = "cached" if info["cached"] else f"generated in {info['generate_s']} s"
        print(f"export {rows:>11,} rows: {path} ({state})", flush=True)
        exports.append((rows, path, info))

    started = time.perf_counter()
    spark = build_spark()
    spark.sparkContext.setLogLevel("ERROR")
    results["spark_session_start_s"] = round(time.perf_counter() - started, 2)
    results["spark_conf"] = {
        key: spark.conf.get(key)
        for key in (
            "spark.master",
            "spark.driver.memory",
            "spark.sql.shuffle.partitions",
            "spark.sql.files.maxPartitionBytes",
        )
    }
    print(f"spark session started in {results['spark_session_start_s']} s", flush=True)

    out_root = args.data_dir / "out"
    for rows, path, info in exports:
        run: dict[str, Any] = {"requested_rows": rows, "rows": info["rows"], "export": str(path)}
        spark_out = out_root / f"spark-{path.name}"
        run["load_before_spark"] = _load()
        started = time.perf_counter()
        summary = run_analysis(spark, path, spark_out, top_n=TOP_N)
        run["spark_s"] = round(time.perf_counter() - started, 2)
        run["spark_steps_s"] = summary["timings_s"]
        run["spark_status"] = summary["status"]
        print(f"spark  {rows:>11,} rows: {run['spark_s']:7.2f} s", flush=True)
        if not args.no_duckdb:
            duck_out = out_root / f"duckdb-{path.name}"
            run["load_before_duckdb"] = _load()
            started = time.perf_counter()
            run["duckdb_steps_s"] = run_duckdb(path, duck_out, TOP_N)
            run["duckdb_s"] = round(time.perf_counter() - started, 2)
            run["same_results"] = _compare(spark_out, duck_out)
            agree = all(run["same_results"].values())
            print(
                f"duckdb {rows:>11,} rows: {run['duckdb_s']:7.2f} s; results "
                f"{'identical' if agree else 'DIFFER'}",
                flush=True,
            )
        results["runs"].append(run)
    spark.stop()

    spark_times = [r["spark_s"] for r in results["runs"]]
    duck_times = [r.get("duckdb_s") for r in results["runs"]]
    results["growth"] = {"spark": _growth(spark_times), "duckdb": _growth(duck_times)}
    results["load_after"] = _load()

    print()
    print(f"{'rows':>12} | {'Spark s':>8} | {'DuckDB s':>8} | same results")
    print(f"{'-' * 12}-+-{'-' * 8}-+-{'-' * 8}-+-------------")
    for run in results["runs"]:
        same = run.get("same_results")
        verdict = "-" if same is None else ("yes" if all(same.values()) else "NO")
        duck = run.get("duckdb_s")
        print(
            f"{run['rows']['messages']:>12,} | {run['spark_s']:>8.2f} | "
            f"{'-' if duck is None else f'{duck:.2f}':>8} | {verdict}"
        )
    growth = results["growth"]
    if len(sizes) > 1:
        print(
            f"growth {sizes[0]:,} -> {sizes[-1]:,} rows (x{sizes[-1] / sizes[0]:g}): "
            f"Spark x{growth['spark']}, DuckDB x{growth['duckdb']}"
        )
    print(f"Spark session start (not in the times above): {results['spark_session_start_s']} s")

    target = args.json or RESULTS / f"analytics_bench-{datetime.now(tz=UTC):%Y%m%dT%H%M%SZ}.json"
    write_results(target, results, source)
    print(f"results: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What summing the live dashboard's window costs when it holds an hour of a crowd.

    .venv/bin/python -m bench.window_merge [--generations 120] [--rows 60000] [--out FILE]

One cycle's worth of synthetic export (`--rows`, 30 s of traffic) goes through the real
incremental Spark job once (adapter/ops/live_state.py). Its generation is then copied
`--generations` times, each copy moved to later minutes (two cycles a minute, as with the
default 30 s refresh), so the window holds as many distinct minutes as an hour of that traffic.
Prints how long the window's sum (adapter/analytics/window.py, no Spark) takes, three times,
and writes them to bench/results/window_merge-<time>.json (or --out).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapter.analytics.aggregates import MINUTE_MS
from adapter.analytics.job import build_spark, quiet
from adapter.ops.live_state import CURRENT, LiveState
from bench.provenance import Source, write_results
from tests.support.synthetic.export import SyntheticSpec, generate_export

REPO = Path(__file__).resolve().parents[1]


def _shifted(source: Path, target: Path, minutes: int) -> None:
    """A copy of a generation's partials, every `minute` moved `minutes` later."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("open"))
    for path in (target / "partials").glob("*.parquet"):
        table = pq.read_table(path)
        moved = pc.add(table.column("minute"), pa.scalar(minutes * MINUTE_MS, pa.int64()))
        index = table.schema.get_field_index("minute")
        pq.write_table(table.set_column(index, "minute", moved), path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", type=int, default=120)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--out", type=Path, help="JSON results file")
    args = parser.parse_args()
    source = Source.begin()
    merges: list[dict[str, float | int]] = []
    work = Path(tempfile.mkdtemp(prefix="window-merge-"))
    try:
        spec = SyntheticSpec(rows=args.rows, seed=5, rate_per_s=args.rows / 30, top_n=20)
        generate_export(work / "export", spec)
        spark = build_spark(master="local[1]", shuffle_partitions=1)
        quiet(spark)
        live = LiveState(work / "live", work / "export")
        started = time.perf_counter()
        rows = live.advance(lambda: spark, 0)
        print(f"one increment: {rows} rows in {time.perf_counter() - started:.1f} s (cold JVM)")
        spark.stop()
        first = work / "live" / "0"
        for number in range(1, args.generations):
            _shifted(first, work / "live" / str(number), minutes=number // 2)
        (work / "live" / CURRENT).unlink()
        (work / "live" / CURRENT).symlink_to(str(args.generations - 1))
        for attempt in range(3):
            started = time.perf_counter()
            summary = live.merge(work / f"out-{attempt}", 0, 20)
            elapsed = time.perf_counter() - started
            read = summary["rows_read"]
            print(
                f"window of {args.generations} generations: {read['messages']:,} messages, "
                f"{read['receipts']:,} receipts summed in {elapsed:.2f} s"
            )
            merges.append(
                {"messages": read["messages"], "receipts": read["receipts"], "seconds": elapsed}
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = (
        args.out
        or REPO / "bench" / "results" / f"window_merge-{time.strftime('%Y%m%dT%H%M%S')}.json"
    )
    write_results(
        out, {"generations": args.generations, "rows": args.rows, "merges": merges}, source
    )
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

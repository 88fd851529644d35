"""The analytics job on local mode, a standalone cluster and Spark Connect, side by side.

    .venv/bin/python -m bench.analytics_modes                 # 10M rows
    .venv/bin/python -m bench.analytics_modes --rows 100000   # a quick look

One synthetic export (cached, as in analytics_bench.py), the job's command line run once per
mode on this machine, with the same shuffle partitions in each: `local[*]`; a standalone
master and one worker with every core (started from the pyspark package's spark-class); a
Spark Connect server whose driver runs `local[*]` (start-connect-server.sh). Each run's
aggregates are compared with local mode's, row for row. Reported per mode: the job's own
time (summary.json `timings_s.total`, start-up excluded), the whole command's wall time
(session start included), and the time to bring the cluster or server up. Writes a JSON
file of everything measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench.analytics_bench import RESULTS, _compare, _export
from bench.provenance import Source, write_results
from tests.support.spark_cluster import (
    connect_server,
    spark_env,
    standalone_cluster,
)

REPO: Final = Path(__file__).resolve().parents[1]

CORES: Final = os.cpu_count() or 1


@contextmanager
def _local(_work: Path) -> Iterator[str]:
    yield "local[*]"


MODES: Final[dict[str, Callable[[Path], AbstractContextManager[str]]]] = {
    "local": _local,
    "standalone": lambda work: standalone_cluster(work, cores=CORES, memory="6g"),
    "connect": lambda work: connect_server(work, master="local[*]", memory="4g"),
}


def _run(
    master: str, export: Path, output: Path, env: dict[str, str], partitions: int
) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapter.analytics.job",
            *("--input", str(export), "--output", str(output), "--master", master),
            *("--shuffle-partitions", str(partitions)),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"ok": False, "error": done.stderr[-2000:]}
    summary = json.loads((output / "summary.json").read_text())
    return {
        "ok": True,
        "job_s": summary["timings_s"]["total"],
        "command_s": round(wall, 2),
        "rows": summary["rows_read"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--data-dir", type=Path, default=RESULTS / "analytics-data")
    parser.add_argument("--modes", default=",".join(MODES))
    # The same in every mode: what the job chooses on local mode (4 per core). Left to Spark,
    # a cluster or Connect session takes 200, which on one small machine costs more than the
    # data (measured: 77 s instead of 18 s on 100k rows).
    parser.add_argument("--shuffle-partitions", type=int, default=4 * CORES)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    source = Source.begin(argv)

    export, info = _export(args.data_dir, args.rows, args.seed)
    print(f"export {args.rows:,} rows: {export}", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="analytics-modes-") as scratch:
        work = Path(scratch)
        for mode in args.modes.split(","):
            started = time.perf_counter()
            with MODES[mode](work / mode) as master:
                up_s = round(time.perf_counter() - started, 2)
                env = spark_env(work / "client")
                if mode == "standalone":
                    # The executor's heap (Spark's default is 1g); the driver's is the job's 4g.
                    env["PYSPARK_SUBMIT_ARGS"] = "--conf spark.executor.memory=5g pyspark-shell"
                result = _run(master, export, work / f"out-{mode}", env, args.shuffle_partitions)
            result["up_s"] = up_s if mode != "local" else 0.0
            if result["ok"] and mode != "local" and "local" in results:
                same = _compare(work / "out-local", work / f"out-{mode}")
                result["same_as_local"] = all(same.values())
            results[mode] = result
            print(f"{mode:>10}: {result}", flush=True)

    print(f"\n{'mode':>10} | job s | command s | up s | same as local")
    for mode, r in results.items():
        if r["ok"]:
            same = r.get("same_as_local", "-")
            print(
                f"{mode:>10} | {r['job_s']:5.1f} | {r['command_s']:9.1f} | {r['up_s']:4.1f} "
                f"| {same}"
            )
        else:
            print(f"{mode:>10} | failed: {r['error'][-300:]}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.json or RESULTS / f"analytics_modes-{stamp}.json"
    write_results(out, {"rows": args.rows, "export": info, "results": results}, source)
    print(f"results: {out}")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The dashboard's worker process: export what is new, add it to the window, publish, repeat.

Started by the node (adapter/ops/worker.py) as

    python -m adapter.ops.refresh --parent <node pid> < config.json

with the node's resolved configuration as JSON on stdin (its secrets never sit on a command
line). It runs apart from the node on purpose: Spark's JVM and the export's row building never
touch the node's event loop, and the process (with its JVM) runs under SCHED_IDLE: only on CPU
time the node and the homeserver leave unused. Spark gets one core by default
(`dashboard.spark_master`).

Each cycle:
1. turn the room events the node spooled since the last cycle (adapter/ops/tap.py) into export
   rows in `export/` (adapter/ops/ingest.py); the worker never reads the rooms back from the
   homeserver, which carries the live traffic;
2. delete export files whose newest row is older than the window;
3. run the incremental Spark job (adapter/analytics/increments.py) over the rows exported since
   the last cycle only, into per-minute partials (adapter/ops/live_state.py): a cycle's work
   grows with the traffic since the last cycle, not with the window;
4. sum the window's partials (adapter/analytics/window.py, no Spark) into a new
   `aggregates/<n>/` and point `current` at it (a symlink replaced atomically: the node never
   reads a half-written cycle);
5. wait `refresh_seconds` from the cycle's start, and never less than the cycle took, so the
   worker is busy half of the time at most.

`status.json` says how the last cycle went; the node shows it on the page.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final

from adapter.analytics.aggregates import MINUTE_MS
from adapter.analytics.job import DEFAULT_TOP_N, build_spark, quiet
from adapter.config import NodeConfig
from adapter.ops.ingest import ingest_spool
from adapter.ops.layout import DashboardLayout
from adapter.ops.live_state import LiveState, footer_rows_and_newest

KEEP_CYCLES: Final = 2
"""Finished aggregate directories kept (the current one and the one before, still being read)."""
NICE: Final = 10
PR_SET_PDEATHSIG: Final = 1
JVM_OPTIONS: Final = "-XX:ActiveProcessorCount=1 -XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def prune_export(export_dir: Path, before_ms: int) -> int:
    """Delete export files whose rows are all older than `before_ms`; return how many."""
    removed = 0
    for path in export_dir.glob("*/date=*/*.parquet"):
        newest = footer_rows_and_newest(path)[1]
        if newest is not None and newest < before_ms:
            path.unlink(missing_ok=True)
            removed += 1
    for directory in export_dir.glob("*/date=*"):
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when empty
    return removed


class Refresher:
    def __init__(self, config: NodeConfig, layout: DashboardLayout, parent: int) -> None:
        self._config = config
        self.parent = parent
        self._layout = layout
        self._settings = config.dashboard
        self._spark: Any = None
        self._cycle = 0
        self._fresh_session = False
        self.stopping = False

    def _spark_session(self) -> Any:
        if self._spark is None:
            self._fresh_session = True
            self._spark = build_spark(
                master=self._settings.spark_master,
                app_name="rethink-mn-dashboard",
                # One core: every further partition is one more task run one after the other
                # (measured on a crowd's window, 157k rows: 12 s a cycle with 4, 8.6 s with 1).
                shuffle_partitions=1,
                driver_memory=self._settings.spark_driver_memory,
                extra_conf={
                    "spark.sql.catalogImplementation": "in-memory",
                    # The JVM sizes its GC and compiler threads by the cores it sees; it gets
                    # one, as its Spark does (`local[1]`), instead of bursting on all of them.
                    "spark.driver.extraJavaOptions": JVM_OPTIONS,
                },
            )
            quiet(self._spark)
        return self._spark

    def cycle(self) -> dict[str, Any]:
        layout = self._layout
        started = time.time()
        exported = asyncio.run(ingest_spool(self._config, layout))
        exported_s = time.time() - started
        # The window starts at a minute's start: partials are per minute.
        since_ms = int((started - 60 * self._settings.window_minutes) * 1000)
        since_ms -= since_ms % MINUTE_MS
        pruned = prune_export(layout.export_dir, since_ms)
        live = LiveState(layout.live_dir, layout.export_dir)
        increment_started = time.time()
        try:
            # Spark (and its JVM) only once there is something new to read.
            rows = live.advance(self._spark_session, since_ms)
        except Exception:
            self.close()  # a fresh Spark session next cycle, in case this one broke
            raise
        increment_s = time.time() - increment_started
        self._cycle += 1
        target = layout.new_cycle_dir(self._cycle)
        summary = live.merge(target, since_ms, DEFAULT_TOP_N)
        layout.publish(target)
        layout.drop_old_cycles(KEEP_CYCLES)
        return {
            "state": "ok",
            "finished_ms": int(time.time() * 1000),
            "cycle_seconds": round(time.time() - started, 3),
            "export_seconds": round(exported_s, 3),
            "exported_events": exported.events,
            # Events skipped by reason (each skipped alone: the cycle goes on past it).
            "skipped_events": exported.undecodable,
            "pruned_files": pruned,
            "rows_added": rows,
            "increment_seconds": round(increment_s, 3),
            "rows_in_window": summary.get("rows_read"),
            "window_minutes": self._settings.window_minutes,
        }

    def run(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            try:
                status = self.cycle()
            except Exception as exc:  # noqa: BLE001 - one bad cycle must not end the worker
                status = {
                    "state": "failed",
                    "finished_ms": int(time.time() * 1000),
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
                print(f"dashboard cycle failed: {status['error']}", file=sys.stderr, flush=True)
            # A cycle that started Spark (its JVM, then every query compiled cold) is no
            # measure of the next: it does not stretch the wait, or the first figures after
            # start-up would stay a whole cold cycle longer than need be.
            elapsed = time.monotonic() - started
            floor = 0.0 if self._fresh_session else elapsed
            self._fresh_session = False
            status["next_in_seconds"] = round(
                max(self._settings.refresh_seconds - elapsed, floor), 1
            )
            self._layout.write_status(status)
            deadline = time.monotonic() + status["next_in_seconds"]
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(min(0.5, deadline - time.monotonic()))
                self.stopping = self.stopping or os.getppid() != self.parent
        self.close()

    def close(self) -> None:
        if self._spark is not None:
            with contextlib.suppress(Exception):  # the JVM may already be gone with its group
                self._spark.stop()
            self._spark = None


def _yield_the_cpu() -> None:
    """Run only on CPU time nobody else wants, and on one CPU only; both are inherited by
    Spark's JVM and all its threads.

    Measured under a crowd of 200 x 5 msg/s on 2 cores (docs/benchmark.md, "The live dashboard
    under a crowd"): at nice 10 alone the worker took the crowd's p99 from 87 to 390 ms; under
    SCHED_IDLE but free to move, the JVM's threads still cost 30-50 ms at p99; kept on one CPU
    they cost 5-15 ms, and nothing at p50.
    """
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(NICE)
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def _die_with_parent(parent: int) -> None:
    """End with the node, even when it is killed: Linux sends SIGTERM when the parent dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the line above
        raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="adapter.ops.refresh")
    parser.add_argument("--parent", type=int, required=True, help="the node's pid")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    config = NodeConfig.model_validate_json(sys.stdin.read())
    _yield_the_cpu()
    layout = DashboardLayout(Path(config.dashboard.state_dir))
    layout.prepare()
    refresher = Refresher(config, layout, args.parent)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        # A cycle in progress is dropped: a claimed spool is taken again by the next worker,
        # and nothing half-analysed was published.
        refresher.stopping = True
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        refresher.run()
    finally:
        refresher.close()
    return 0


if __name__ == "__main__":
    # Spark's Python workers (if any) run the same interpreter as this process.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    raise SystemExit(main())

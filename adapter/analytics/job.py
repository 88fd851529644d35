"""The analytics job: room-event export (Parquet) in, Parquet aggregates and summary.json out.

Run it as a module, a script or through spark-submit, unchanged:

    python -m adapter.analytics.job --input <export dir> --output <aggregates dir>
    spark-submit --master <cluster> --driver-memory 4g \
        adapter/analytics/job.py --input <export dir> --output <aggregates dir>

(spark-submit from the project's venv wants `PYSPARK_PYTHON=.venv/bin/python` and the venv's
bin on PATH.) Only the DataFrame API is used (no Python UDFs), so executors need no project
code; the driver needs pyarrow. Exit codes: 0 something was analysed (summary.json says what was
skipped), 1 nothing could be read or the job failed, 2 bad usage. An export without a single
readable file is answered at once, without starting Spark.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

if __package__ in (None, ""):
    # Started as a file (spark-submit .../job.py): make the repository root importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from adapter.analytics import aggregates as agg
from adapter.analytics import names
from adapter.analytics.inventory import DatasetInventory, inventory_dataset
from adapter.analytics.output import OutputDir
from adapter.analytics.schema import MESSAGES_ARROW_SCHEMA, RECEIPTS_ARROW_SCHEMA
from adapter.analytics.spark_schema import MESSAGES_SCHEMA, RECEIPTS_SCHEMA

EXIT_OK, EXIT_NOTHING_READ, EXIT_USAGE = 0, 1, 2
DEFAULT_APP_NAME: Final = "rethink-mn-analytics"
DEFAULT_TOP_N: Final = 20
CONNECT_DEFAULT_PORT: Final = 15002


def _started_by_spark_submit() -> bool:
    # spark-submit starts the JVM first and hands the Python driver its gateway port.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_spark(
    master: str | None = None,
    app_name: str = DEFAULT_APP_NAME,
    shuffle_partitions: int | None = None,
    driver_memory: str = "4g",
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the job: `local[*]` unless a master is given or spark-submit chose one.

    Started here (not by spark-submit), the web UI and progress bar are off (a batch job, and
    the UI costs start-up time) and the driver gets `driver_memory`; under spark-submit those
    stay whatever its command line says.
    """
    if master is not None and master.startswith("sc://"):
        # Spark Connect: the server has its own master and settings; only the session's are ours.
        _reachable(master)
        remote = SparkSession.builder.remote(master).getOrCreate()
        remote.conf.set("spark.sql.session.timeZone", "UTC")
        if shuffle_partitions is not None:
            remote.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        return remote
    submitted = _started_by_spark_submit()
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not submitted:
        builder = builder.master("local[*]")
    if not submitted:
        builder = (
            builder.config("spark.driver.memory", driver_memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
        )
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _local_defaults(spark)
    return spark


def _reachable(remote: str, timeout: float = 10.0) -> None:
    """Fail at once when nothing answers at a Spark Connect URL: the client itself would retry
    for ever."""
    authority = remote.removeprefix("sc://").split("/", 1)[0]
    host, _, port = authority.rpartition(":") if ":" in authority else (authority, "", "")
    address = (host.strip("[]") or "localhost", int(port or CONNECT_DEFAULT_PORT))
    try:
        socket.create_connection(address, timeout).close()
    except OSError as exc:
        raise ConnectionError(f"Spark Connect server {remote} unreachable: {exc}") from None


def is_remote(spark: SparkSession) -> bool:
    """A Spark Connect session (it has no SparkContext on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def quiet(spark: SparkSession) -> None:
    """Only errors from the JVM on stderr (a Connect server logs on its own side)."""
    if not is_remote(spark):
        spark.sparkContext.setLogLevel("ERROR")


def _local_defaults(spark: SparkSession) -> None:
    """On one machine, use 4 shuffle partitions per core and 32 MB input splits.

    Spark's defaults (200 partitions, 128 MB splits) suit a cluster: on 2 cores they make many
    tiny tasks, and a few 128 MB splits leave a core idle at the end of each scan (measured).
    Settings the user gave (builder, spark-submit --conf) win.
    """
    context = spark.sparkContext
    if not (context.master or "").startswith("local"):
        return
    chosen = context.getConf()
    if not chosen.contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(4 * context.defaultParallelism))
    if not chosen.contains("spark.sql.files.maxPartitionBytes"):
        spark.conf.set("spark.sql.files.maxPartitionBytes", "32m")


def _read_dataset(
    spark: SparkSession, inventory: DatasetInventory, schema: StructType
) -> DataFrame:
    empty = spark.createDataFrame([], schema)
    if inventory.listed:
        if not inventory.readable_files:
            return empty
        return (
            spark.read.schema(schema)
            .option("basePath", inventory.root)
            .parquet(*inventory.readable_files)
        )
    try:
        return spark.read.schema(schema).parquet(inventory.root)
    except AnalysisException:
        return empty


def _as_int(value: Any) -> int:
    return int(value) if value is not None else 0


def _input_messages(
    inputs: Mapping[str, DatasetInventory], rows: Mapping[str, int], windowed: bool = False
) -> list[str]:
    """Plain-language notes on what was read and skipped, for the operator."""
    notes: list[str] = []
    for name, inventory in inputs.items():
        if not inventory.listed:
            notes.append(
                f"{name}: could not list {inventory.root} on the driver "
                f"({inventory.listing_error}); Spark skipped unreadable files without itemising"
            )
        elif not inventory.root_exists:
            notes.append(f"{name}: no directory {inventory.root}")
        elif not inventory.readable_files and not inventory.skipped:
            notes.append(f"{name}: no Parquet files under {inventory.root}")
        for skipped in inventory.skipped:
            notes.append(f"{name}: skipped {skipped.path}: {skipped.reason}")
        for column, files in sorted(inventory.missing_columns.items()):
            notes.append(f"{name}: {files} file(s) lack column {column!r}; read as null")
        # With a time window the rows before it are left out on purpose.
        lost = inventory.footer_rows - rows[name] if inventory.listed and not windowed else 0
        if lost > 0:
            notes.append(
                f"{name}: {lost} row(s) announced by file footers are missing from the results"
            )
    return notes


def _first(frame: DataFrame) -> dict[str, Any]:
    row = frame.first()
    return row.asDict() if row is not None else {}


class _Run:
    """Book-keeping of one analysis: timings, cached rollups, written aggregates."""

    def __init__(self, output: OutputDir) -> None:
        self.output = output
        self.started = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.cached: list[DataFrame] = []
        self.written: dict[str, list[dict[str, Any]]] = {}

    def rollup(self, name: str, frame: DataFrame) -> DataFrame:
        """Materialise a (small) rollup once, cached for the aggregates derived from it."""
        started = time.perf_counter()
        kept = frame.persist(StorageLevel.MEMORY_AND_DISK)
        kept.count()
        self.cached.append(kept)
        self.timings[name] = round(time.perf_counter() - started, 3)
        return kept

    def write(self, name: str, frame: DataFrame) -> list[dict[str, Any]]:
        started = time.perf_counter()
        self.written[name] = self.output.write_aggregate(name, frame)
        self.timings[name] = round(time.perf_counter() - started, 3)
        return self.written[name]

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        self.cached.clear()

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        self.release()
        self.timings["total"] = round(time.perf_counter() - self.started, 3)
        summary["timings_s"] = self.timings
        text = json.dumps(summary, indent=2, default=str)
        if self.output.write_text(names.SUMMARY_FILE, text) is None:
            print(text)  # output not reachable from the driver: the summary still goes somewhere
        return summary


Inputs = dict[str, DatasetInventory]


def inventory_inputs(input_dir: str | Path) -> Inputs:
    """List and check the files of both datasets of an export (driver only, no Spark)."""
    input_uri = str(input_dir)
    return {
        "messages": inventory_dataset(input_uri, "messages", MESSAGES_ARROW_SCHEMA),
        "receipts": inventory_dataset(input_uri, "receipts", RECEIPTS_ARROW_SCHEMA),
    }


def nothing_to_read(inputs: Inputs) -> bool:
    """True when the driver could list both datasets and found no readable file in either."""
    return all(i.listed and not i.readable_files for i in inputs.values())


def _base_summary(input_dir: str | Path, output_dir: str | Path, inputs: Inputs) -> dict[str, Any]:
    return {
        "input": str(input_dir),
        "output": str(output_dir),
        "inputs": {name: inventory.report() for name, inventory in inputs.items()},
    }


def _empty(run: _Run, summary: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    notes.append("nothing could be read: no aggregate written")
    for name in names.AGGREGATE_NAMES:
        run.output.remove(name)
    summary.update(status="empty", notes=notes, aggregates=[])
    return run.finish(summary)


def write_empty_summary(
    input_dir: str | Path, output_dir: str | Path, inputs: Inputs
) -> dict[str, Any]:
    """The summary of an export with no readable file, written without starting Spark."""
    run = _Run(OutputDir(str(output_dir)))
    zero = {"messages": 0, "receipts": 0}
    summary = {**_base_summary(input_dir, output_dir, inputs), "rows_read": zero}
    return _empty(run, summary, _input_messages(inputs, zero))


def _unreadable_file(error: Exception, inputs: Inputs) -> tuple[DatasetInventory, str] | None:
    """The input file a failed Spark job names in its error, if it is one of ours."""
    text = str(error)
    if "FAILED_READ_FILE" not in text and "Encountered error while reading file" not in text:
        return None
    found = [
        (len(path), inventory, path)
        for inventory in inputs.values()
        for path in inventory.readable_files
        if path.split("://", 1)[-1] in text
    ]
    if not found:
        return None
    _, inventory, path = max(found, key=lambda match: match[0])
    return inventory, path


def _first_line(error: Exception) -> str:
    for line in str(error).splitlines():
        if "Exception" in line or "Error" in line:
            return line.strip(" :")[:300]
    return str(error).strip()[:300]


def run_analysis(
    spark: SparkSession,
    input_dir: str | Path,
    output_dir: str | Path,
    *,
    top_n: int = DEFAULT_TOP_N,
    inputs: Inputs | None = None,
    since_ms: int | None = None,
) -> dict[str, Any]:
    """Compute every aggregate of `input_dir` into `output_dir`; return (and write) the summary.

    Never raises for bad input: unreadable files are skipped and listed in the summary, whose
    `status` is `ok`, `partial` (something skipped) or `empty` (no row could be read; then no
    aggregate is written and earlier ones in `output_dir` are removed). `inputs` is the result of
    `inventory_inputs(input_dir)` when the caller already has it. With `since_ms` only rows whose
    `ts` is at or after it are analysed (the live dashboard's window).

    A file whose footer is fine but whose data is corrupt only fails when a pipeline decodes the
    broken column. Spark's ignoreCorruptFiles would then drop it from that pipeline only (each
    reads different columns), leaving aggregates that disagree. So reading stays strict, and a
    read failure that names one of our files excludes that file and restarts the analysis: every
    aggregate is computed from the same files, and the file is listed as skipped.
    """
    started = time.perf_counter()
    inputs = inputs if inputs is not None else inventory_inputs(input_dir)
    inventory_s = round(time.perf_counter() - started, 3)
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "false")
    spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")
    while True:
        run = _Run(OutputDir(str(output_dir)))
        run.timings["inventory"] = inventory_s
        try:
            return _analyse(spark, run, inputs, input_dir, output_dir, top_n, since_ms)
        except (Py4JJavaError, PySparkException) as error:
            run.release()
            culprit = _unreadable_file(error, inputs)
            if culprit is None:
                raise
            inventory, path = culprit
            inventory.exclude(path, f"corrupt data, reading failed: {_first_line(error)}")


@dataclass(frozen=True)
class _Findings:
    """What summary.json takes from the aggregates as they are written."""

    codes: list[dict[str, Any]]
    routes: list[dict[str, Any]]
    overall: list[dict[str, Any]]
    distribution: list[dict[str, Any]]
    events: list[dict[str, Any]]
    operations: dict[str, Any]
    null_fields: dict[str, Any]


def _analyse(
    spark: SparkSession,
    run: _Run,
    inputs: Inputs,
    input_dir: str | Path,
    output_dir: str | Path,
    top_n: int,
    since_ms: int | None,
) -> dict[str, Any]:
    messages = _read_dataset(spark, inputs["messages"], MESSAGES_SCHEMA)
    receipts = _read_dataset(spark, inputs["receipts"], RECEIPTS_SCHEMA)
    if since_ms is not None:
        messages = messages.where(F.col("ts") >= since_ms)
        receipts = receipts.where(F.col("ts") >= since_ms)

    traffic = run.rollup("traffic_rollup", agg.traffic_rollup(messages))
    per_message = run.rollup("message_rollup", agg.message_rollup(messages, receipts))
    fanout = run.rollup("fanout_rollup", agg.fanout_rollup(per_message))
    totals = _first(agg.message_totals(traffic))
    receipt_totals = _first(agg.fanout_totals(fanout))
    rows = {
        "messages": _as_int(totals.get("rows")),
        "receipts": _as_int(receipt_totals.get("receipt_rows")),
    }
    notes = _input_messages(inputs, rows, windowed=since_ms is not None)
    summary = {**_base_summary(input_dir, output_dir, inputs), "rows_read": rows}
    if since_ms is not None:
        summary["since_ms"] = since_ms
    if rows["messages"] + rows["receipts"] == 0:
        return _empty(run, summary, notes)

    findings = _write_aggregates(run, messages, traffic, per_message, fanout, top_n, notes)
    summary.update(
        status="ok" if _read_whole(inputs, rows, windowed=since_ms is not None) else "partial",
        notes=notes,
        **_traffic_summary(findings, totals, receipt_totals),
        aggregates=list(run.written),
    )
    return run.finish(summary)


def _write_aggregates(
    run: _Run,
    messages: DataFrame,
    traffic: DataFrame,
    per_message: DataFrame,
    fanout: DataFrame,
    top_n: int,
    notes: list[str],
) -> _Findings:
    """Writes every aggregate but the empty export's; a caveat on one goes to ``notes``."""
    talkers = run.rollup("talker_rollup", agg.talker_rollup(messages))
    run.write(names.MESSAGES_PER_MINUTE, agg.messages_per_minute(traffic))
    run.write(names.DOMAIN_TRAFFIC, agg.domain_traffic(talkers))
    run.write(names.TOP_TALKERS, agg.top_talkers(talkers, top_n))
    codes = run.write(names.RESPONSE_CODES, agg.response_codes(traffic))
    run.write(names.ERROR_RATE_PER_MINUTE, agg.error_rate_per_minute(traffic))
    run.write(names.ERRORS_PER_MINUTE, agg.errors_per_minute(traffic))
    times = agg.delivery_times(per_message)
    routes = run.write(
        names.DELIVERY_LATENCY,
        agg.delivery_latency_by_route(times, agg.domain_names(talkers)),
    )
    run.write(names.DELIVERY_LATENCY_PER_MINUTE, agg.delivery_latency_per_minute(times))
    pairs = run.rollup("latency_pairs", agg.latency_pairs(messages))
    overall = run.write(names.LATENCY_OVERALL, agg.latency_overall(pairs))
    run.write(names.LATENCY_BY_TYPE, agg.latency_by_type(pairs))
    distribution = run.write(names.FANOUT_DISTRIBUTION, agg.fanout_distribution(fanout))
    addresses = run.rollup("update_addresses", agg.update_addresses(messages))
    run.write(names.FANOUT_BY_ADDRESS, agg.fanout_by_address(fanout, addresses))
    collisions = addresses.where(F.col("addresses_with_hash") > 1).count()
    if collisions:
        notes.append(
            f"fanout_by_address: {collisions} update addresses share a 64-bit hash; "
            "their totals are merged"
        )
    churn = run.rollup("churn_rollup", agg.churn_rollup(messages))
    operations = _first(agg.service_operation_totals(churn))
    run.write(names.CHURN_PER_MINUTE, agg.churn_per_minute(churn))
    events = run.write(names.BATCHING, agg.batching(messages))
    return _Findings(
        codes=codes,
        routes=routes,
        overall=overall,
        distribution=distribution,
        events=events,
        operations=operations,
        null_fields=_first(agg.null_field_totals(talkers)),
    )


def _read_whole(inputs: Inputs, rows: dict[str, int], *, windowed: bool) -> bool:
    """Whether every input file was read and (unless windowed) every row its footer lists."""
    lost = sum(
        inventory.footer_rows - rows[name]
        for name, inventory in inputs.items()
        if inventory.listed and not windowed
    )
    skipped = sum(len(inventory.skipped) for inventory in inputs.values())
    return not skipped and lost <= 0


def _traffic_summary(
    findings: _Findings, totals: dict[str, Any], receipt_totals: dict[str, Any]
) -> dict[str, Any]:
    """summary.json's sections on the traffic, from the totals and the aggregates written."""
    codes = findings.codes
    coded = [row for row in codes if row["response_code"] is not None]
    responses_coded = sum(row["responses"] for row in coded)
    errors = sum(row["responses"] for row in coded if row["response_code"] >= 400)
    latency = findings.overall[0] if findings.overall else {}
    delivery = next((row for row in findings.routes if row["all_routes"]), {})
    distribution = findings.distribution
    operations = findings.operations
    return {
        "messages": {
            **{
                key: value
                for key, value in totals.items()
                if key not in ("rows", "ts_min", "ts_max")
            },
            **findings.null_fields,
        },
        "events": sum(row["events"] for row in findings.events),
        "time_range": {"ts_min": totals.get("ts_min"), "ts_max": totals.get("ts_max")},
        "responses": {
            "total": sum(row["responses"] for row in codes),
            "with_code": responses_coded,
            "errors": errors,
            "error_rate": errors / responses_coded if responses_coded else None,
        },
        "latency": {
            "pairs": _as_int(latency.get("pairs")),
            "p50_ms": latency.get("p50_ms"),
            "p99_ms": latency.get("p99_ms"),
        },
        "delivery_latency": {
            "pairs": _as_int(delivery.get("pairs")),
            "p50_ms": delivery.get("p50_ms"),
            "p99_ms": delivery.get("p99_ms"),
        },
        "fanout": {
            "routed_messages": sum(row["messages"] for row in distribution),
            "without_receipt": sum(
                row["messages"] for row in distribution if row["delivered"] is None
            ),
            "receipt_rows_without_message": _as_int(
                receipt_totals.get("receipt_rows_without_message")
            ),
        },
        "service_operations": {
            "allocation_and_subscription_requests": _as_int(operations.get("operations")),
            "unanswered": _as_int(operations.get("unanswered")),
        },
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adapter.analytics.job",
        description="Aggregate a rethink-mn room-event export (Parquet) into Parquet aggregates",
    )
    parser.add_argument("--input", required=True, help="export directory (messages/, receipts/)")
    parser.add_argument("--output", required=True, help="directory for the aggregates")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--shuffle-partitions", type=int, default=None)
    parser.add_argument("--top-n", type=int, default=DEFAULT_TOP_N, help="talkers kept per kind")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    inputs = inventory_inputs(args.input)
    if nothing_to_read(inputs):
        # No JVM for an export with nothing in it: answer at once.
        summary = write_empty_summary(args.input, args.output, inputs)
    else:
        spark: SparkSession | None = None
        try:
            spark = build_spark(master=args.master, shuffle_partitions=args.shuffle_partitions)
            quiet(spark)
            summary = run_analysis(spark, args.input, args.output, top_n=args.top_n, inputs=inputs)
        except (PySparkException, Py4JError, OSError, pa.ArrowException) as exc:
            # The operator gets one line, not a JVM stack trace.
            print(f"analytics job failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_NOTHING_READ
        finally:
            if spark is not None:
                spark.stop()
    for note in summary["notes"]:
        print(note, file=sys.stderr)
    rows = summary["rows_read"]
    print(
        f"{summary['status']}: read {rows['messages']} message rows and {rows['receipts']} "
        f"receipt rows; summary in {args.output.rstrip('/')}/{names.SUMMARY_FILE}"
    )
    return EXIT_NOTHING_READ if summary["status"] == "empty" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

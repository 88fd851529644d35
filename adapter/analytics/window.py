"""The live dashboard's window: the partials of every cycle (increments.py) summed into the
batch job's aggregates and summary, with pyarrow and plain Python, no Spark.

Partials are small by construction (per minute: types x kinds x codes, routes x distinct
milliseconds, senders), so summing an hour of them takes a fraction of a second, whatever the
traffic was. The output directory has the batch job's layout (one Parquet file per aggregate,
summary.json) for the aggregates the dashboard shows, with the same definitions
(aggregates.py's module doc); the bounds on categories are applied here, over the window.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from adapter.analytics import names
from adapter.analytics.aggregates import CHURN_OPERATIONS, PERCENTILES
from adapter.analytics.increments import (
    BATCHING,
    CHURN,
    DELIVERIES,
    FANOUT,
    RECEIPT_ROWS,
    REQUESTS,
    TALKERS,
    TRAFFIC,
)
from adapter.analytics.names import CATEGORY_LIMIT, OTHER
from adapter.analytics.output import PART_FILE

Row = dict[str, Any]
Rows = list[Row]

WRITTEN: Final = (
    names.MESSAGES_PER_MINUTE,
    names.DOMAIN_TRAFFIC,
    names.TOP_TALKERS,
    names.RESPONSE_CODES,
    names.ERROR_RATE_PER_MINUTE,
    names.ERRORS_PER_MINUTE,
    names.DELIVERY_LATENCY,
    names.DELIVERY_LATENCY_PER_MINUTE,
    names.LATENCY_OVERALL,
    names.LATENCY_BY_TYPE,
    names.FANOUT_DISTRIBUTION,
    names.CHURN_PER_MINUTE,
    names.BATCHING,
)
"""The batch job's aggregates the window computes (fanout_by_address is the batch job's only)."""


def read_partials(files: Iterable[Path], since_ms: int) -> Rows:
    """The rows of `files` (one partial table of several cycles) from `since_ms` on."""
    rows: Rows = []
    for path in files:
        table = pq.read_table(path)
        rows.extend(
            row
            for row in table.to_pylist()
            if row["minute"] is not None and row["minute"] >= since_ms
        )
    return rows


def _sum_by(rows: Iterable[Row], key: Callable[[Row], Hashable], value: str) -> dict[Any, int]:
    sums: dict[Any, int] = defaultdict(int)
    for row in rows:
        sums[key(row)] += row[value] or 0
    return sums


def fold(rows: Rows, column: str, weight: str | None) -> Rows:
    """`rows` with `column` kept for its CATEGORY_LIMIT heaviest values (by the sum of `weight`,
    or the number of rows; ties by value) and OTHER for the rest; nulls stay."""
    totals: dict[Any, int] = defaultdict(int)
    for row in rows:
        if row[column] is not None:
            totals[row[column]] += row[weight] if weight else 1
    kept = {v for v, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:CATEGORY_LIMIT]}
    return [
        row if row[column] is None or row[column] in kept else {**row, column: OTHER}
        for row in rows
    ]


def latency_stats(histogram: Mapping[int, int]) -> Row:
    """pairs, p50/p90/p99 (nearest rank, as Spark's percentile_disc), max_ms of a histogram
    {latency_ms: count}."""
    pairs = sum(histogram.values())
    stats: Row = {"pairs": pairs}
    ordered = sorted(histogram.items())
    for name, p in PERCENTILES:
        rank = max(1, math.ceil(p * pairs))
        seen, value = 0, None
        for latency, count in ordered:
            seen += count
            if seen >= rank:
                value = latency
                break
        stats[name] = value if pairs else None
    stats["max_ms"] = ordered[-1][0] if ordered else None
    return stats


def _histograms(rows: Rows, key: Callable[[Row], Hashable]) -> dict[Any, dict[int, int]]:
    grouped: dict[Any, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        grouped[key(row)][row["latency_ms"]] += row["pairs"]
    return grouped


def _traffic(traffic: Rows) -> dict[str, Rows]:
    messages = _sum_by(traffic, lambda r: (r["minute"], r["type"]), "rows")
    responses = [r for r in traffic if r["type"] == "response"]
    coded = [r for r in responses if r["response_code"] is not None]
    failed = [r for r in coded if r["response_code"] >= 400]
    per_minute = _sum_by(coded, lambda r: r["minute"], "rows")
    errors = _sum_by(failed, lambda r: r["minute"], "rows")
    errors_by_code = _sum_by(failed, lambda r: (r["minute"], r["response_code"]), "rows")
    return {
        names.MESSAGES_PER_MINUTE: [
            {"minute": m, "type": t, "messages": n} for (m, t), n in messages.items()
        ],
        names.RESPONSE_CODES: [
            {"response_code": c, "responses": n}
            for c, n in _sum_by(responses, lambda r: r["response_code"], "rows").items()
        ],
        names.ERROR_RATE_PER_MINUTE: [
            {"minute": m, "responses": n, "errors": errors[m], "error_rate": errors[m] / n}
            for m, n in per_minute.items()
        ],
        names.ERRORS_PER_MINUTE: [
            {"minute": m, "response_code": c, "responses": n}
            for (m, c), n in errors_by_code.items()
        ],
    }


def _talkers(talkers: Rows, top_n: int) -> dict[str, Rows]:
    domains = fold(fold(talkers, "from_domain", "rows"), "to_domain", "rows")
    route = lambda r: (r["from_domain"], r["to_domain"])  # noqa: E731
    messages, volume = _sum_by(domains, route, "rows"), _sum_by(domains, route, "bytes")
    ranked: Rows = []
    for talker, column in (("runtime", "sender_runtime"), ("hyperty", "sender_hyperty")):
        sent = [r for r in talkers if r[column] is not None]
        counts = _sum_by(sent, itemgetter(column), "rows")
        sizes = _sum_by(sent, itemgetter(column), "bytes")
        order = sorted(counts, key=lambda a: (-counts[a], a))[:top_n]
        ranked += [
            {"talker": talker, "rank": i, "address": a, "messages": counts[a], "bytes": sizes[a]}
            for i, a in enumerate(order, start=1)
        ]
    return {
        names.DOMAIN_TRAFFIC: [
            {"from_domain": f, "to_domain": t, "messages": n, "bytes": volume[(f, t)]}
            for (f, t), n in messages.items()
        ],
        names.TOP_TALKERS: ranked,
    }


def _latencies(deliveries: Rows, requests: Rows) -> dict[str, Rows]:
    by_route = _histograms(deliveries, lambda r: (r["from_domain"], r["to_domain"]))
    overall = _histograms(deliveries, lambda r: None)
    routes = [
        {"all_routes": False, "from_domain": f, "to_domain": t, **latency_stats(h)}
        for (f, t), h in by_route.items()
    ]
    if overall:
        routes.append(
            {
                "all_routes": True,
                "from_domain": None,
                "to_domain": None,
                **latency_stats(overall[None]),
            }
        )
    by_type = _histograms(fold(requests, "request_type", "pairs"), lambda r: r["request_type"])
    return {
        names.DELIVERY_LATENCY: routes,
        names.DELIVERY_LATENCY_PER_MINUTE: [
            {"minute": m, **latency_stats(h)}
            for m, h in _histograms(deliveries, lambda r: r["minute"]).items()
        ],
        names.LATENCY_OVERALL: [latency_stats(_histograms(requests, lambda r: None).get(None, {}))],
        names.LATENCY_BY_TYPE: [
            {"request_type": t, **latency_stats(h)} for t, h in by_type.items()
        ],
    }


def _churn(churn: Rows) -> Rows:
    per_minute: dict[int, Row] = {}
    for row in churn:
        if not row["has_answer"] or not row["operation"]:
            continue
        sums = per_minute.setdefault(
            row["minute"],
            {
                "minute": row["minute"],
                **dict.fromkeys(CHURN_OPERATIONS.values(), 0),
                "failed_operations": 0,
            },
        )
        code = row["response_code"]
        if code is not None and 200 <= code < 300:
            name = list(CHURN_OPERATIONS.values())[row["operation"] - 1]
            sums[name] += row["addresses"] or 0
        else:
            sums["failed_operations"] += row["operations"] or 0
    return list(per_minute.values())


def merge_window(
    partials: Mapping[str, Sequence[Path]],
    open_messages: Rows,
    since_ms: int,
    output: Path,
    top_n: int,
) -> dict[str, Any]:
    """Sum the partial files of each table (`partials[table]`) from `since_ms` (a minute's
    start) on into the batch job's aggregates in `output`; return (and write) the summary.
    `open_messages` are the messages still waiting for a receipt: no receipt, in fan-out."""
    rows = {table: read_partials(files, since_ms) for table, files in partials.items()}
    waiting = [r for r in open_messages if r["sent_ts"] is not None and r["sent_ts"] >= since_ms]
    traffic = fold(rows.get(TRAFFIC, []), "type", "rows")
    fanout = _sum_by(rows.get(FANOUT, []), lambda r: r["delivered"], "messages")
    fanout[None] += sum(r["messages"] for r in waiting)
    tables: dict[str, Rows] = {
        **_traffic(traffic),
        **_talkers(rows.get(TALKERS, []), top_n),
        **_latencies(rows.get(DELIVERIES, []), rows.get(REQUESTS, [])),
        names.FANOUT_DISTRIBUTION: [
            {"delivered": d, "messages": n} for d, n in fanout.items() if n
        ],
        names.CHURN_PER_MINUTE: _churn(rows.get(CHURN, [])),
        names.BATCHING: [
            {"event_type": e, "carrier": c, "messages_in_event": m, "events": n}
            for (e, c, m), n in _sum_by(
                rows.get(BATCHING, []),
                lambda r: (r["event_type"], r["carrier"], r["messages_in_event"]),
                "events",
            ).items()
        ],
    }
    summary = _summary(traffic, rows.get(RECEIPT_ROWS, []), tables, since_ms)
    output.mkdir(parents=True, exist_ok=True)
    if summary["status"] == "empty":
        summary["notes"].append("nothing in the window: no aggregate written")
        summary["aggregates"] = []
    for name in summary["aggregates"]:
        (output / name).mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(tables[name]), output / name / PART_FILE)
    (output / names.SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _summary(traffic: Rows, receipts: Rows, tables: Mapping[str, Rows], since: int) -> Row:
    codes = tables[names.RESPONSE_CODES]
    coded = [r for r in codes if r["response_code"] is not None]
    with_code = sum(r["responses"] for r in coded)
    errors = sum(r["responses"] for r in coded if r["response_code"] >= 400)
    delivery = next((r for r in tables[names.DELIVERY_LATENCY] if r["all_routes"]), {})
    requests = tables[names.LATENCY_OVERALL][0]
    messages = sum(r["rows"] for r in traffic)
    return {
        "status": "ok" if messages or receipts else "empty",
        "since_ms": since,
        "rows_read": {"messages": messages, "receipts": sum(r["rows"] for r in receipts)},
        "events": sum(r["events"] for r in tables[names.BATCHING]),
        "time_range": {
            "ts_min": min((r["ts_min"] for r in traffic if r["ts_min"] is not None), default=None),
            "ts_max": max((r["ts_max"] for r in traffic if r["ts_max"] is not None), default=None),
        },
        "responses": {
            "total": sum(r["responses"] for r in codes),
            "with_code": with_code,
            "errors": errors,
            "error_rate": errors / with_code if with_code else None,
        },
        "latency": {k: requests.get(k) for k in ("pairs", "p50_ms", "p99_ms")},
        "delivery_latency": {
            "pairs": delivery.get("pairs", 0),
            "p50_ms": delivery.get("p50_ms"),
            "p99_ms": delivery.get("p99_ms"),
        },
        "notes": [],
        "aggregates": list(tables),
    }

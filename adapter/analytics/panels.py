"""The dashboard's figures: the job's Parquet aggregates turned into Plotly figure specs.

`dashboard_data(aggregates_dir)` is everything the page shows, as one JSON-able dict: headline
figures (`messages`, `latency_ms`), the job's notes, and one panel per chart, each with a Plotly
figure (`data` traces and a `layout`) and the numbers behind it. plotly.js draws the figures in
the browser; this module only shapes data, with pyarrow (no Spark), so the node can serve it.

A missing or unreadable aggregate becomes a panel marked `missing`, never an error.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from adapter.analytics import names

Rows = list[dict[str, Any]]
Panel = dict[str, Any]
MINUTE_MS: Final = 60_000
MAX_POINTS: Final = 720
"""Time series longer than this are summed into coarser buckets (5 min, 15 min, 1 h, …)."""
BUCKET_MINUTES: Final = (1, 5, 15, 60, 360, 1440, 10080)
MAX_TABLE_ROWS: Final = 1000
TOP_SERIES: Final = 8
MAX_CATEGORIES: Final = 30
"""Most categories one chart shows; the rest are summed as OTHER (or, for percentiles, left to
the table). Runtimes choose types, codes and addresses: no chart may grow with them."""
OTHER: Final = "other"
NONE_LABEL: Final = "(none)"


def load_rows(directory: Path, name: str) -> Rows | None:
    path = directory / name
    if not path.exists():
        return None
    try:
        rows: Rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError):
        return None
    return rows


def read_summary(aggregates_dir: Path) -> dict[str, Any] | None:
    try:
        summary: dict[str, Any] = json.loads((aggregates_dir / names.SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def label(value: Any) -> str:
    return NONE_LABEL if value is None else str(value)


def _bucket_ms(minutes: Iterable[int]) -> int:
    values = list(minutes)
    if not values:
        return MINUTE_MS
    span = (max(values) - min(values)) / MINUTE_MS + 1
    size = next((b for b in BUCKET_MINUTES if span / b <= MAX_POINTS), BUCKET_MINUTES[-1])
    return size * MINUTE_MS


def bucketed(rows: Rows, columns: Sequence[str]) -> tuple[int, dict[int, dict[str, float]]]:
    """Sum `columns` of per-minute rows into buckets; (bucket ms, {bucket start: sums})."""
    size = _bucket_ms(row["minute"] for row in rows if row["minute"] is not None)
    sums: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(columns, 0.0))
    for row in rows:
        if row["minute"] is None:
            continue
        bucket = sums[row["minute"] - row["minute"] % size]
        for column in columns:
            bucket[column] += row[column] or 0
    return size, dict(sorted(sums.items()))


def _per(size: int) -> str:
    minutes = size // MINUTE_MS
    return "per minute" if minutes == 1 else f"per {minutes} minutes"


def size_bucket(value: int) -> tuple[int, str]:
    """Power-of-two bucket of a count: (sort key, label) - 0, 1, 2-3, 4-7, 8-15, …"""
    if value <= 1:
        return value, str(value)
    low = 1 << (value.bit_length() - 1)
    return low, f"{low}-{2 * low - 1}"


# -- figure helpers ---------------------------------------------------------------------------


def folded(totals: Mapping[str, float], keep: int) -> tuple[list[str], Callable[[str], str]]:
    """The `keep` largest of `totals` (then OTHER, if anything is left out), and the mapping of
    every key onto them."""
    top = sorted(totals, key=lambda k: (-totals[k], k))[:keep]
    kept = set(top)
    shown = [*top, OTHER] if len(totals) > len(top) else top
    return shown, lambda key: key if key in kept else OTHER


def _summed(rows: Rows, key: Callable[[Mapping[str, Any]], str], value: str) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        totals[key(row)] += row[value] or 0
    return totals


def _layout(x_title: str, y_title: str, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero"},
        "margin": {"l": 60, "r": 20, "t": 10, "b": 50},
        "height": 320,
        "legend": {"orientation": "h", "y": -0.25},
    }
    layout.update(extra)
    return layout


def _time_layout(y_title: str, **extra: Any) -> dict[str, Any]:
    # Epoch milliseconds on a date axis: plotly.js picks the tick labels, in UTC.
    layout = _layout("time (UTC)", y_title, **extra)
    layout["xaxis"]["type"] = "date"
    return layout


def _lines(series: Mapping[str, Sequence[tuple[int, float | None]]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": name,
            "x": [t for t, _ in points],
            "y": [v for _, v in points],
        }
        for name, points in series.items()
    ]


def _table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], text_columns: int = 0
) -> dict[str, Any]:
    return {
        "columns": list(columns),
        "rows": [list(row) for row in rows[:MAX_TABLE_ROWS]],
        "total_rows": len(rows),
        "text_columns": text_columns,
    }


def panel(
    panel_id: str,
    section: str,
    title: str,
    traces: list[dict[str, Any]],
    layout: dict[str, Any],
    table: dict[str, Any],
) -> Panel:
    points = sum(len(trace.get("x") or trace.get("z") or ()) for trace in traces)
    return {
        "id": panel_id,
        "section": section,
        "title": title,
        "figure": {"data": traces, "layout": layout},
        "table": table,
        "points": points,
    }


def missing_panel(panel_id: str, section: str, title: str, what: str) -> Panel:
    return {"id": panel_id, "section": section, "title": title, "missing": what}


# -- one function per panel -------------------------------------------------------------------


def _messages_per_minute(rows: Rows) -> Panel:
    shown, fold = folded(_summed(rows, lambda r: label(r["type"]), "messages"), TOP_SERIES)
    per_type = [
        {"minute": row["minute"], **dict.fromkeys(shown, 0)}
        | {fold(label(row["type"])): row["messages"]}
        for row in rows
    ]
    size, buckets = bucketed(per_type, shown)
    traces = [
        {"type": "bar", "name": n, "x": list(buckets), "y": [v[n] for v in buckets.values()]}
        for n in shown
    ]
    return panel(
        "messages",
        "Traffic",
        f"Messages {_per(size)}, by type",
        traces,
        _time_layout("messages", barmode="stack"),
        _table(
            ["bucket start (ms)", *shown],
            [[t, *(v[n] for n in shown)] for t, v in buckets.items()],
        ),
    )


def _errors_per_minute(rows: Rows) -> Panel:
    shown, fold = folded(_summed(rows, lambda r: str(r["response_code"]), "responses"), TOP_SERIES)
    per_code = [
        {"minute": row["minute"], **dict.fromkeys(shown, 0)}
        | {fold(str(row["response_code"])): row["responses"]}
        for row in rows
    ]
    size, buckets = bucketed(per_code, shown)
    names = [c if c == OTHER else f"code {c}" for c in shown]
    traces = [
        {"type": "bar", "name": name, "x": list(buckets), "y": [v[c] for v in buckets.values()]}
        for name, c in zip(names, shown, strict=True)
    ]
    return panel(
        "errors",
        "Traffic",
        f"Error responses {_per(size)}, by code",
        traces,
        _time_layout("responses with code >= 400", barmode="stack"),
        _table(
            ["bucket start (ms)", *names],
            [[t, *(v[c] for c in shown)] for t, v in buckets.items()],
        ),
    )


def _response_codes(rows: Rows) -> Panel:
    ordered = sorted(rows, key=lambda r: (r["response_code"] is None, r["response_code"] or 0))
    labels = [label(r["response_code"]) for r in ordered]
    by_code = _summed(rows, lambda r: label(r["response_code"]), "responses")
    _, fold = folded(by_code, MAX_CATEGORIES)
    charted = _summed(rows, lambda r: fold(label(r["response_code"])), "responses")
    return panel(
        "codes",
        "Traffic",
        "Responses by code",
        [
            {
                "type": "bar",
                "name": "responses",
                "x": list(charted),
                "y": list(charted.values()),
            }
        ],
        _layout("response code", "responses", xaxis={"type": "category"}),
        _table(
            ["response_code", "responses"],
            [[c, r["responses"]] for c, r in zip(labels, ordered, strict=True)],
            1,
        ),
    )


def _delivery_latency_per_minute(rows: Rows) -> Panel:
    ordered = sorted((r for r in rows if r["minute"] is not None), key=lambda r: r["minute"])
    series = {p: [(r["minute"], r[f"{p}_ms"]) for r in ordered] for p in ("p50", "p90", "p99")}
    return panel(
        "latency-over-time",
        "Latency",
        "Send → delivery latency per minute (ms, from the delivery receipts)",
        _lines(series),
        _time_layout("ms"),
        _table(
            ["minute (ms)", "deliveries", "p50 ms", "p90 ms", "p99 ms", "max ms"],
            [
                [r["minute"], r["pairs"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"]]
                for r in ordered
            ],
        ),
    )


def route_label(row: Mapping[str, Any]) -> str:
    if row.get("all_routes"):
        return "all routes"
    return f"{label(row['from_domain'])} → {label(row['to_domain'])}"


def _percentile_bars(
    panel_id: str, title: str, axis: tuple[str, str, str], labels: list[str], rows: Rows
) -> Panel:
    """p50/p90/p99 bars per label, and their numbers; `axis`: (x title, label column, count
    column)."""
    charted = rows[:MAX_CATEGORIES]  # the busiest; every row is in the table
    traces = [
        {
            "type": "bar",
            "name": p,
            "x": labels[:MAX_CATEGORIES],
            "y": [r[f"{p}_ms"] for r in charted],
        }
        for p in ("p50", "p90", "p99")
    ]
    x_title, column, count = axis
    return panel(
        panel_id,
        "Latency",
        title,
        traces,
        _layout(x_title, "ms", barmode="group", xaxis={"type": "category"}),
        _table(
            [column, count, "p50 ms", "p90 ms", "p99 ms", "max ms"],
            [
                [lbl, r["pairs"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["max_ms"]]
                for lbl, r in zip(labels, rows, strict=True)
            ],
            1,
        ),
    )


def _delivery_latency_by_route(rows: Rows) -> Panel:
    ordered = sorted(rows, key=lambda r: (not r["all_routes"], -r["pairs"]))
    return _percentile_bars(
        "latency-by-route",
        "Send → delivery latency by route: within a domain and across domains (ms)",
        ("from domain → to domain", "route", "deliveries"),
        [route_label(r) for r in ordered],
        ordered,
    )


def _request_latency(by_type: Rows) -> Panel:
    rows = sorted((r for r in by_type if r["pairs"]), key=lambda r: -r["pairs"])
    return _percentile_bars(
        "request-latency",
        "Request → response latency by request type (ms)",
        ("request type", "request type", "pairs"),
        [label(r["request_type"]) for r in rows],
        rows,
    )


def _domain_traffic(rows: Rows) -> Panel:
    sources, source_of = folded(
        _summed(rows, lambda r: label(r["from_domain"]), "messages"), MAX_CATEGORIES
    )
    targets, target_of = folded(
        _summed(rows, lambda r: label(r["to_domain"]), "messages"), MAX_CATEGORIES
    )
    cells = _summed(
        rows,
        lambda r: f"{source_of(label(r['from_domain']))}\n{target_of(label(r['to_domain']))}",
        "messages",
    )
    trace = {
        "type": "heatmap",
        "x": targets,
        "y": sources,
        "z": [[cells.get(f"{s}\n{t}", 0) for t in targets] for s in sources],
        "colorscale": "Blues",
        "hovertemplate": "%{y} → %{x}: %{z} messages<extra></extra>",
    }
    ordered = sorted(rows, key=lambda r: -r["messages"])
    return panel(
        "domains",
        "Domains and federation",
        "Messages from domain (row) to domain (column)",
        [trace],
        _layout(
            "to domain",
            "from domain",
            xaxis={"type": "category", "title": {"text": "to domain"}, "automargin": True},
            yaxis={"type": "category", "title": {"text": "from domain"}, "automargin": True},
        ),
        _table(
            ["from_domain", "to_domain", "messages", "bytes"],
            [[r["from_domain"], r["to_domain"], r["messages"], r["bytes"]] for r in ordered],
            2,
        ),
    )


def _federation(rows: Rows, local_domain: str) -> Panel:
    """Messages to and from each peer domain, seen from `local_domain`.

    The node's own addresses (domain://msg-node.<domain>/...) are of its domain, not a peer's.
    """

    def local(domain: str | None) -> bool:
        return domain is not None and (
            domain == local_domain or domain.endswith("." + local_domain)
        )

    sent: dict[str, int] = defaultdict(int)
    received: dict[str, int] = defaultdict(int)
    for row in rows:
        source, target = row["from_domain"], row["to_domain"]
        if local(source) and target is not None and not local(target):
            sent[target] += row["messages"]
        elif local(target) and source is not None and not local(source):
            received[source] += row["messages"]
    peers = sorted(set(sent) | set(received))
    charted, fold = folded({p: sent[p] + received[p] for p in peers}, MAX_CATEGORIES)
    sent_to: dict[str, int] = defaultdict(int)
    got_from: dict[str, int] = defaultdict(int)
    for peer in peers:
        sent_to[fold(peer)] += sent[peer]
        got_from[fold(peer)] += received[peer]
    traces = [
        {"type": "bar", "name": "to peer", "x": charted, "y": [sent_to[p] for p in charted]},
        {"type": "bar", "name": "from peer", "x": charted, "y": [got_from[p] for p in charted]},
    ]
    return panel(
        "federation",
        "Domains and federation",
        f"Federation: messages between {local_domain} and each peer domain",
        traces,
        _layout("peer domain", "messages", barmode="group", xaxis={"type": "category"}),
        _table(
            ["peer domain", "to peer", "from peer"],
            [[p, sent[p], received[p]] for p in peers],
            1,
        ),
    )


def _top_talkers(rows: Rows, talker: str) -> Panel:
    ranked = sorted((r for r in rows if r["talker"] == talker), key=lambda r: r["rank"])
    return panel(
        f"top-{talker}s",
        "Top talkers",
        f"Top {talker}s by messages sent",
        [
            {
                "type": "bar",
                "orientation": "h",
                "name": "messages",
                "x": [r["messages"] for r in ranked],
                "y": [r["address"] for r in ranked],
            }
        ],
        _layout(
            "messages",
            "",
            yaxis={"type": "category", "autorange": "reversed", "automargin": True},
            height=max(220, 24 * len(ranked) + 80),
        ),
        _table(
            ["rank", "address", "messages", "bytes"],
            [[r["rank"], r["address"], r["messages"], r["bytes"]] for r in ranked],
            2,
        ),
    )


def _batching(rows: Rows) -> Panel:
    def kind(row: Mapping[str, Any]) -> str:
        event_type = str(row["event_type"] or NONE_LABEL).rsplit(".", 1)[-1]
        return f"{event_type}/{label(row['carrier'])}"

    carried: dict[tuple[str, tuple[int, str]], float] = defaultdict(float)
    for row in rows:
        size = row["messages_in_event"] or 0
        carried[(kind(row), size_bucket(size))] += row["events"] * size
    kinds = sorted({k for k, _ in carried})
    buckets = sorted({b for _, b in carried})
    traces = [
        {
            "type": "bar",
            "name": k,
            "x": [lbl for _, lbl in buckets],
            "y": [carried.get((k, b), 0) for b in buckets],
        }
        for k in kinds
    ]
    return panel(
        "lanes",
        "Lanes and fan-out",
        "Lanes: messages carried, by number of messages in the carrying event",
        traces,
        _layout("messages in the event", "messages", barmode="stack", xaxis={"type": "category"}),
        _table(
            ["event type", "carrier", "messages in event", "events"],
            [
                [r["event_type"], r["carrier"], r["messages_in_event"], r["events"]]
                for r in sorted(rows, key=lambda r: (kind(r), r["messages_in_event"] or 0))
            ],
            2,
        ),
    )


def _fanout(rows: Rows) -> Panel:
    buckets: dict[tuple[int, str], float] = defaultdict(float)
    for row in rows:
        key = (-1, "no receipt") if row["delivered"] is None else size_bucket(row["delivered"])
        buckets[key] += row["messages"]
    ordered = sorted(buckets.items())
    exact = sorted(rows, key=lambda r: (r["delivered"] is None, r["delivered"] or 0))
    return panel(
        "fanout",
        "Lanes and fan-out",
        "Fan-out: routed messages by number of connections reached",
        [
            {
                "type": "bar",
                "name": "messages",
                "x": [lbl for (_, lbl), _ in ordered],
                "y": [n for _, n in ordered],
            }
        ],
        _layout("connections reached", "messages", xaxis={"type": "category"}),
        _table(
            ["delivered to", "messages"],
            [
                ["no receipt" if r["delivered"] is None else r["delivered"], r["messages"]]
                for r in exact
            ],
            1,
        ),
    )


def _churn(rows: Rows) -> Panel:
    columns = ["allocated", "deleted", "subscribed", "unsubscribed", "failed_operations"]
    size, buckets = bucketed(rows, columns)
    return panel(
        "churn",
        "Lanes and fan-out",
        f"Addresses allocated / deleted, subscribed / unsubscribed {_per(size)}",
        _lines({c: [(t, v[c]) for t, v in buckets.items()] for c in columns}),
        _time_layout("addresses"),
        _table(
            ["bucket start (ms)", *columns],
            [[t, *(v[c] for c in columns)] for t, v in buckets.items()],
        ),
    )


def runtimes_panel(samples: Sequence[tuple[int, int]]) -> Panel:
    """Runtimes connected over time, from the node's own samples (ms, count)."""
    return panel(
        "runtimes",
        "Traffic",
        "Runtimes connected to this node",
        _lines({"connected": list(samples)}),
        _time_layout("runtimes"),
        _table(["time (ms)", "connected"], [[t, n] for t, n in samples]),
    )


# -- the whole dashboard ----------------------------------------------------------------------

Loaded = Mapping[str, Rows | None]
_Builder = Callable[[Loaded], Panel]


def _from(
    name: str, panel_id: str, section: str, title: str, draw: Callable[[Rows], Panel]
) -> _Builder:
    def build(loaded: Loaded) -> Panel:
        rows = loaded[name]
        if rows is None:
            return missing_panel(
                panel_id, section, title, f"aggregate {name} missing or unreadable"
            )
        return draw(rows)

    return build


PANELS: Final[tuple[_Builder, ...]] = (
    _from(names.MESSAGES_PER_MINUTE, "messages", "Traffic", "Messages", _messages_per_minute),
    _from(names.ERRORS_PER_MINUTE, "errors", "Traffic", "Error responses", _errors_per_minute),
    _from(names.RESPONSE_CODES, "codes", "Traffic", "Responses by code", _response_codes),
    _from(
        names.DELIVERY_LATENCY_PER_MINUTE,
        "latency-over-time",
        "Latency",
        "Send → delivery latency per minute",
        _delivery_latency_per_minute,
    ),
    _from(
        names.DELIVERY_LATENCY,
        "latency-by-route",
        "Latency",
        "Send → delivery latency by route",
        _delivery_latency_by_route,
    ),
    _from(
        names.LATENCY_BY_TYPE,
        "request-latency",
        "Latency",
        "Request → response latency",
        _request_latency,
    ),
    _from(names.DOMAIN_TRAFFIC, "domains", "Domains and federation", "Domains", _domain_traffic),
    _from(
        names.TOP_TALKERS,
        "top-runtimes",
        "Top talkers",
        "Top runtimes",
        lambda rows: _top_talkers(rows, "runtime"),
    ),
    _from(
        names.TOP_TALKERS,
        "top-hypertys",
        "Top talkers",
        "Top hyperties",
        lambda rows: _top_talkers(rows, "hyperty"),
    ),
    _from(names.BATCHING, "lanes", "Lanes and fan-out", "Lanes", _batching),
    _from(names.FANOUT_DISTRIBUTION, "fanout", "Lanes and fan-out", "Fan-out", _fanout),
    _from(names.CHURN_PER_MINUTE, "churn", "Lanes and fan-out", "Churn", _churn),
)


def _headline(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    summary = summary or {}
    rows = summary.get("rows_read") or {}
    delivery = summary.get("delivery_latency") or {}
    requests = summary.get("latency") or {}
    responses = summary.get("responses") or {}
    time_range = summary.get("time_range") or {}
    return {
        "status": summary.get("status", "no summary"),
        "messages": int(rows.get("messages") or 0),
        "receipts": int(rows.get("receipts") or 0),
        "events": int(summary.get("events") or 0),
        "latency_ms": {
            "p50": delivery.get("p50_ms"),
            "p99": delivery.get("p99_ms"),
            "deliveries": int(delivery.get("pairs") or 0),
        },
        "request_latency_ms": {
            "p50": requests.get("p50_ms"),
            "p99": requests.get("p99_ms"),
            "pairs": int(requests.get("pairs") or 0),
        },
        "error_rate": responses.get("error_rate"),
        "time_range": {"ts_min": time_range.get("ts_min"), "ts_max": time_range.get("ts_max")},
        "notes": [str(note) for note in summary.get("notes") or []],
    }


def dashboard_data(aggregates_dir: Path, local_domain: str | None = None) -> dict[str, Any]:
    """Everything the page shows, from the job's output directory (see the module doc)."""
    loaded = {name: load_rows(aggregates_dir, name) for name in names.AGGREGATE_NAMES}
    summary = read_summary(aggregates_dir)
    panels = [build(loaded) for build in PANELS]
    traffic = loaded[names.DOMAIN_TRAFFIC]
    if local_domain is not None:
        panels.insert(
            7,
            missing_panel("federation", "Domains and federation", "Federation", "no domain traffic")
            if traffic is None
            else _federation(traffic, local_domain),
        )
    data = _headline(summary)
    if summary is None:
        data["notes"].insert(0, f"no {names.SUMMARY_FILE} in {aggregates_dir}")
    try:
        analysed_ms: int | None = int((aggregates_dir / names.SUMMARY_FILE).stat().st_mtime * 1000)
    except OSError:
        analysed_ms = None
    data.update(generated_ms=int(time.time() * 1000), analysed_ms=analysed_ms, panels=panels)
    return data

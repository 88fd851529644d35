"""The ops dashboard: one self-contained HTML file drawn from the job's Parquet aggregates.

    python -m adapter.analytics.dashboard --aggregates <dir> --out dashboard.html

Reads the aggregates with pyarrow (no Spark), draws every chart as inline SVG (no script, no
CDN: the file opens from disk on a machine without network) and puts the numbers of each chart
in a table under it. A missing or unreadable aggregate becomes a "no data" note, not an error.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from adapter.analytics import names
from adapter.analytics import svg_charts as svg

Rows = list[dict[str, Any]]
MINUTE_MS: Final = 60_000
MAX_POINTS: Final = 720
"""Time series longer than this are summed into coarser buckets (5 min, 15 min, 1 h, …)."""
BUCKET_MINUTES: Final = (1, 5, 15, 60, 360, 1440, 10080)
MAX_TABLE_ROWS: Final = 5000
TOP_SERIES: Final = 8
NONE_LABEL: Final = "(none)"

_STYLE: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:36px;border-bottom:1px solid #ddd}
figure{margin:12px 0 20px}figcaption{font-weight:600;margin-bottom:4px}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f4f4f4}td.text,th.text{text-align:left}
.stats{display:flex;flex-wrap:wrap;gap:12px}.stat{border:1px solid #ddd;padding:8px 12px}
.stat b{display:block;font-size:18px}.notes li{color:#a40}.empty{color:#888}
details{margin:4px 0 12px}summary{cursor:pointer;color:#345}
"""


def _load(directory: Path, name: str) -> Rows | None:
    path = directory / name
    if not path.exists():
        return None
    try:
        rows: Rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError):
        return None
    return rows


def _label(value: Any) -> str:
    return NONE_LABEL if value is None else str(value)


def _bucket_ms(minutes: Iterable[int]) -> int:
    values = list(minutes)
    if not values:
        return MINUTE_MS
    span = (max(values) - min(values)) / MINUTE_MS + 1
    size = next((b for b in BUCKET_MINUTES if span / b <= MAX_POINTS), BUCKET_MINUTES[-1])
    return size * MINUTE_MS


def _bucketed(rows: Rows, columns: Sequence[str]) -> tuple[int, dict[int, dict[str, float]]]:
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


def _table(
    name: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    text_columns: int = 0,
    caption: str = "Numbers",
) -> str:
    shown = rows[:MAX_TABLE_ROWS]
    head = "".join(
        f'<th class="{"text" if i < text_columns else ""}">{escape(h)}</th>'
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{escape(_label(v))}</td>'
            if i < text_columns
            else f"<td>{escape(svg.number(v))}</td>"
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in shown
    )
    more = (
        f"<p>First {MAX_TABLE_ROWS:,} of {len(rows):,} rows; all are in the Parquet aggregate.</p>"
        if len(rows) > MAX_TABLE_ROWS
        else ""
    )
    return (
        f"<details><summary>{escape(caption)} ({len(rows):,} rows)</summary>"
        f'<table class="numbers" data-aggregate="{escape(name)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>{more}</details>"
    )


def _figure(name: str, title: str, chart: str, table: str) -> str:
    return (
        f'<figure data-aggregate="{escape(name)}"><figcaption>{escape(title)}</figcaption>'
        f"{chart}{table}</figure>"
    )


def _missing(name: str) -> str:
    return (
        f'<p class="empty" data-aggregate="{escape(name)}">'
        f"No data: aggregate {escape(name)} missing or unreadable.</p>"
    )


def _when(ms: Any) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bucket_note(size: int) -> str:
    minutes = size // MINUTE_MS
    return "per minute" if minutes == 1 else f"per {minutes} minutes"


def _stats(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<div class="stats">'
        + "".join(f'<div class="stat">{escape(k)}<b>{escape(v)}</b></div>' for k, v in items)
        + "</div>"
    )


def _summary_section(summary: Mapping[str, Any] | None) -> str:
    if summary is None:
        return '<p class="empty">No summary.json.</p>'
    rows = summary.get("rows_read", {})
    responses = summary.get("responses", {})
    latency = summary.get("latency", {})
    rate = responses.get("error_rate")
    items = [
        ("status", str(summary.get("status", "?"))),
        ("message rows", svg.number(rows.get("messages"))),
        ("receipt rows", svg.number(rows.get("receipts"))),
        ("events", svg.number(summary.get("events"))),
        ("from", _when(summary.get("time_range", {}).get("ts_min"))),
        ("to", _when(summary.get("time_range", {}).get("ts_max"))),
        ("error rate", "-" if rate is None else f"{100 * rate:.2f} %"),
        (
            "latency p50 / p99",
            f"{svg.number(latency.get('p50_ms'))} / {svg.number(latency.get('p99_ms'))} ms",
        ),
        ("rows with null type", svg.number(summary.get("messages", {}).get("rows_type_null"))),
    ]
    notes = summary.get("notes") or []
    listed = (
        '<ul class="notes">' + "".join(f"<li>{escape(str(n))}</li>" for n in notes) + "</ul>"
        if notes
        else ""
    )
    flat = [
        (f"{group}.{key}", value)
        for group, values in summary.items()
        if isinstance(values, dict) and group not in ("inputs", "timings_s")
        for key, value in values.items()
        if not isinstance(value, (dict, list))
    ]
    table = _table("summary", ["total", "value"], flat, text_columns=1, caption="All totals")
    return _stats(items) + listed + table


def _messages_per_minute(rows: Rows) -> str:
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        totals[_label(row["type"])] += row["messages"]
    top = sorted(totals, key=lambda t: -totals[t])[:TOP_SERIES]
    named = [*top, "other"] if len(totals) > len(top) else top
    per_type: list[dict[str, Any]] = []
    for row in rows:
        name = _label(row["type"])
        per_type.append(
            {
                "minute": row["minute"],
                **dict.fromkeys(named, 0),
                (name if name in top else "other"): row["messages"],
            }
        )
    size, buckets = _bucketed(per_type, named)
    series = {n: [(t, v[n]) for t, v in buckets.items()] for n in named}
    chart = svg.line_chart(series, label="messages per minute by type")
    table = _table(
        names.MESSAGES_PER_MINUTE,
        ["bucket start (UTC)", *named],
        [[svg.utc_minute(t), *(v[n] for n in named)] for t, v in buckets.items()],
        text_columns=1,
    )
    return _figure(
        names.MESSAGES_PER_MINUTE, f"Messages {_bucket_note(size)}, by type", chart, table
    )


def _domain_traffic(rows: Rows) -> str:
    sources = sorted({_label(r["from_domain"]) for r in rows})
    targets = sorted({_label(r["to_domain"]) for r in rows})
    cells = {(_label(r["from_domain"]), _label(r["to_domain"])): r["messages"] for r in rows}
    chart = svg.heatmap(sources, targets, cells, label="messages from domain to domain")
    ordered = sorted(rows, key=lambda r: -r["messages"])
    table = _table(
        names.DOMAIN_TRAFFIC,
        ["from_domain", "to_domain", "messages", "bytes"],
        [[r["from_domain"], r["to_domain"], r["messages"], r["bytes"]] for r in ordered],
        text_columns=2,
    )
    return _figure(
        names.DOMAIN_TRAFFIC,
        "Traffic matrix: messages from domain (row) to domain (column)",
        chart,
        table,
    )


def _top_talkers(rows: Rows) -> str:
    parts = []
    for talker in ("runtime", "hyperty"):
        ranked = sorted((r for r in rows if r["talker"] == talker), key=lambda r: r["rank"])
        chart = svg.horizontal_bars(
            [r["address"] for r in ranked],
            [r["messages"] for r in ranked],
            label=f"top {talker}s by messages sent",
        )
        table = _table(
            names.TOP_TALKERS,
            ["rank", "address", "messages", "bytes"],
            [[r["rank"], r["address"], r["messages"], r["bytes"]] for r in ranked],
            text_columns=2,
        )
        parts.append(_figure(names.TOP_TALKERS, f"Top {talker}s by messages sent", chart, table))
    return "".join(parts)


def _response_codes(rows: Rows) -> str:
    ordered = sorted(rows, key=lambda r: (r["response_code"] is None, r["response_code"] or 0))
    chart = svg.bar_chart(
        [_label(r["response_code"]) for r in ordered],
        {"responses": [r["responses"] for r in ordered]},
        label="responses by code",
    )
    table = _table(
        names.RESPONSE_CODES,
        ["response_code", "responses"],
        [[_label(r["response_code"]), r["responses"]] for r in ordered],
        text_columns=1,
    )
    return _figure(names.RESPONSE_CODES, "Responses by code", chart, table)


def _error_rate(rows: Rows) -> str:
    size, buckets = _bucketed(rows, ["responses", "errors"])
    rates = {
        t: (v["errors"] / v["responses"] if v["responses"] else 0.0) for t, v in buckets.items()
    }
    chart = svg.line_chart(
        {"error rate": list(rates.items())},
        label="share of responses with code >= 400",
        y_format=lambda v: f"{100 * v:.2f} %",
    )
    table = _table(
        names.ERROR_RATE_PER_MINUTE,
        ["bucket start (UTC)", "responses", "errors", "error rate"],
        [[svg.utc_minute(t), v["responses"], v["errors"], rates[t]] for t, v in buckets.items()],
        text_columns=1,
    )
    return _figure(
        names.ERROR_RATE_PER_MINUTE, f"Error rate {_bucket_note(size)} (code >= 400)", chart, table
    )


def _latency(by_type: Rows | None, overall: Rows | None) -> str:
    rows = [{"request_type": "(all)", **r} for r in overall or []]
    rows += sorted(by_type or [], key=lambda r: -r["pairs"])
    rows = [r for r in rows if r["pairs"]]
    percentiles = ("p50_ms", "p90_ms", "p99_ms")
    chart = svg.bar_chart(
        [_label(r["request_type"]) for r in rows],
        {p: [r[p] or 0 for r in rows] for p in percentiles},
        label="request to response latency percentiles, ms",
    )
    table = _table(
        names.LATENCY_BY_TYPE,
        ["request type", "pairs", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        [[r["request_type"], r["pairs"], *(r[p] for p in percentiles), r["max_ms"]] for r in rows],
        text_columns=1,
    )
    return _figure(
        names.LATENCY_BY_TYPE, "Request → response latency (ms), by request type", chart, table
    )


def size_bucket(value: int) -> tuple[int, str]:
    """Power-of-two bucket of a count: (sort key, label) - 0, 1, 2-3, 4-7, 8-15, …"""
    if value <= 1:
        return value, str(value)
    low = 1 << (value.bit_length() - 1)
    return low, f"{low}-{2 * low - 1}"


def _fanout_distribution(rows: Rows) -> str:
    buckets: dict[tuple[int, str], float] = defaultdict(float)
    for row in rows:
        key = (-1, "no receipt") if row["delivered"] is None else size_bucket(row["delivered"])
        buckets[key] += row["messages"]
    ordered = sorted(buckets.items())
    chart = svg.bar_chart(
        [label for (_, label), _ in ordered],
        {"messages": [n for _, n in ordered]},
        label="routed messages by connections reached",
    )
    exact = sorted(rows, key=lambda r: (r["delivered"] is None, r["delivered"] or 0))
    table = _table(
        names.FANOUT_DISTRIBUTION,
        ["delivered to", "messages"],
        [
            ["no receipt" if r["delivered"] is None else str(r["delivered"]), r["messages"]]
            for r in exact
        ],
        text_columns=1,
    )
    return _figure(
        names.FANOUT_DISTRIBUTION,
        "Publication fan-out: routed messages by number of "
        "connections reached (buckets; exact counts in the table)",
        chart,
        table,
    )


def _fanout_by_address(rows: Rows) -> str:
    ordered = sorted(rows, key=lambda r: (-r["delivered_total"], r["to"]))
    top = ordered[:20]
    chart = svg.horizontal_bars(
        [r["to"] for r in top],
        [r["delivered_total"] for r in top],
        label="deliveries of updates per address",
    )
    table = _table(
        names.FANOUT_BY_ADDRESS,
        ["to", "updates", "with receipt", "deliveries", "max fan-out", "mean fan-out"],
        [
            [
                r["to"],
                r["updates"],
                r["with_receipt"],
                r["delivered_total"],
                r["delivered_max"],
                r["delivered_total"] / r["with_receipt"] if r["with_receipt"] else None,
            ]
            for r in ordered
        ],
        text_columns=1,
    )
    return _figure(
        names.FANOUT_BY_ADDRESS, "Update fan-out per address (top 20 by deliveries)", chart, table
    )


def _churn(rows: Rows) -> str:
    columns = ["allocated", "deleted", "subscribed", "unsubscribed", "failed_operations"]
    size, buckets = _bucketed(rows, columns)
    series = {c: [(t, v[c]) for t, v in buckets.items()] for c in columns}
    chart = svg.line_chart(series, label="address allocation and subscription churn")
    table = _table(
        names.CHURN_PER_MINUTE,
        ["bucket start (UTC)", *columns],
        [[svg.utc_minute(t), *(v[c] for c in columns)] for t, v in buckets.items()],
        text_columns=1,
    )
    return _figure(
        names.CHURN_PER_MINUTE,
        f"Addresses allocated / deleted, subscribed / unsubscribed {_bucket_note(size)}",
        chart,
        table,
    )


def _batching(rows: Rows) -> str:
    def kind(row: Mapping[str, Any]) -> str:
        event_type = str(row["event_type"] or NONE_LABEL).rsplit(".", 1)[-1]
        return f"{event_type}/{_label(row['carrier'])}"

    kinds = sorted({kind(r) for r in rows})
    events: dict[str, float] = defaultdict(float)
    messages: dict[str, float] = defaultdict(float)
    carried: dict[tuple[str, tuple[int, str]], float] = defaultdict(float)
    for row in rows:
        size = row["messages_in_event"] or 0
        events[kind(row)] += row["events"]
        messages[kind(row)] += row["events"] * size
        carried[(kind(row), size_bucket(size))] += row["events"] * size
    buckets = sorted({bucket for _, bucket in carried})
    chart = svg.bar_chart(
        [label for _, label in buckets],
        {k: [carried.get((k, b), 0) for b in buckets] for k in kinds},
        label="messages carried, by size of the carrying event",
    )
    stats = _stats(
        [
            (
                f"{k}: events / mean messages per event",
                f"{svg.number(events[k])} / {messages[k] / events[k]:.2f}" if events[k] else "-",
            )
            for k in kinds
        ]
    )
    table = _table(
        names.BATCHING,
        ["event type", "carrier", "messages in event", "events"],
        [
            [r["event_type"], r["carrier"], r["messages_in_event"], r["events"]]
            for r in sorted(rows, key=lambda r: (kind(r), r["messages_in_event"] or 0))
        ],
        text_columns=2,
    )
    return stats + _figure(
        names.BATCHING,
        "Batching: messages carried, by number of messages in "
        "the carrying event (buckets; exact counts in the table)",
        chart,
        table,
    )


Loaded = Mapping[str, Rows | None]


def _drawn(name: str, draw: Callable[[Rows], str]) -> Callable[[Loaded], str]:
    """A part of a section: the chart of one aggregate, or a note that it is missing."""

    def part(loaded: Loaded) -> str:
        rows = loaded[name]
        return _missing(name) if rows is None else draw(rows)

    return part


def _latency_part(loaded: Loaded) -> str:
    by_type, overall = loaded[names.LATENCY_BY_TYPE], loaded[names.LATENCY_OVERALL]
    if by_type is None and overall is None:
        return _missing(names.LATENCY_BY_TYPE) + _missing(names.LATENCY_OVERALL)
    return _latency(by_type, overall)


SECTIONS: Final[tuple[tuple[str, tuple[Callable[[Loaded], str], ...]], ...]] = (
    ("Messages", (_drawn(names.MESSAGES_PER_MINUTE, _messages_per_minute),)),
    ("Domains", (_drawn(names.DOMAIN_TRAFFIC, _domain_traffic),)),
    ("Top talkers", (_drawn(names.TOP_TALKERS, _top_talkers),)),
    (
        "Responses and errors",
        (
            _drawn(names.RESPONSE_CODES, _response_codes),
            _drawn(names.ERROR_RATE_PER_MINUTE, _error_rate),
        ),
    ),
    ("Latency", (_latency_part,)),
    (
        "Publication fan-out",
        (
            _drawn(names.FANOUT_DISTRIBUTION, _fanout_distribution),
            _drawn(names.FANOUT_BY_ADDRESS, _fanout_by_address),
        ),
    ),
    ("Allocation and subscription churn", (_drawn(names.CHURN_PER_MINUTE, _churn),)),
    ("Batching", (_drawn(names.BATCHING, _batching),)),
)


def _read_summary(aggregates_dir: Path) -> dict[str, Any] | None:
    try:
        summary: dict[str, Any] = json.loads((aggregates_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary


def render_dashboard(aggregates_dir: Path) -> str:
    """The dashboard's HTML for one aggregates directory."""
    loaded = {name: _load(aggregates_dir, name) for name in names.AGGREGATE_NAMES}
    sections = "".join(
        f"<h2>{escape(title)}</h2>" + "".join(part(loaded) for part in parts)
        for title, parts in SECTIONS
    )
    generated = datetime.now(tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        "<title>reTHINK Message Node - traffic</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>reTHINK Message Node - traffic</h1>"
        f"<p>From {escape(str(aggregates_dir))}, drawn {generated}.</p>"
        f"<h2>Summary</h2>{_summary_section(_read_summary(aggregates_dir))}"
        f"{sections}</body></html>"
    )


def build_dashboard(aggregates_dir: str | Path, out_file: str | Path) -> Path:
    """Write the dashboard of `aggregates_dir` (the job's output) to `out_file`; return its path."""
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_dashboard(Path(aggregates_dir)), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="adapter.analytics.dashboard", description="Draw the ops dashboard (one HTML file)"
    )
    parser.add_argument("--aggregates", required=True, type=Path, help="the job's output dir")
    parser.add_argument("--out", required=True, type=Path, help="HTML file to write")
    args = parser.parse_args(argv)
    path = build_dashboard(args.aggregates, args.out)
    print(f"wrote {path} ({math.ceil(path.stat().st_size / 1024)} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tiny inline-SVG chart primitives for the ops dashboard: no script, no network, no library.

Every mark carries its number (`data-value`, and a `<title>` the browser shows on hover), so a
chart can be checked by reading the SVG, and every label is HTML-escaped (addresses come from
the traffic, i.e. from anyone).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Final

PALETTE: Final = (
    "#4269d0",
    "#efb118",
    "#ff725c",
    "#6cc5b0",
    "#3ca951",
    "#ff8ab7",
    "#a463f2",
    "#97bbf5",
    "#9c6b4e",
    "#9498a0",
)
WIDTH: Final = 900
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 16, 12, 46

Point = tuple[float, float]


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def number(value: float | None) -> str:
    """12,345 / 0.0123 / 1.5 - compact and exact enough for an ops page."""
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) < 1:
        return f"{value:.4f}"
    return f"{value:,.2f}"


def compact(value: float) -> str:
    """1.2k / 3.4M: fits in a heatmap cell (the exact number is in the cell's title)."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.1f}{suffix}"
    return number(value)


def utc_minute(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%m-%d %H:%M")


def nice_ticks(high: float, count: int = 5) -> list[float]:
    """0 and round steps up to at least `high`."""
    if high <= 0:
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(high / step) + 1)]


def _svg(height: int, body: list[str], label: str) -> str:
    return (
        f'<svg class="chart" role="img" aria-label="{escape(label)}" '
        f'viewBox="0 0 {WIDTH} {height}" width="100%" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )


def _y_axis(
    ticks: list[float],
    y: Callable[[float], float],
    right: float,
    y_format: Callable[[float], str] = number,
) -> list[str]:
    parts = []
    for tick in ticks:
        pos = y(tick)
        parts.append(
            f'<line class="grid" x1="{MARGIN_LEFT}" x2="{right:.1f}" y1="{pos:.1f}" '
            f'y2="{pos:.1f}" stroke="#ddd"/>'
            f'<text x="{MARGIN_LEFT - 6}" y="{pos + 4:.1f}" text-anchor="end" '
            f'font-size="11">{escape(y_format(tick))}</text>'
        )
    return parts


def _legend(names: Sequence[str], top: float) -> list[str]:
    parts, x = [], float(MARGIN_LEFT)
    for index, name in enumerate(names):
        parts.append(
            f'<g class="legend-item"><rect x="{x:.1f}" y="{top:.1f}" width="10" height="10" '
            f'fill="{color(index)}"/><text x="{x + 14:.1f}" y="{top + 9:.1f}" '
            f'font-size="11">{escape(name)}</text></g>'
        )
        x += 24 + 7 * len(name)
    return parts


def line_chart(
    series: Mapping[str, Sequence[Point]],
    *,
    label: str,
    x_format: Callable[[float], str] = utc_minute,
    y_format: Callable[[float], str] = number,
    height: int = 280,
) -> str:
    """One polyline per series; x usually epoch ms. Points carry their values."""
    points = [p for values in series.values() for p in values]
    if not points:
        return empty_chart(label)
    x_low = min(p[0] for p in points)
    x_high = max(p[0] for p in points)
    ticks = nice_ticks(max(p[1] for p in points))
    plot_bottom = height - MARGIN_BOTTOM - 16
    right = WIDTH - MARGIN_RIGHT

    def x(value: float) -> float:
        span = x_high - x_low or 1.0
        return MARGIN_LEFT + (value - x_low) / span * (right - MARGIN_LEFT)

    def y(value: float) -> float:
        return plot_bottom - value / ticks[-1] * (plot_bottom - MARGIN_TOP)

    body = _y_axis(ticks, y, right, y_format)
    for i in range(6):
        at = x_low + (x_high - x_low) * i / 5
        body.append(
            f'<text x="{x(at):.1f}" y="{plot_bottom + 16}" text-anchor="middle" '
            f'font-size="11">{escape(x_format(at))}</text>'
        )
    for index, (name, values) in enumerate(series.items()):
        ordered = sorted(values)
        coords = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in ordered)
        body.append(
            f'<polyline class="series" data-series="{escape(name)}" '
            f'data-points="{len(ordered)}" fill="none" stroke="{color(index)}" '
            f'stroke-width="1.5" points="{coords}"><title>{escape(name)}</title></polyline>'
        )
        if len(ordered) <= 60:  # few points: show them, each with its value
            body.extend(
                f'<circle class="point" cx="{x(px):.1f}" cy="{y(py):.1f}" r="2.5" '
                f'fill="{color(index)}" data-value="{py}"><title>{escape(name)} '
                f"{escape(x_format(px))}: {escape(y_format(py))}</title></circle>"
                for px, py in ordered
            )
    body += _legend(list(series), height - 18)
    return _svg(height, body, label)


def bar_chart(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    label: str,
    height: int = 280,
) -> str:
    """Vertical bars, grouped by category, one colour per series."""
    values = [v for column in series.values() for v in column]
    if not categories or not values:
        return empty_chart(label)
    ticks = nice_ticks(max(values))
    plot_bottom = height - MARGIN_BOTTOM - (16 if len(series) > 1 else 0)
    right = WIDTH - MARGIN_RIGHT
    slot = (right - MARGIN_LEFT) / len(categories)
    bar = max(1.0, slot * 0.8 / len(series))

    def y(value: float) -> float:
        return plot_bottom - value / ticks[-1] * (plot_bottom - MARGIN_TOP)

    body = _y_axis(ticks, y, right)
    label_every = max(1, math.ceil(len(categories) / 40))
    for c, category in enumerate(categories):
        left = MARGIN_LEFT + c * slot + slot * 0.1
        for s, (name, column) in enumerate(series.items()):
            value = column[c]
            body.append(
                f'<rect class="bar" data-value="{value}" x="{left + s * bar:.1f}" '
                f'y="{y(value):.1f}" width="{bar:.1f}" height="{y(0) - y(value):.1f}" '
                f'fill="{color(s)}"><title>{escape(category)} {escape(name)}: '
                f"{escape(number(value))}</title></rect>"
            )
        if c % label_every == 0:
            body.append(
                f'<text x="{left + slot * 0.4:.1f}" y="{plot_bottom + 14}" '
                f'text-anchor="middle" font-size="11">{escape(category)}</text>'
            )
    if len(series) > 1:
        body += _legend(list(series), height - 18)
    return _svg(height, body, label)


def horizontal_bars(labels: Sequence[str], values: Sequence[float], *, label: str) -> str:
    """Ranked bars with their labels (long addresses cut, full text on hover)."""
    if not labels:
        return empty_chart(label)
    row, text_width = 20, 330
    height = MARGIN_TOP + row * len(labels) + 24
    high = max(values) or 1
    body = []
    for i, (name, value) in enumerate(zip(labels, values, strict=True)):
        top = MARGIN_TOP + i * row
        width = (WIDTH - text_width - 90) * value / high
        shown = name if len(name) <= 48 else name[:22] + "…" + name[-24:]
        body.append(
            f'<text x="{text_width - 6}" y="{top + 14}" text-anchor="end" font-size="11">'
            f"<title>{escape(name)}</title>{escape(shown)}</text>"
            f'<rect class="bar" data-value="{value}" x="{text_width}" y="{top + 3}" '
            f'width="{width:.1f}" height="{row - 6}" fill="{color(0)}">'
            f"<title>{escape(name)}: {escape(number(value))}</title></rect>"
            f'<text x="{text_width + width + 4:.1f}" y="{top + 14}" font-size="11">'
            f"{escape(number(value))}</text>"
        )
    return _svg(height, body, label)


def heatmap(
    rows: Sequence[str],
    columns: Sequence[str],
    values: Mapping[tuple[str, str], float],
    *,
    label: str,
) -> str:
    """A matrix of cells shaded by value, each cell labelled with its number."""
    if not rows or not columns:
        return empty_chart(label)
    left, top, cell_h = 200, 110, 26
    # Room on the right for the last column's slanted label.
    cell_w = max(40.0, (WIDTH - left - 100) / len(columns))
    height = top + cell_h * len(rows) + 10
    high = max(values.values(), default=0) or 1
    body = []
    for c, column in enumerate(columns):
        cx = left + c * cell_w + cell_w / 2
        body.append(
            f'<text x="{cx:.1f}" y="{top - 6}" font-size="11" text-anchor="start" '
            f'transform="rotate(-40 {cx:.1f} {top - 6})">{escape(column)}</text>'
        )
    for r, row_name in enumerate(rows):
        y = top + r * cell_h
        body.append(
            f'<text x="{left - 6}" y="{y + cell_h / 2 + 4:.1f}" text-anchor="end" '
            f'font-size="11">{escape(row_name)}</text>'
        )
        for c, column in enumerate(columns):
            value = values.get((row_name, column), 0)
            shade = 0.06 + 0.94 * math.sqrt(value / high) if value else 0
            x = left + c * cell_w
            body.append(
                f'<rect class="cell" data-value="{value}" x="{x:.1f}" y="{y}" '
                f'width="{cell_w - 2:.1f}" height="{cell_h - 2}" fill="{color(0)}" '
                f'fill-opacity="{shade:.3f}" stroke="#eee"><title>{escape(row_name)} → '
                f"{escape(column)}: {escape(number(value))}</title></rect>"
            )
            if value:
                ink = "#fff" if shade > 0.55 else "#222"
                body.append(
                    f'<text x="{x + cell_w / 2 - 1:.1f}" y="{y + cell_h / 2 + 3:.1f}" '
                    f'text-anchor="middle" font-size="10" fill="{ink}">'
                    f"{escape(compact(value))}</text>"
                )
    return _svg(height, body, label)


def empty_chart(label: str) -> str:
    return f'<p class="empty" data-chart="{escape(label)}">No data.</p>'

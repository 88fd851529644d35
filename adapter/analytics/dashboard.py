"""The ops dashboard page: the figures of `panels.py`, drawn by plotly.js.

Two forms of one page:

* live, served by the node (`GET /dashboard`): it loads plotly.js and the drawing script from the
  node and fetches `data.json` again every few seconds;
* a file (`rethink-mn dashboard --input <aggregates> --out dashboard.html`): plotly.js, the script
  and the data inline, so it opens from disk on a machine without network.

    python -m adapter.analytics.dashboard --aggregates <dir> --out dashboard.html [--domain d]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any, Final

from adapter.analytics.panels import dashboard_data

SCRIPT: Final = Path(__file__).resolve().parents[1] / "web" / "dashboard.js"
TITLE: Final = "reTHINK Message Node - operations"

_STYLE: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:20px auto;max-width:1100px;color:#222;padding:0 12px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
#tiles{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.tile{border:1px solid #ddd;border-radius:4px;padding:6px 12px;min-width:120px}
.tile span{display:block;color:#666;font-size:12px}.tile b{font-size:18px}
figure.panel{margin:10px 0 22px}figcaption{font-weight:600;margin-bottom:4px}
table.numbers{border-collapse:collapse;font-size:12px;margin:6px 0}
table.numbers td,table.numbers th{border:1px solid #ddd;padding:2px 6px;text-align:right}
table.numbers th{background:#f4f4f4}.text{text-align:left!important}
#notes li{color:#a40}.empty{color:#888}.meta{color:#666;font-size:12px}
details summary{cursor:pointer;color:#345}
"""


def plotly_js_path() -> Path:
    """plotly.js as the plotly package ships it (found without importing the package)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the plotly package is not installed")
    return Path(spec.origin).parent / "package_data" / "plotly.min.js"


def _page(head_scripts: str, body_attributes: str, tail: str, subtitle: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        # No favicon to fetch (a browser asks for /favicon.ico otherwise).
        '<link rel="icon" href="data:,">'
        f"<title>{TITLE}</title><style>{_STYLE}</style>{head_scripts}</head><body>"
        f'<h1>{TITLE}</h1><p class="meta">{escape(subtitle)} '
        '<span id="generated"></span> <span id="refresh"></span></p>'
        f'<main id="dashboard" {body_attributes}><div id="tiles"></div>'
        '<ul id="notes"></ul><div id="panels"></div></main>'
        f"{tail}</body></html>"
    )


def live_page(domain: str, refresh_seconds: float) -> str:
    """The page the node serves: its data comes from `data.json` beside it."""
    return _page(
        '<script src="dashboard/plotly.min.js"></script>',
        f'data-source="dashboard/data.json" data-refresh-ms="{int(refresh_seconds * 1000)}"',
        '<script src="dashboard/dashboard.js"></script>',
        f"Domain {domain}, live.",
    )


def _inline_json(data: Mapping[str, Any]) -> str:
    # Inside <script>, "</" could end the element: JSON allows escaping "<" as \u003c.
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")


def static_page(data: Mapping[str, Any], source: str) -> str:
    """One self-contained file: plotly.js, the script and the data inline."""
    plotly_js = plotly_js_path().read_text(encoding="utf-8")
    script = SCRIPT.read_text(encoding="utf-8")
    return _page(
        f"<script>{plotly_js}</script>",
        "",
        f'<script type="application/json" id="dashboard-data">{_inline_json(data)}</script>'
        f"<script>{script}</script>",
        f"From {source}.",
    )


def build_dashboard(
    aggregates_dir: str | Path, out_file: str | Path, domain: str | None = None
) -> Path:
    """Write the dashboard of `aggregates_dir` (the job's output) to `out_file`; return its path."""
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = dashboard_data(Path(aggregates_dir), domain)
    out.write_text(static_page(data, str(aggregates_dir)), encoding="utf-8")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="adapter.analytics.dashboard", description="Draw the ops dashboard (one HTML file)"
    )
    parser.add_argument("--aggregates", required=True, type=Path, help="the job's output dir")
    parser.add_argument("--out", required=True, type=Path, help="HTML file to write")
    parser.add_argument("--domain", help="this node's domain (adds the federation panel)")
    args = parser.parse_args(argv)
    path = build_dashboard(args.aggregates, args.out, args.domain)
    print(f"wrote {path} ({math.ceil(path.stat().st_size / 1024)} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

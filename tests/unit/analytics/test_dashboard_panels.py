"""What runtimes choose (domains, codes, types) cannot make the dashboard's charts grow."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from adapter.analytics import names
from adapter.analytics.panels import MAX_CATEGORIES, MAX_TABLE_ROWS, TOP_SERIES, dashboard_data

INVENTED = 5000


def _write(directory: Path, name: str, table: pa.Table) -> None:
    (directory / name).mkdir(parents=True)
    pq.write_table(table, directory / name / "part-00000.parquet")


def test_invented_domains_and_codes_are_folded_into_other(tmp_path: Path) -> None:
    # Runtimes of home.test addressed 2,500 made-up domains and claimed to come from 2,500 more
    # (refused, but journaled), and answered with 5,000 made-up codes.
    _write(
        tmp_path,
        names.DOMAIN_TRAFFIC,
        pa.table(
            {
                "from_domain": ["home.test" if i % 2 else f"src{i}.evil" for i in range(INVENTED)]
                + ["home.test"],
                "to_domain": [f"dst{i}.evil" if i % 2 else "home.test" for i in range(INVENTED)]
                + ["home.test"],
                "messages": [1] * INVENTED + [10_000],
                "bytes": [10] * INVENTED + [100_000],
            }
        ),
    )
    codes = list(range(1000, 1000 + INVENTED))
    _write(
        tmp_path,
        names.ERRORS_PER_MINUTE,
        pa.table(
            {
                "minute": [60_000 * (i % 50) for i in range(INVENTED)],
                "response_code": pa.array(codes, pa.int32()),
                "responses": [1] * INVENTED,
            }
        ),
    )
    _write(
        tmp_path,
        names.RESPONSE_CODES,
        pa.table({"response_code": pa.array(codes, pa.int32()), "responses": [1] * INVENTED}),
    )

    data = dashboard_data(tmp_path, "home.test")
    panels = {p["id"]: p for p in data["panels"]}

    heatmap = panels["domains"]["figure"]["data"][0]
    assert len(heatmap["y"]) == len(heatmap["x"]) == MAX_CATEGORIES + 1
    assert heatmap["y"][0] == heatmap["x"][0] == "home.test"
    assert heatmap["y"][-1] == "other"
    assert sum(map(sum, heatmap["z"])) == INVENTED + 10_000  # nothing dropped, only folded
    federation = panels["federation"]["figure"]["data"]
    assert all(len(trace["x"]) == MAX_CATEGORIES + 1 for trace in federation)
    assert sum(federation[0]["y"]) == sum(federation[1]["y"]) == INVENTED // 2
    assert len(panels["errors"]["figure"]["data"]) == TOP_SERIES + 1
    assert len(panels["codes"]["figure"]["data"][0]["x"]) == MAX_CATEGORIES + 1
    for panel in (panels["domains"], panels["codes"]):
        assert len(panel["table"]["rows"]) == MAX_TABLE_ROWS
        assert panel["table"]["total_rows"] > MAX_TABLE_ROWS
    assert len(json.dumps(data)) < 2_000_000

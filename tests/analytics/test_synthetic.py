"""The synthetic export: layout and schema of the export contract, determinism, tricky cases."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from adapter.analytics import names
from adapter.analytics.schema import MESSAGES_ARROW_SCHEMA, RECEIPTS_ARROW_SCHEMA
from tests.analytics.conftest import AnalysedExport
from tests.support.synthetic.export import SyntheticSpec, generate_export
from tests.support.synthetic.known_answers import nearest_rank


def _dataset(export: Path, name: str) -> list[tuple[str, pa.Table]]:
    return [
        (path.parent.name.removeprefix("date="), pq.read_table(path))
        for path in sorted((export / name).glob("date=*/*.parquet"))
    ]


def _day(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d")


def test_files_follow_the_export_layout_and_schema(analysed: AnalysedExport) -> None:
    messages = _dataset(analysed.export, "messages")
    receipts = _dataset(analysed.export, "receipts")
    assert len({date for date, _ in messages}) == 2, "the export should cross midnight"
    assert (analysed.export / "_runs" / f"{SyntheticSpec(seed=11).run_id}.json").exists()
    for date, table in messages:
        assert table.schema.equals(MESSAGES_ARROW_SCHEMA)
        assert {_day(ts) for ts in table.column("origin_server_ts").to_pylist()} == {date}
    for date, table in receipts:
        assert table.schema.equals(RECEIPTS_ARROW_SCHEMA)
        assert {_day(ts) for ts in table.column("ts").to_pylist()} == {date}


def test_generation_is_deterministic(tmp_path: Path) -> None:
    spec = SyntheticSpec(rows=800, seed=3)
    first = generate_export(tmp_path / "a", spec)
    second = generate_export(tmp_path / "b", spec)
    other = generate_export(tmp_path / "c", SyntheticSpec(rows=800, seed=4))
    for name in ("messages", "receipts"):
        tables_a, tables_b = _dataset(tmp_path / "a", name), _dataset(tmp_path / "b", name)
        assert all(t.equals(u) for (_, t), (_, u) in zip(tables_a, tables_b, strict=True))
    assert first.summary == second.summary
    assert first.aggregates[names.LATENCY_BY_TYPE].equals(second.aggregates[names.LATENCY_BY_TYPE])
    assert not first.aggregates[names.DOMAIN_TRAFFIC].equals(other.aggregates[names.DOMAIN_TRAFFIC])


def test_row_count_is_close_to_the_request(tmp_path: Path) -> None:
    rows = generate_export(tmp_path, SyntheticSpec(rows=20_000, seed=2)).summary["rows_read"]
    assert 19_000 <= rows["messages"] <= 21_000


def _messages(export: Path) -> pa.Table:
    return pa.concat_tables(table for _, table in _dataset(export, "messages"))


def test_the_traffic_holds_the_cases_the_job_must_handle(analysed: AnalysedExport) -> None:
    table = _messages(analysed.export)
    routed = table.filter(pc.equal(table.column("kind"), "routed"))
    kinds = Counter(table.column("kind").to_pylist())
    assert set(kinds) == {
        "routed",
        "service_request",
        "service_response",
        "rejected_request",
        "rejected_response",
    }
    requests = routed.filter(pc.not_equal(routed.column("type"), "response"))
    keys = Counter(
        zip(*(requests.column(c).to_pylist() for c in ("msg_id", "from", "to")), strict=True)
    )
    assert any(n > 1 and key[0] is not None for key, n in keys.items()), "a re-sent request"
    ids = Counter(routed.column("msg_id").to_pylist())
    assert any(n > 2 for key, n in ids.items() if key is not None), "ids shared across senders"
    assert any(i and not i[0].isdigit() for i in ids), "string ids as well as numbers"
    assert max(table.column("to_count").to_pylist(), key=lambda n: n or 0) > 1, "a list in `to`"
    assert None in table.column("type").to_pylist(), "a row that was not a JSON object"
    assert {"inline", "media"} <= set(table.column("carrier").to_pylist())
    codes = set(table.column("response_code").to_pylist())
    assert {200, 400, 404} <= codes
    receipts = pa.concat_tables(t for _, t in _dataset(analysed.export, "receipts"))
    receipt_keys = Counter(
        zip(
            receipts.column("event_id").to_pylist(),
            receipts.column("index_in_event").to_pylist(),
            strict=True,
        )
    )
    assert max(receipt_keys.values()) > 1, "a receipt written twice"
    assert analysed.known.summary["fanout"]["without_receipt"] > 0, "a batch without receipt"


def test_known_answers_agree_with_each_other(analysed: AnalysedExport) -> None:
    answers = analysed.known.aggregates
    rows = analysed.known.summary["rows_read"]["messages"]
    assert sum(answers[names.MESSAGES_PER_MINUTE].column("messages").to_pylist()) == rows
    assert sum(answers[names.DOMAIN_TRAFFIC].column("messages").to_pylist()) == rows
    by_type = answers[names.LATENCY_BY_TYPE].column("pairs").to_pylist()
    assert sum(by_type) == answers[names.LATENCY_OVERALL].column("pairs")[0].as_py()


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([5], 0.99, 5),
        ([1, 2], 0.5, 1),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9, 9),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.99, 10),
        (list(range(1, 101)), 0.5, 50),
    ],
)
def test_nearest_rank(values: list[int], p: float, expected: int) -> None:
    assert nearest_rank(np.array(sorted(values), dtype=np.int64), p) == expected

"""Synthetic room-event exports with known answers, for tests and benchmarks.

    python -m tests.support.synthetic.export --rows 1000000 --out /tmp/export   # from the repo root

writes the layout of `rethink-mn export` (docs/export-schema.md): `messages/date=…/part-….parquet`,
`receipts/date=…/…`, `_runs/<run id>.json`. The traffic mix is described in `traffic.py`;
`generate_export` returns the expected aggregates, computed alongside the generation from the
generator's own ground truth (`known_answers.py`). Generation is chunked and vectorised (numpy,
Arrow) and deterministic for a given spec.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from adapter.analytics.schema import (
    CARRIERS,
    EVENT_TYPE_BATCH,
    EVENT_TYPE_JOURNAL,
    KINDS,
    MESSAGES_ARROW_SCHEMA,
    RECEIPTS_ARROW_SCHEMA,
    SERVICES,
)
from tests.support.synthetic.known_answers import KnownAnswerBuilder, KnownAnswers
from tests.support.synthetic.traffic import EVENT_JOURNAL, NULL, ChunkMaker
from tests.support.synthetic.world import (
    BOT_USER,
    JOURNAL_ROOM,
    SERVER_NAME,
    TYPES,
    IntArray,
    World,
    build_world,
)

DAY_MS: Final = 86_400_000
# 2025-11-20 23:50 UTC: even a small export crosses midnight, so it spans two date partitions.
DEFAULT_START_MS: Final = 1_763_682_600_000


@dataclass(frozen=True)
class SyntheticSpec:
    rows: int = 100_000
    """Approximate number of message rows (the mix decides the exact count)."""
    seed: int = 7
    start_ms: int = DEFAULT_START_MS
    rate_per_s: float = 60.0
    """Average message rate; sets how long a period the export covers."""
    chunk_rows: int = 1_000_000
    domains: int = 3
    runtimes_per_domain: int = 10
    hyperties_per_runtime: int = 6
    objects_per_runtime: int = 4
    top_n: int = 20
    """Talkers kept per kind in the expected top_talkers (pass the same to the job)."""
    row_group_rows: int = 128 * 1024

    @property
    def run_id(self) -> str:
        return f"synthetic-{self.seed}"


def _strings(values: Sequence[str], codes: IntArray) -> pa.Array:
    return pc.take(pa.array(values, pa.string()), pa.array(codes, mask=codes < 0))


def _ints(codes: IntArray, arrow_type: pa.DataType) -> pa.Array:
    return pa.array(codes, type=arrow_type, mask=codes < 0)


def _lookup(table: IntArray, codes: IntArray) -> IntArray:
    return np.where(codes >= 0, table[np.maximum(codes, 0)], NULL)


def _messages_table(world: World, rows: dict[str, IntArray], seed: int) -> pa.Table:
    journal = rows["event_type"] == EVENT_JOURNAL
    runtimes = world.runtimes
    room_or_user = np.where(journal, runtimes, rows["runtime"])
    msg_id = pc.cast(_ints(rows["msg_id"], pa.int64()), pa.string())
    # Some senders use string ids: the export renders both as text.
    msg_id = pc.if_else(
        pa.array(rows["id_style"] == 1), pc.binary_join_element_wise("m", msg_id, ""), msg_id
    )
    columns: dict[str, pa.Array] = {
        "event_id": pc.binary_join_element_wise(
            "$", pc.cast(pa.array(rows["event"]), pa.string()), f"_s{seed}", ""
        ),
        "room_id": _strings((*world.runtime_rooms, JOURNAL_ROOM), room_or_user),
        "event_type": _strings((EVENT_TYPE_BATCH, EVENT_TYPE_JOURNAL), rows["event_type"]),
        "sender": _strings((*world.runtime_users, BOT_USER), room_or_user),
        "runtime": _strings(world.runtime_urls, rows["runtime"]),
        "origin_server_ts": pa.array(rows["ots"], pa.int64()),
        "ts": pa.array(rows["ts"], pa.int64()),
        "carrier": _strings(CARRIERS, rows["carrier"]),
        "messages_in_event": _ints(rows["n_in_event"], pa.int32()),
        "index_in_event": _ints(rows["idx"], pa.int32()),
        "kind": _strings(KINDS, rows["kind"]),
        "msg_id": msg_id,
        "type": _strings(TYPES, rows["type"]),
        "from": _strings(world.pool, rows["from"]),
        "to": _strings(world.pool, rows["to"]),
        "to_count": _ints(rows["to_count"], pa.int32()),
        "from_scheme": _strings(world.schemes, _lookup(world.pool_scheme, rows["from"])),
        "from_domain": _strings(world.authorities, _lookup(world.pool_authority, rows["from"])),
        "to_scheme": _strings(world.schemes, _lookup(world.pool_scheme, rows["to"])),
        "to_domain": _strings(world.authorities, _lookup(world.pool_authority, rows["to"])),
        "body_size": _ints(rows["body_size"], pa.int32()),
        "response_code": _ints(rows["code"], pa.int32()),
        "service": _strings(SERVICES, rows["service"]),
        "addresses": _ints(rows["addresses"], pa.int32()),
        # Anonymous runtimes: the generator does not model authenticated ones.
        "identity": pa.nulls(len(rows["ts"]), pa.string()),
    }
    return pa.Table.from_pydict(columns, schema=MESSAGES_ARROW_SCHEMA)


def _receipts_table(receipts: dict[str, IntArray], seed: int) -> pa.Table:
    event_id = pc.binary_join_element_wise(
        "$", pc.cast(pa.array(receipts["event"]), pa.string()), f"_s{seed}", ""
    )
    return pa.Table.from_pydict(
        {
            "event_id": event_id,
            "index_in_event": pa.array(receipts["idx"], pa.int32()),
            "delivered": pa.array(receipts["delivered"], pa.int32()),
            "ts": pa.array(receipts["ts"], pa.int64()),
        },
        schema=RECEIPTS_ARROW_SCHEMA,
    )


def _day(day_index: int) -> str:
    return datetime.fromtimestamp(day_index * DAY_MS / 1000, tz=UTC).strftime("%Y-%m-%d")


def _write_by_date(
    table: pa.Table, day_of_row: IntArray, directory: Path, name: str, row_group_rows: int
) -> int:
    files = 0
    for day in np.unique(day_of_row):
        part = table.filter(pa.array(day_of_row == day))
        target = directory / f"date={_day(int(day))}"
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, target / name, row_group_size=row_group_rows)
        files += 1
    return files


def generate_export(out_dir: str | Path, spec: SyntheticSpec | None = None) -> KnownAnswers:
    """Write a synthetic export under `out_dir` and return its expected aggregates."""
    spec = spec or SyntheticSpec()
    out = Path(out_dir)
    started = time.perf_counter()
    world = build_world(
        np.random.default_rng([spec.seed, 0]),
        domains=spec.domains,
        runtimes_per_domain=spec.runtimes_per_domain,
        hyperties_per_runtime=spec.hyperties_per_runtime,
        objects_per_runtime=spec.objects_per_runtime,
    )
    maker = ChunkMaker(world)
    answers = KnownAnswerBuilder(world, spec.top_n)
    chunks = max(1, math.ceil(spec.rows / spec.chunk_rows))
    duration_ms = max(60_000, int(spec.rows / spec.rate_per_s * 1000))
    window = max(1, duration_ms // chunks)
    files = 0
    for index in range(chunks):
        rng = np.random.default_rng([spec.seed, 1, index])
        target_rows = spec.rows // chunks + (1 if index < spec.rows % chunks else 0)
        chunk = maker.make(rng, spec.start_ms + index * window, window, target_rows)
        answers.add(chunk)
        name = f"part-{spec.run_id}-{index:05d}.parquet"
        files += _write_by_date(
            _messages_table(world, chunk.rows, spec.seed),
            chunk.rows["ots"] // DAY_MS,
            out / "messages",
            name,
            spec.row_group_rows,
        )
        files += _write_by_date(
            _receipts_table(chunk.receipts, spec.seed),
            chunk.receipts["ts"] // DAY_MS,
            out / "receipts",
            name,
            spec.row_group_rows,
        )
    known = answers.finish()
    runs = out / "_runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"{spec.run_id}.json").write_text(
        json.dumps(
            {
                "run_id": spec.run_id,
                "source": "synthetic",
                "server_name": SERVER_NAME,
                "spec": asdict(spec),
                "rows": known.summary["rows_read"],
                "events": known.summary["events"],
                "files": files,
                "skipped": {},
                "seconds": round(time.perf_counter() - started, 3),
            },
            indent=2,
        )
    )
    return known


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tests.support.synthetic.export", description="Write a synthetic room-event export"
    )
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--rows", type=int, default=SyntheticSpec.rows)
    parser.add_argument("--seed", type=int, default=SyntheticSpec.seed)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    known = generate_export(args.out, SyntheticSpec(rows=args.rows, seed=args.seed))
    rows = known.summary["rows_read"]
    print(
        f"wrote {rows['messages']} message rows and {rows['receipts']} receipt rows to "
        f"{args.out} in {time.perf_counter() - started:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

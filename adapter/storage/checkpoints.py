"""What the node writes at a checkpoint, in one transaction: the deliveries it keeps, the rows
runtimes have acknowledged, each lane's recovery position and the senders' marks as of those
positions (routing/settlement.py decides what goes in). Plus the node's start count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import orjson
from sqlalchemy import Connection, bindparam, delete, select, text, update

from .clock import utcnow
from .database import Database, upsert
from .models import LanePosition, NodeCounter, SenderMark
from .pending import KeptDelivery, delete_through, kept_payloads, kept_rows, write_kept

STARTS = "starts"
# A crowd moves a thousand marks per checkpoint: one statement that reads them all from one
# parameter, instead of a thousand executions (they cost the node a seventh of its CPU on
# PostgreSQL, and a tenth on SQLite at 2,000 runtimes x 5 msg/s).
_UPSERT_MARK = (
    "ON CONFLICT (process, origin) DO UPDATE SET seq = excluded.seq, "
    "updated_at = excluded.updated_at"
)
_MARKS_FROM_ARRAYS = text(
    "INSERT INTO sender_marks (process, origin, seq, updated_at) "
    "SELECT :process, o, s, :now FROM unnest(CAST(:origins AS text[]), CAST(:seqs AS bigint[])) "
    f"AS m(o, s) {_UPSERT_MARK}"
)
# SQLite: [[origin, seq], ...] as JSON. (An upsert from a SELECT needs its WHERE in SQLite.)
_MARKS_FROM_JSON = text(
    "INSERT INTO sender_marks (process, origin, seq, updated_at) "
    "SELECT :process, json_extract(value, '$[0]'), json_extract(value, '$[1]'), :now "
    f"FROM json_each(:marks) WHERE true {_UPSERT_MARK}"
).bindparams(bindparam("now", type_=SenderMark.__table__.c.updated_at.type))

# Origins deleted per statement (SQLite allows some hundreds of parameters in one).
_DROP_CHUNK = 500


class CheckpointStore:
    def __init__(self, db: Database, process: str = "") -> None:
        self._db = db
        self._process = process
        self._positions = upsert(
            db.dialect, LanePosition, ["process", "room_id"], ["event_id", "updated_at"]
        )
        self._marks_arrays = db.dialect == "postgresql"
        self._counter = upsert(db.dialect, NodeCounter, ["name"])

    async def next_start(self) -> int:
        """Count this start of the node and return the count (1 for the first)."""

        def op(conn: Connection) -> int:
            conn.execute(self._counter, {"name": STARTS, "value": 0})
            conn.execute(
                update(NodeCounter)
                .where(NodeCounter.name == STARTS)
                .values(value=NodeCounter.value + 1)
            )
            value = conn.execute(
                select(NodeCounter.value).where(NodeCounter.name == STARTS)
            ).scalar_one()
            return int(value)

        return await self._db.run(op)

    async def positions(self, process: str | None = None) -> dict[str, str]:
        """The recovery positions of this process, or of another ``process`` of the domain."""
        reader = self._process if process is None else process

        def op(conn: Connection) -> dict[str, str]:
            rows = conn.execute(
                select(LanePosition.room_id, LanePosition.event_id).where(
                    LanePosition.process == reader
                )
            )
            return {str(room): str(event) for room, event in rows}

        return await self._db.run(op)

    async def marks(self) -> dict[str, int]:
        def op(conn: Connection) -> dict[str, int]:
            rows = conn.execute(
                select(SenderMark.origin, SenderMark.seq).where(SenderMark.process == self._process)
            )
            return {str(origin): int(seq) for origin, seq in rows}

        return await self._db.run(op)

    async def commit(
        self,
        kept: Sequence[tuple[int, Sequence[KeptDelivery]]],
        deletes: Sequence[tuple[int, int]],
        positions: Mapping[str, str],
        marks: Mapping[str, int],
        dropped: Sequence[str] = (),
    ) -> None:
        """``dropped``: origins whose rows go (before ``marks`` are written: one that moved
        again since it was let go keeps its new mark)."""
        now = utcnow()
        rows = kept_rows(kept, now)
        payloads = kept_payloads(kept, now)
        position_rows = [
            {"process": self._process, "room_id": room, "event_id": event, "updated_at": now}
            for room, event in positions.items()
        ]
        mark_rows: dict[str, Any] = {"process": self._process, "now": now}
        if self._marks_arrays:
            mark_rows.update(origins=list(marks), seqs=list(marks.values()))
            mark_statement = _MARKS_FROM_ARRAYS
        else:
            mark_rows["marks"] = orjson.dumps(list(marks.items())).decode()
            mark_statement = _MARKS_FROM_JSON

        def op(conn: Connection) -> None:
            write_kept(conn, rows, payloads)
            delete_through(conn, deletes)
            if position_rows:
                conn.execute(self._positions, position_rows)
            for start in range(0, len(dropped), _DROP_CHUNK):
                conn.execute(
                    delete(SenderMark).where(
                        SenderMark.process == self._process,
                        SenderMark.origin.in_(dropped[start : start + _DROP_CHUNK]),
                    )
                )
            if marks:
                conn.execute(mark_statement, mark_rows)

        await self._db.run(op)

    async def save_position(self, room_id: str, event_id: str) -> None:
        await self.commit([], [], {room_id: event_id}, {})

    async def prune_marks(self, keep: timedelta) -> int:
        """Forget marks of origins that routed nothing for ``keep`` (their stubs are gone)."""
        cutoff = utcnow() - keep

        def op(conn: Connection) -> int:
            result = conn.execute(
                delete(SenderMark).where(SenderMark.updated_at < bindparam("cutoff")),
                {"cutoff": cutoff},
            )
            return int(result.rowcount or 0)

        return await self._db.run(op)

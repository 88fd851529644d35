"""`rethink-mn export`: the node's rooms, read from the homeserver, as a Parquet dataset.

Reads every room in the room map forward from where the previous run stopped (a pagination token
per room, kept in the database), with the appservice's credentials acting as each room's creator.
Every page becomes Parquet files whose names derive from the room and the page's start token, so
a page written again after an interrupted run replaces itself: no row is ever written twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from appservice.api import HomeserverClient, HomeserverUnreachable, MatrixError
from appservice.intent import AppserviceAPI

from .. import carrier
from ..analytics.schema import MESSAGES_ARROW_SCHEMA, RECEIPTS_ARROW_SCHEMA
from ..config import NodeConfig
from ..storage.database import Database
from ..storage.exports import ExportPositionStore
from ..storage.rooms import RoomStore
from .rows import Row, rows_for_event

EVENT_FILTER = {"types": [carrier.BATCH_EVENT, carrier.JOURNAL_EVENT]}


@dataclass
class ExportSummary:
    run_id: str
    rooms: int = 0
    events: int = 0
    message_rows: int = 0
    receipt_rows: int = 0
    files: int = 0
    undecodable: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.undecodable[reason] = self.undecodable.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "rooms": self.rooms,
            "events": self.events,
            "message_rows": self.message_rows,
            "receipt_rows": self.receipt_rows,
            "files": self.files,
            "undecodable": self.undecodable,
            "undecodable_total": sum(self.undecodable.values()),
        }


Progress = Callable[[str, int], None]  # (room alias, events so far in this run)


@dataclass(frozen=True)
class Paging:
    """How the rooms are read: events per request, and a pause after each full page.

    Every page costs the homeserver the serialising of its events in one go, while it also
    carries live traffic. A reader that runs beside that traffic (the dashboard's worker)
    takes small pages with pauses between them, so no single request holds the homeserver
    for long; `rethink-mn export` reads as fast as it can.
    """

    size: int = 500
    pause_seconds: float = 0.0
    # The pause is also at least this many times what the page took to arrive: a homeserver
    # that answers slowly (busy with live traffic) is asked less often.
    pause_factor: float = 0.0

    def pause_after(self, took_seconds: float) -> float:
        return max(self.pause_seconds, self.pause_factor * took_seconds)


class Positions(Protocol):
    """Where a reader of the rooms stopped: a pagination token per room."""

    async def get(self, room_id: str) -> tuple[str, int] | None: ...

    async def save(self, room_id: str, token: str, events_added: int) -> None: ...


class FilePositions:
    """Positions in a JSON file of their own, for a reader that is not `rethink-mn export`
    (the dashboard's worker): two readers sharing positions would each miss what the other
    read. Written atomically after every page."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            loaded = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            loaded = {}
        self._positions: dict[str, list[Any]] = loaded if isinstance(loaded, dict) else {}

    async def get(self, room_id: str) -> tuple[str, int] | None:
        saved = self._positions.get(room_id)
        return (str(saved[0]), int(saved[1])) if saved else None

    async def save(self, room_id: str, token: str, events_added: int) -> None:
        before = self._positions.get(room_id)
        self._positions[room_id] = [token, (int(before[1]) if before else 0) + events_added]
        tmp = self._path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(self._positions))
        os.replace(tmp, self._path)


def _write_parquet(rows: list[Row], schema: pa.Schema, directory: Path, name: str) -> int:
    """One file per date partition; atomic replace so a reader never sees half a file."""
    by_date: dict[str, list[Row]] = {}
    for row in rows:
        by_date.setdefault(row["date"], []).append(row)
    for date, part in by_date.items():
        target = directory / f"date={date}"
        target.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist(part, schema=schema)
        tmp = target / f".{name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, target / name)
    return len(by_date)


async def export(
    config: NodeConfig,
    out_dir: Path,
    *,
    paging: Paging = Paging(),
    progress: Progress | None = None,
    positions: Positions | None = None,
    record_run: bool = True,
) -> ExportSummary:
    """Export what is new in every room; `positions` default to the node's database. Each run
    leaves `_runs/<run id>.json` unless `record_run` is false (a worker that runs every minute)."""
    summary = ExportSummary(datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3))
    db = Database(config.database.url)
    positions = positions if positions is not None else ExportPositionStore(db)
    try:
        rooms = await RoomStore(db).all()
        async with aiohttp.ClientSession() as http:
            client = HomeserverClient(
                config.homeserver.url,
                config.appservice.as_token,
                http,
                max_retries=config.homeserver.max_retries,
                request_timeout=config.homeserver.request_timeout_seconds,
            )
            api = AppserviceAPI(
                client, config.homeserver.server_name, config.appservice.sender_localpart
            )
            for room_id, alias, _purpose, creator in rooms:
                summary.rooms += 1
                await _export_room(
                    api, positions, room_id, alias, creator, out_dir, paging, summary, progress
                )
    finally:
        await db.dispose()
    if not record_run:
        return summary
    runs = out_dir / "_runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"{summary.run_id}.json").write_bytes(
        orjson.dumps(summary.as_dict(), option=orjson.OPT_INDENT_2)
    )
    return summary


async def _export_room(
    api: AppserviceAPI,
    positions: Positions,
    room_id: str,
    alias: str,
    creator: str,
    out_dir: Path,
    paging: Paging,
    summary: ExportSummary,
    progress: Progress | None,
) -> None:
    reader = api.intent(creator)
    saved = await positions.get(room_id)
    token = saved[0] if saved else None
    seen = 0
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        page = await reader.messages(
            room_id, start=token, direction="f", limit=paging.size, event_filter=EVENT_FILTER
        )
        took = loop.time() - asked
        chunk = [e for e in page["chunk"] if isinstance(e, dict)]
        end = page.get("end")
        if chunk:
            messages, receipts = await _rows(api, chunk, summary)
            name = (
                "part-"
                + hashlib.sha256(f"{room_id}\n{token}".encode()).hexdigest()[:20]
                + ".parquet"
            )
            summary.files += await asyncio.to_thread(
                _write_parquet, messages, MESSAGES_ARROW_SCHEMA, out_dir / "messages", name
            )
            summary.files += await asyncio.to_thread(
                _write_parquet, receipts, RECEIPTS_ARROW_SCHEMA, out_dir / "receipts", name
            )
            summary.events += len(chunk)
            summary.message_rows += len(messages)
            summary.receipt_rows += len(receipts)
            seen += len(chunk)
            if progress is not None:
                progress(alias, seen)
        if not isinstance(end, str) or not end or end == token:
            return
        # Saved only after the page's files are in place: an interruption repeats the page,
        # which rewrites the same files.
        await positions.save(room_id, end, len(chunk))
        token = end
        if not chunk:
            return
        if len(chunk) >= paging.size and (pause := paging.pause_after(took)) > 0:
            await asyncio.sleep(pause)


async def _rows(
    api: AppserviceAPI, events: list[dict[str, Any]], summary: ExportSummary
) -> tuple[list[Row], list[Row]]:
    async def fetch(uri: str) -> bytes:
        try:
            return await api.bot.download(uri)
        except MatrixError as exc:
            raise carrier.CarrierError(f"media unavailable ({exc.status})") from None

    messages: list[Row] = []
    receipts: list[Row] = []
    for event in events:
        try:
            m, r = await rows_for_event(event, fetch)
        except carrier.CarrierError as exc:
            summary.skip(str(exc).split(":", 1)[0])
            continue
        messages += m
        receipts += r
    return messages, receipts


__all__ = ["ExportSummary", "HomeserverUnreachable", "Paging", "export"]

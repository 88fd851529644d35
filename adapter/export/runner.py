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
from typing import Any

import aiohttp
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from appservice.api import HomeserverClient, HomeserverUnreachable, MatrixError
from appservice.intent import AppserviceAPI

from .. import carrier
from ..analytics.schema import MESSAGES_ARROW_SCHEMA, RECEIPTS_ARROW_SCHEMA
from ..config import NodeConfig
from ..storage.database import Database
from ..storage.exports import ExportPositionStore
from ..storage.rooms import RoomStore
from .admission import EventAdmission
from .rows import Row, rows_for_event

EVENT_FILTER = {"types": [carrier.BATCH_EVENT, carrier.JOURNAL_EVENT]}
# Failures of the homeserver, not of an event: they end the run, which a next one repeats.
PASSING = (HomeserverUnreachable, aiohttp.ClientError, TimeoutError, ConnectionError)

log = structlog.get_logger(__name__)


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


def write_parquet(rows: list[Row], schema: pa.Schema, directory: Path, name: str) -> int:
    """One file per date partition; atomic replace so a reader never sees half a file."""
    by_date: dict[str, list[Row]] = {}
    for row in rows:
        by_date.setdefault(row["date"], []).append(row)
    for date, part in by_date.items():
        target = directory / f"date={date}"
        target.mkdir(parents=True, exist_ok=True)
        table = _table(part, schema)
        tmp = target / f".{name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, target / name)
    return len(by_date)


_UNCONVERTIBLE = (pa.ArrowException, TypeError, ValueError, OverflowError)


def _table(rows: list[Row], schema: pa.Schema) -> pa.Table:
    """The rows as a table of ``schema``; a row its columns cannot hold (rows.py keeps every
    value in range, so this is a guard) is left out and logged, not the file."""
    try:
        return pa.Table.from_pylist(rows, schema=schema)
    except _UNCONVERTIBLE:
        kept = []
        for row in rows:
            try:
                pa.Table.from_pylist([row], schema=schema)
            except _UNCONVERTIBLE as exc:
                log.warning("an export row left out", error=repr(exc)[:300])
                continue
            kept.append(row)
        return pa.Table.from_pylist(kept, schema=schema)


async def export(
    config: NodeConfig,
    out_dir: Path,
    *,
    page_size: int = 500,
    progress: Progress | None = None,
) -> ExportSummary:
    """Export what is new in every room since the previous run; leaves `_runs/<run id>.json`."""
    summary = ExportSummary(datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3))
    db = Database(config.database.url)
    positions = ExportPositionStore(db)
    try:
        rooms = await RoomStore(db).all()
        admission = EventAdmission.for_node(config)
        async with aiohttp.ClientSession() as http:
            api = homeserver_api(config, http)
            for room_id, alias, _purpose, creator in rooms:
                summary.rooms += 1
                await _export_room(
                    api,
                    positions,
                    room_id,
                    alias,
                    creator,
                    out_dir,
                    page_size,
                    summary,
                    progress,
                    admission,
                )
    finally:
        await db.dispose()
    runs = out_dir / "_runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"{summary.run_id}.json").write_bytes(
        orjson.dumps(summary.as_dict(), option=orjson.OPT_INDENT_2)
    )
    return summary


def homeserver_api(config: NodeConfig, http: aiohttp.ClientSession) -> AppserviceAPI:
    """The appservice's view of the homeserver, for reading rooms and downloading media."""
    client = HomeserverClient(
        config.homeserver.url,
        config.appservice.as_token,
        http,
        max_retries=config.homeserver.max_retries,
        request_timeout=config.homeserver.request_timeout_seconds,
    )
    return AppserviceAPI(client, config.homeserver.server_name, config.appservice.sender_localpart)


async def _export_room(
    api: AppserviceAPI,
    positions: ExportPositionStore,
    room_id: str,
    alias: str,
    creator: str,
    out_dir: Path,
    page_size: int,
    summary: ExportSummary,
    progress: Progress | None,
    admission: EventAdmission,
) -> None:
    reader = api.intent(creator)
    saved = await positions.get(room_id)
    token = saved[0] if saved else None
    seen = 0
    while True:
        page = await reader.messages(
            room_id, start=token, direction="f", limit=page_size, event_filter=EVENT_FILTER
        )
        chunk = [e for e in page["chunk"] if isinstance(e, dict)]
        end = page.get("end")
        if chunk:
            messages, receipts = await event_rows(api, chunk, summary, admission)
            name = (
                "part-"
                + hashlib.sha256(f"{room_id}\n{token}".encode()).hexdigest()[:20]
                + ".parquet"
            )
            summary.files += await asyncio.to_thread(
                write_parquet, messages, MESSAGES_ARROW_SCHEMA, out_dir / "messages", name
            )
            summary.files += await asyncio.to_thread(
                write_parquet, receipts, RECEIPTS_ARROW_SCHEMA, out_dir / "receipts", name
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


async def event_rows(
    api: AppserviceAPI,
    events: list[dict[str, Any]],
    summary: ExportSummary,
    admission: EventAdmission,
) -> tuple[list[Row], list[Row]]:
    """The export rows of carrier events the node counts (``admission``); media-carried
    batches are downloaded, and an event that cannot be decoded, or is not counted, is counted
    in the summary by reason."""

    async def fetch(uri: str) -> bytes:
        try:
            return await api.bot.download(uri)
        except MatrixError as exc:
            raise carrier.CarrierError(f"media unavailable ({exc.status})") from None

    messages: list[Row] = []
    receipts: list[Row] = []
    for event in events:
        origin = admission.origin(event)
        if origin is None:
            summary.skip("not this node's or a peer node's event")
            continue
        try:
            m, r = await rows_for_event(event, fetch)
        except carrier.CarrierError as exc:
            summary.skip(str(exc).split(":", 1)[0])
            continue
        except PASSING:
            raise  # the homeserver away: the whole run (or cycle) comes again
        except Exception as exc:  # noqa: BLE001 - one event's failure, not the run's
            # Whatever an event holds (a peer's, or one stored before a bound existed), the
            # events after it are exported: it is skipped, counted by reason and logged.
            reason = f"failed: {type(exc).__name__}"
            if reason not in summary.undecodable:
                log.warning("an event could not be exported", error=repr(exc)[:300])
            summary.skip(reason)
            continue
        messages += admission.rows(origin, m)
        receipts += r
    return messages, receipts


__all__ = ["ExportSummary", "HomeserverUnreachable", "event_rows", "export", "write_parquet"]

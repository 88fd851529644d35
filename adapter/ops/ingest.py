"""The worker's side of the dashboard's export: spool files in, export rows out.

The node's tap (adapter/ops/tap.py) leaves a file of room events about once a second. Each
cycle the worker claims what is there by moving it into `spool/claimed-<first file>/` (a
rename: the tap never writes into a claimed directory; a backlog goes into several such
directories of bounded size), turns each claim into one Parquet file per table named after its
directory, and deletes the directory. A worker that dies half-way
finds the claimed directory again and writes the same files over: no row is written twice.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import orjson

from ..analytics.schema import MESSAGES_ARROW_SCHEMA, RECEIPTS_ARROW_SCHEMA
from ..config import NodeConfig
from ..export.admission import EventAdmission
from ..export.runner import ExportSummary, event_rows, homeserver_api, write_parquet
from .layout import DashboardLayout
from .tap import SPOOL_SUFFIX

CLAIMED_PREFIX: Final = "claimed-"
# Spool bytes turned into rows at a time (the events of a claim are all in memory at once).
CLAIM_BYTES: Final = 32 * 2**20


@dataclass
class Claim:
    directory: Path

    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*" + SPOOL_SUFFIX)):
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(orjson.JSONDecodeError):
                    event = orjson.loads(line)
                    if isinstance(event, dict):
                        events.append(event)
        return events


def claim(spool_dir: Path, max_bytes: int = CLAIM_BYTES) -> list[Claim]:
    """Claims left by an earlier run, then new ones for the spool files there now, each of at
    most `max_bytes` (or one file): a backlog (a worker that was down) is read a part at a time."""
    claims = sorted(
        (Claim(d) for d in spool_dir.glob(CLAIMED_PREFIX + "*") if d.is_dir()),
        key=lambda c: c.directory.name,
    )
    group: list[Path] = []
    size = 0
    for path in [*sorted(spool_dir.glob("*" + SPOOL_SUFFIX)), None]:
        length = path.stat().st_size if path is not None else 0
        if group and (path is None or size + length > max_bytes):
            directory = spool_dir / (CLAIMED_PREFIX + group[0].name.removesuffix(SPOOL_SUFFIX))
            directory.mkdir(mode=0o700, exist_ok=True)
            for taken in group:
                os.replace(taken, directory / taken.name)
            claims.append(Claim(directory))
            group, size = [], 0
        if path is not None:
            group.append(path)
            size += length
    return claims


async def ingest_spool(config: NodeConfig, layout: DashboardLayout) -> ExportSummary:
    """Turn what the node spooled into export rows under `layout.export_dir`."""
    summary = ExportSummary("dashboard")
    claims = claim(layout.spool_dir)
    if not claims:
        return summary
    admission = EventAdmission.for_node(config)
    async with aiohttp.ClientSession() as http:
        api = homeserver_api(config, http)
        for taken in claims:
            events = taken.events()
            messages, receipts = await event_rows(api, events, summary, admission)
            name = f"part-{taken.directory.name.removeprefix(CLAIMED_PREFIX)}.parquet"
            for rows, schema, table in (
                (messages, MESSAGES_ARROW_SCHEMA, "messages"),
                (receipts, RECEIPTS_ARROW_SCHEMA, "receipts"),
            ):
                summary.files += write_parquet(rows, schema, layout.export_dir / table, name)
            summary.events += len(events)
            summary.message_rows += len(messages)
            summary.receipt_rows += len(receipts)
            shutil.rmtree(taken.directory, ignore_errors=True)
    return summary

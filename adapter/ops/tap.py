"""The node's side of the dashboard's export: the carrier events the homeserver pushes anyway.

An appservice receives every event of its own users and of the rooms they are in: each batch and
journal event the node sends comes back in a transaction, and so does each one a peer domain
sends into a shared room. The tap keeps those (after the transaction was handled, so a retried
transaction is kept once) and about once a second appends them to a new file in the spool
directory, where the worker (adapter/ops/ingest.py) turns them into export rows.

Before, the worker read the rooms back from the homeserver; under a crowd that reading was most
of what the dashboard cost the node's latency (docs/benchmark.md, "The live dashboard under a
crowd"). Taking the events here costs one serialisation per event on the event loop, and a
file write per second in a thread.

Bounded both ways: in memory by `max_buffered_bytes` (a stuck disk), on disk by the window
(older spool files are useless to the dashboard) and by `max_spool_bytes` (a worker that is
not consuming). What does not fit is dropped and counted: the dashboard is not worth traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import orjson
import structlog

from appservice.server import TransactionHandler

from .. import carrier
from ..observability import NodeMetrics
from ..private_files import write_private

log = structlog.get_logger("rethink_mn.dashboard")

TAPPED_TYPES: Final = frozenset({carrier.BATCH_EVENT, carrier.JOURNAL_EVENT})
SPOOL_SUFFIX: Final = ".jsonl"


def spool_file_ms(path: Path) -> int | None:
    """When a spool file was written, from its name (`<ms>-<pid>-<n>.jsonl`)."""
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else None


class EventTap:
    def __init__(
        self,
        spool_dir: Path,
        metrics: NodeMetrics,
        *,
        keep_seconds: float,
        flush_seconds: float = 1.0,
        max_buffered_bytes: int = 64 * 2**20,
        max_spool_bytes: int = 2**30,
    ) -> None:
        self._dir = spool_dir
        self._metrics = metrics
        self._keep_seconds = keep_seconds
        self._flush_seconds = flush_seconds
        self._max_buffered = max_buffered_bytes
        self._max_spool = max_spool_bytes
        self._lines: list[bytes] = []
        self._buffered = 0
        self._written = 0
        self._task: asyncio.Task[None] | None = None

    def observe(self, events: Iterable[dict[str, Any]]) -> None:
        for event in events:
            if event.get("type") not in TAPPED_TYPES:
                continue
            try:
                line = orjson.dumps(event)
            except TypeError:  # not JSON (cannot come from a parsed transaction)
                continue
            if self._buffered + len(line) > self._max_buffered:
                self._metrics.dashboard_dropped.labels("buffer_full").inc()
                continue
            self._lines.append(line)
            self._buffered += len(line)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="dashboard-tap")

    async def stop(self) -> None:
        """Stop the timer and write what is buffered."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._flush_seconds)
            try:
                await self.flush()
            except OSError as exc:
                log.warning("dashboard spool not written", error=repr(exc))

    async def flush(self) -> None:
        if not self._lines:
            return
        lines, self._lines, self._buffered = self._lines, [], 0
        self._written += 1
        name = f"{int(time.time() * 1000):013d}-{os.getpid()}-{self._written}{SPOOL_SUFFIX}"
        await asyncio.to_thread(self._write, name, lines)

    def _write(self, name: str, lines: list[bytes]) -> None:
        if self._spool_bytes_after_pruning() + sum(map(len, lines)) > self._max_spool:
            self._metrics.dashboard_dropped.labels("spool_full").inc(len(lines))
            return
        lines.append(b"")
        write_private(self._dir / name, b"\n".join(lines))

    def _spool_bytes_after_pruning(self) -> int:
        """Delete spool files older than the window; the size of the rest."""
        oldest_kept = (time.time() - self._keep_seconds) * 1000
        total = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self._dir) as entries:
            for entry in entries:
                if not entry.name.endswith(SPOOL_SUFFIX):
                    continue
                written = spool_file_ms(Path(entry.name))
                if written is not None and written < oldest_kept:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    total += entry.stat().st_size
        return total


class TappedTransactions:
    """The node's transaction handler, with what each handled transaction held kept for the
    dashboard. A transaction that fails is kept when it comes again and goes through."""

    def __init__(self, inner: TransactionHandler, tap: EventTap) -> None:
        self._inner = inner
        self._tap = tap

    async def handle_events(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        await self._inner.handle_events(txn_id, events)
        self._tap.observe(events)

    async def handle_ephemeral(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        await self._inner.handle_ephemeral(txn_id, events)

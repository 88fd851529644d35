"""Where the dashboard's worker keeps things, shared by the worker (writes) and the node (reads).

<state_dir>/spool/             room events the node took from its transactions (adapter/ops/tap.py)
<state_dir>/spool/claimed-*/   spool files the worker is turning into export rows
<state_dir>/export/            the worker's export (messages/, receipts/)
<state_dir>/live/              the window's partials and open tables (adapter/ops/live_state.py)
<state_dir>/aggregates/<n>/    the window's aggregates as of cycle n
<state_dir>/current            symlink to the newest finished aggregates/<n>
<state_dir>/status.json        how the last cycle went
<state_dir>/worker.log         the worker's (and Spark's) stderr
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from ..private_files import private_dir


class DashboardLayout:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir
        self.spool_dir = state_dir / "spool"
        self.export_dir = state_dir / "export"
        self.live_dir = state_dir / "live"
        self.aggregates_dir = state_dir / "aggregates"
        self.current = state_dir / "current"
        self.status_file = state_dir / "status.json"
        self.log_file = state_dir / "worker.log"

    def prepare(self) -> None:
        for directory in (
            self.root,
            self.spool_dir,
            self.export_dir,
            self.live_dir,
            self.aggregates_dir,
        ):
            private_dir(directory)

    def new_cycle_dir(self, cycle: int) -> Path:
        # Named by time as well: cycle numbers start again when the worker restarts.
        target = self.aggregates_dir / f"{int(time.time() * 1000)}-{cycle}"
        target.mkdir(parents=True)
        return target

    def publish(self, target: Path) -> None:
        """Point `current` at `target` in one step (rename over the old link)."""
        link = self.root / ".current.tmp"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(target.relative_to(self.root))
        os.replace(link, self.current)

    def drop_old_cycles(self, keep: int) -> None:
        cycles = sorted(
            (d for d in self.aggregates_dir.iterdir() if d.is_dir()),
            key=lambda d: d.stat().st_mtime,
        )
        current = self.published()
        for directory in cycles[:-keep]:
            if directory != current:
                shutil.rmtree(directory, ignore_errors=True)

    def published(self) -> Path | None:
        """The aggregates directory `current` points at, if any."""
        try:
            return self.current.resolve(strict=True)
        except (OSError, RuntimeError):
            return None

    def write_status(self, status: dict[str, Any]) -> None:
        tmp = self.root / ".status.tmp"
        tmp.write_bytes(orjson.dumps(status))
        os.replace(tmp, self.status_file)

    def read_status(self) -> dict[str, Any] | None:
        try:
            status = orjson.loads(self.status_file.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return status if isinstance(status, dict) else None

"""The live window's state on disk: one generation per cycle that read new rows.

<state_dir>/live/<n>/partials/<table>.parquet   what cycle n's new rows added (increments.py)
<state_dir>/live/<n>/open/<table>.parquet       the open tables after cycle n (only the current
                                                generation keeps them)
<state_dir>/live/<n>/meta.json                  export files read so far, newest minute
<state_dir>/live/current                        symlink to the newest finished generation

A generation is written under a temporary name, renamed, then published by replacing the
symlink. A worker that dies before the symlink moves leaves a generation newer than `current`,
deleted on the next start, and the same export files are read again: no row counts twice, none
is lost. Generations whose partials all lie before the window are deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from adapter.analytics.increments import OPEN_MESSAGES, OPEN_SCHEMAS, PARTIALS, increment
from adapter.analytics.spark_schema import MESSAGES_SCHEMA, RECEIPTS_SCHEMA
from adapter.analytics.window import merge_window
from adapter.private_files import private_dir

META: Final = "meta.json"
CURRENT: Final = "current"
TABLES: Final = ("messages", "receipts")
UNREADABLE_SUFFIX: Final = ".unreadable"


def footer_rows_and_newest(path: Path) -> tuple[int, int | None]:
    """The rows of a Parquet file and its largest `ts`, from its footer (no data read); None
    for the `ts` when the footer does not say."""
    try:
        metadata = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException, ValueError):
        return 0, None
    index = metadata.schema.to_arrow_schema().get_field_index("ts")
    newest: int | None = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics if index >= 0 else None
        if stats is None or not stats.has_min_max:
            return metadata.num_rows, None
        value = int(stats.max)
        newest = value if newest is None else max(newest, value)
    return metadata.num_rows, newest


@dataclass
class Generation:
    directory: Path
    consumed: set[str] = field(default_factory=set)
    newest_minute: int | None = None

    @property
    def number(self) -> int:
        return int(self.directory.name)

    def partial(self, table: str) -> Path:
        return self.directory / "partials" / f"{table}.parquet"

    def open_table(self, table: str) -> Path:
        return self.directory / "open" / f"{table}.parquet"

    @classmethod
    def load(cls, directory: Path) -> Generation:
        meta = json.loads((directory / META).read_text())
        return cls(directory, set(meta["consumed"]), meta["newest_minute"])


class LiveState:
    def __init__(self, root: Path, export_dir: Path) -> None:
        self.root = root
        self.export_dir = export_dir

    def _generations(self) -> list[Path]:
        return sorted(
            (d for d in self.root.iterdir() if d.is_dir() and d.name.isdigit()),
            key=lambda d: int(d.name),
        )

    def current(self) -> Generation | None:
        try:
            return Generation.load((self.root / CURRENT).resolve(strict=True))
        except (OSError, RuntimeError, ValueError, KeyError):
            return None

    def _recover(self) -> Generation | None:
        """The current generation, after deleting what a dead worker left half-done."""
        private_dir(self.root)
        current = self.current()
        number = current.number if current is not None else -1
        for directory in self.root.iterdir():
            if directory.name.endswith(".tmp") or (
                directory.name.isdigit() and int(directory.name) > number
            ):
                shutil.rmtree(directory, ignore_errors=True)
        return current

    def new_files(self, consumed: set[str]) -> dict[str, list[str]]:
        """Export files not read yet, per table."""
        return {
            table: sorted(
                str(path)
                for path in (self.export_dir / table).glob("date=*/*.parquet")
                if path.name not in consumed
            )
            for table in TABLES
        }

    def advance(self, session: Callable[[], SparkSession], since_ms: int) -> int:
        """Read the export files no generation has read, into a new generation; the number of
        rows read. With nothing new, no generation is made and `session` is not called: Spark
        starts with the first traffic."""
        current = self._recover()
        consumed = current.consumed if current is not None else set()
        files = self.new_files(consumed)
        if not any(files.values()):
            return 0
        spark = session()

        def read(table: str, schema: StructType) -> DataFrame:
            if not files[table]:
                return spark.createDataFrame([], schema)
            base = str(self.export_dir / table)
            return spark.read.schema(schema).option("basePath", base).parquet(*files[table])

        def opened(table: str) -> DataFrame:
            path = current.open_table(table) if current is not None else None
            if path is None or not path.exists():
                return spark.createDataFrame([], OPEN_SCHEMAS[table])
            return spark.read.schema(OPEN_SCHEMAS[table]).parquet(str(path))

        messages = read("messages", MESSAGES_SCHEMA).persist()
        receipts = read("receipts", RECEIPTS_SCHEMA).persist()
        try:
            footers = [footer_rows_and_newest(Path(p)) for paths in files.values() for p in paths]
            rows = sum(count for count, _ in footers)
            newest = max((ts for _, ts in footers if ts is not None), default=since_ms)
            frames = increment(
                messages, receipts, {t: opened(t) for t in OPEN_SCHEMAS}, since_ms, newest
            )
            number = current.number + 1 if current is not None else 0
            staging = self.root / f"{number}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            newest_minute: int | None = None
            for name, frame in frames.items():
                table = frame.toArrow()
                kind = "partials" if name in PARTIALS else "open"
                (staging / kind).mkdir(parents=True, exist_ok=True)
                pq.write_table(table, staging / kind / f"{name}.parquet")
                top = pc.max(table.column("minute")).as_py() if kind == "partials" else None
                if top is not None and (newest_minute is None or top > newest_minute):
                    newest_minute = top
        except Exception as error:
            self._set_aside_unreadable(error, [p for paths in files.values() for p in paths])
            raise
        finally:
            spark.catalog.clearCache()
        still_there = {Path(p).name for p in self._all_export_files()}
        read_names = {Path(p).name for paths in files.values() for p in paths}
        meta = {
            "consumed": sorted((consumed & still_there) | read_names),
            "newest_minute": newest_minute,
        }
        (staging / META).write_text(json.dumps(meta))
        final = self.root / str(number)
        os.replace(staging, final)
        self._publish(final)
        self._drop_old(since_ms, number)
        return rows

    @staticmethod
    def _set_aside_unreadable(error: Exception, paths: list[str]) -> None:
        """A file Spark could not read would fail every cycle from now on: the one the error
        names is renamed out of the export's pattern (kept for a look), and the cycle fails
        once, not for ever."""
        for path in paths:
            if path in str(error):
                with contextlib.suppress(OSError):
                    os.replace(path, path + UNREADABLE_SUFFIX)

    def _all_export_files(self) -> list[Path]:
        return [p for table in TABLES for p in (self.export_dir / table).glob("date=*/*.parquet")]

    def _publish(self, generation: Path) -> None:
        link = self.root / ".current.tmp"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(generation.name)
        os.replace(link, self.root / CURRENT)

    def _drop_old(self, since_ms: int, current: int) -> None:
        for directory in self._generations():
            if int(directory.name) == current:
                continue
            shutil.rmtree(directory / "open", ignore_errors=True)
            try:
                newest = Generation.load(directory).newest_minute
            except (OSError, ValueError, KeyError):
                newest = None
            if newest is None or newest < since_ms:
                shutil.rmtree(directory, ignore_errors=True)

    def merge(self, output: Path, since_ms: int, top_n: int) -> dict[str, Any]:
        """The window's aggregates and summary in `output`, from the published generations."""
        current = self._recover()
        generations = [
            Generation(d)
            for d in self._generations()
            if current is not None and int(d.name) <= current.number
        ]
        partials = {
            table: [g.partial(table) for g in generations if g.partial(table).exists()]
            for table in PARTIALS
        }
        waiting: list[dict[str, Any]] = []
        if current is not None and current.open_table(OPEN_MESSAGES).exists():
            waiting = pq.read_table(current.open_table(OPEN_MESSAGES)).to_pylist()
        return merge_window(partials, waiting, since_ms, output, top_n)

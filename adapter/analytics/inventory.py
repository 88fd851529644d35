"""Find the Parquet files of one export dataset and check each before Spark reads it.

Spark's `ignoreCorruptFiles` skips unreadable files silently; an operator needs to know *what*
was skipped. So the driver lists the dataset itself and reads every file's footer (a few kB, not
the data) with pyarrow: files that are not Parquet, whose columns have a type Spark cannot read
into the export schema, or that sit outside the `date=YYYY-MM-DD/` layout are reported and left
out; missing columns are counted (Spark reads them as null). Corruption inside data pages only
shows while reading: the job compares the footers' row counts with the rows Spark returned.

Listing goes through `pyarrow.fs`, which handles local paths and the usual cluster stores; for a
URI pyarrow cannot open (e.g. Hadoop's `s3a://`) the inventory says so and the job falls back to
letting Spark list and skip on its own.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from adapter.analytics.schema import PARTITION_COLUMN


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass
class DatasetInventory:
    """What one dataset directory (`<export>/messages` or `<export>/receipts`) holds."""

    name: str
    root: str
    """The dataset directory as Spark should see it (same scheme as the job's --input)."""
    listed: bool = True
    """False when the directory could not be listed by the driver (Spark lists it instead)."""
    listing_error: str | None = None
    root_exists: bool = False
    readable_files: list[str] = field(default_factory=list)
    file_rows: dict[str, int] = field(default_factory=dict)
    """Rows each readable file's footer announces."""
    footer_rows: int = 0
    skipped: list[SkippedFile] = field(default_factory=list)
    missing_columns: Counter[str] = field(default_factory=Counter)

    def exclude(self, path: str, reason: str) -> None:
        """Stop reading a file found unreadable later (e.g. corrupt data behind a good footer)."""
        self.readable_files.remove(path)
        self.footer_rows -= self.file_rows.pop(path, 0)
        self.skipped.append(SkippedFile(path, reason))

    def report(self) -> dict[str, object]:
        return {
            "root": self.root,
            "listed_by_driver": self.listed,
            "listing_error": self.listing_error,
            "directory_exists": self.root_exists,
            "files_readable": len(self.readable_files),
            "files_skipped": len(self.skipped),
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "rows_in_footers": self.footer_rows,
            "files_missing_column": dict(sorted(self.missing_columns.items())),
        }


def split_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or any URI pyarrow understands."""
    if "://" in uri:
        filesystem, path = pafs.FileSystem.from_uri(uri)
        return filesystem, str(path)
    return pafs.LocalFileSystem(), os.path.abspath(uri)


def _is_hidden(relative: PurePosixPath) -> bool:
    # Spark's own rule for data files: names starting with `_` or `.` are metadata (_SUCCESS, .crc).
    return any(part.startswith(("_", ".")) for part in relative.parts)


def _normalise(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return pa.string()
    return data_type


def _readable_as(found: pa.DataType, expected: pa.DataType) -> bool:
    found = _normalise(found)
    if found == expected:
        return True
    # Spark widens integers on read (INT32 into a long column), never narrows.
    return bool(expected == pa.int64() and found in (pa.int32(), pa.int16(), pa.int8()))


def _check_file(
    filesystem: pafs.FileSystem, path: str, expected: pa.Schema
) -> tuple[str | None, int, list[str]]:
    """(reason to skip or None, rows in footer, missing columns)."""
    try:
        with filesystem.open_input_file(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
            arrow_schema = metadata.schema.to_arrow_schema()
    except (OSError, pa.ArrowException, ValueError) as exc:
        return f"not a readable Parquet file: {exc}", 0, []
    missing: list[str] = []
    for column in expected:
        index = arrow_schema.get_field_index(column.name)
        if index < 0:
            missing.append(column.name)
            continue
        found = arrow_schema.field(index).type
        if not _readable_as(found, column.type):
            return f"column {column.name!r} has type {found}, expected {column.type}", 0, []
    return None, int(metadata.num_rows), missing


def inventory_dataset(input_root: str, name: str, expected: pa.Schema) -> DatasetInventory:
    """List `<input_root>/<name>` and check every data file's footer against `expected`."""
    spark_root = input_root.rstrip("/") + "/" + name
    inventory = DatasetInventory(name=name, root=spark_root)
    try:
        filesystem, base = split_uri(input_root)
    except (pa.ArrowException, ValueError, OSError) as exc:
        inventory.listed = False
        inventory.listing_error = str(exc)
        return inventory
    dataset_dir = base.rstrip("/") + "/" + name
    info = filesystem.get_file_info(dataset_dir)
    if info.type != pafs.FileType.Directory:
        return inventory
    inventory.root_exists = True
    selector = pafs.FileSelector(dataset_dir, recursive=True, allow_not_found=True)
    files = sorted(
        (entry for entry in filesystem.get_file_info(selector) if entry.type == pafs.FileType.File),
        key=lambda entry: entry.path,
    )
    for entry in files:
        relative = PurePosixPath(entry.path).relative_to(dataset_dir)
        if _is_hidden(relative):
            continue
        spark_path = spark_root + "/" + relative.as_posix()
        if len(relative.parts) != 2 or not relative.parts[0].startswith(PARTITION_COLUMN + "="):
            inventory.skipped.append(
                SkippedFile(spark_path, f"outside the {PARTITION_COLUMN}=YYYY-MM-DD/ layout")
            )
            continue
        reason, rows, missing = _check_file(filesystem, entry.path, expected)
        if reason is not None:
            inventory.skipped.append(SkippedFile(spark_path, reason))
            continue
        inventory.readable_files.append(spark_path)
        inventory.file_rows[spark_path] = rows
        inventory.footer_rows += rows
        inventory.missing_columns.update(missing)
    return inventory

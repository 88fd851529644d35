"""The job's output directory: one Parquet file per aggregate, plus summary.json.

Aggregates are small by construction (sums over rollups), so the driver writes them itself with
pyarrow: no Spark job, no commit protocol, a few milliseconds each instead of about a second.
For a URI pyarrow cannot open (e.g. Hadoop's `s3a://`) Spark's writer is used instead.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame

from adapter.analytics.inventory import split_uri

PART_FILE = "part-00000.parquet"


class OutputDir:
    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.filesystem: pafs.FileSystem | None
        self.base: str
        try:
            self.filesystem, self.base = split_uri(uri)
            self.filesystem.create_dir(self.base, recursive=True)
        except (pa.ArrowException, ValueError, OSError):
            self.filesystem, self.base = None, self.uri

    def _path(self, name: str) -> str:
        return self.base.rstrip("/") + "/" + name

    def remove(self, name: str) -> None:
        """Drop an aggregate left by an earlier run, so stale numbers are never shown."""
        if self.filesystem is None:
            return
        if self.filesystem.get_file_info(self._path(name)).type == pafs.FileType.Directory:
            self.filesystem.delete_dir(self._path(name))

    def write_aggregate(self, name: str, frame: DataFrame) -> list[dict[str, Any]]:
        """Compute `frame`, store it as `<name>/part-00000.parquet`, return its rows."""
        if self.filesystem is None:
            frame.coalesce(1).write.mode("overwrite").parquet(self._path(name))
            return [
                row.asDict() for row in frame.sparkSession.read.parquet(self._path(name)).collect()
            ]
        table = frame.toArrow()
        self.remove(name)
        self.filesystem.create_dir(self._path(name), recursive=True)
        with self.filesystem.open_output_stream(self._path(name) + "/" + PART_FILE) as stream:
            pq.write_table(table, stream)
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows

    def write_text(self, name: str, text: str) -> str | None:
        """Write a small text file; None when the directory is not reachable from the driver."""
        if self.filesystem is None:
            return None
        with self.filesystem.open_output_stream(self._path(name)) as stream:
            stream.write(text.encode("utf-8"))
        return self._path(name)

"""Spark schemas of the export's two datasets, built from the column lists in `schema`.

Kept apart from `schema` so that only the job loads pyspark: the export and the dashboard use the
Arrow side alone.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import (
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from adapter.analytics.schema import (
    MESSAGES_COLUMNS,
    PARTITION_COLUMN,
    RECEIPTS_COLUMNS,
    ColumnKind,
)

_SPARK_TYPES: Final[dict[ColumnKind, DataType]] = {
    "string": StringType(),
    "int32": IntegerType(),
    "int64": LongType(),
}


def _spark_schema(columns: tuple[tuple[str, ColumnKind], ...]) -> StructType:
    # Every column nullable: Parquet readers treat them so anyway, and the export leaves fields
    # null when a message lacks them.
    fields = [StructField(name, _SPARK_TYPES[kind], nullable=True) for name, kind in columns]
    fields.append(StructField(PARTITION_COLUMN, StringType(), nullable=True))
    return StructType(fields)


MESSAGES_SCHEMA: Final[StructType] = _spark_schema(MESSAGES_COLUMNS)
"""Spark schema of `messages`, partition column `date` (string) last."""

RECEIPTS_SCHEMA: Final[StructType] = _spark_schema(RECEIPTS_COLUMNS)
"""Spark schema of `receipts`, partition column `date` (string) last."""

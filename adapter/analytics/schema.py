"""The two datasets of the room-event export (docs/export-schema.md): columns and Arrow schemas.

One column list drives the Arrow schemas here and the Spark schemas in `spark_schema`, so the
export, the job (Spark) and the synthetic generator (pyarrow) cannot drift apart. No Spark import:
`rethink-mn export` writes with these schemas and must not pay for loading pyspark. `date` is the
Hive partition column: it lives in the directory name (`date=YYYY-MM-DD`), not inside the Parquet
files, so the Arrow *file* schemas leave it out.
"""

from __future__ import annotations

from typing import Final, Literal

import pyarrow as pa

ColumnKind = Literal["string", "int32", "int64"]

PARTITION_COLUMN: Final = "date"

MESSAGES_COLUMNS: Final[tuple[tuple[str, ColumnKind], ...]] = (
    ("event_id", "string"),
    ("room_id", "string"),
    ("event_type", "string"),
    ("sender", "string"),
    ("runtime", "string"),
    ("origin_server_ts", "int64"),
    ("ts", "int64"),
    ("carrier", "string"),
    ("messages_in_event", "int32"),
    ("index_in_event", "int32"),
    ("kind", "string"),
    ("msg_id", "string"),
    ("type", "string"),
    ("from", "string"),
    ("to", "string"),
    ("to_count", "int32"),
    ("from_scheme", "string"),
    ("from_domain", "string"),
    ("to_scheme", "string"),
    ("to_domain", "string"),
    ("body_size", "int32"),
    ("response_code", "int32"),
    ("service", "string"),
    ("addresses", "int32"),
    ("identity", "string"),
)

RECEIPTS_COLUMNS: Final[tuple[tuple[str, ColumnKind], ...]] = (
    ("event_id", "string"),
    ("index_in_event", "int32"),
    ("delivered", "int32"),
    ("ts", "int64"),
)

# Values the export writes into the enumerated columns.
EVENT_TYPE_BATCH: Final = "eu.rethink-project.mn.batch"
EVENT_TYPE_JOURNAL: Final = "eu.rethink-project.mn.journal"
CARRIERS: Final = ("inline", "media")
KIND_ROUTED: Final = "routed"
KIND_SERVICE_REQUEST: Final = "service_request"
KIND_SERVICE_RESPONSE: Final = "service_response"
KIND_REJECTED_REQUEST: Final = "rejected_request"
KIND_REJECTED_RESPONSE: Final = "rejected_response"
KINDS: Final = (
    KIND_ROUTED,
    KIND_SERVICE_REQUEST,
    KIND_SERVICE_RESPONSE,
    KIND_REJECTED_REQUEST,
    KIND_REJECTED_RESPONSE,
)
SERVICES: Final = ("allocation", "subscription", "registry", "global-registry", "idm", "other")

_ARROW_TYPES: Final[dict[ColumnKind, pa.DataType]] = {
    "string": pa.string(),
    "int32": pa.int32(),
    "int64": pa.int64(),
}


def _arrow_file_schema(columns: tuple[tuple[str, ColumnKind], ...]) -> pa.Schema:
    return pa.schema([pa.field(name, _ARROW_TYPES[kind], nullable=True) for name, kind in columns])


MESSAGES_ARROW_SCHEMA: Final[pa.Schema] = _arrow_file_schema(MESSAGES_COLUMNS)
"""Arrow schema of one `messages` Parquet file (without the partition column)."""

RECEIPTS_ARROW_SCHEMA: Final[pa.Schema] = _arrow_file_schema(RECEIPTS_COLUMNS)
"""Arrow schema of one `receipts` Parquet file (without the partition column)."""

DATASETS: Final[dict[str, pa.Schema]] = {
    "messages": MESSAGES_ARROW_SCHEMA,
    "receipts": RECEIPTS_ARROW_SCHEMA,
}

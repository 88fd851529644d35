"""The analytics job's aggregates in DuckDB SQL, on the same export files (for the benchmark).

Same definitions as adapter/analytics/aggregates.py (see its module doc), written the plain way
DuckDB does well: exact string keys, ordinary joins. Each aggregate is written as Parquet like the
Spark job's, so the benchmark can check both engines agree row for row.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import duckdb

from adapter.analytics.names import CATEGORY_LIMIT, CODE_RANGE, OTHER

MINUTE: Final = "(ts - ((ts % 60000 + 60000) % 60000))"


def _folded(column: str, source: str) -> str:
    """`column`, or OTHER when not among the CATEGORY_LIMIT most frequent values in `source`."""
    return f"""CASE WHEN {column} IS NULL OR {column} IN (
        SELECT {column} FROM {source} WHERE {column} IS NOT NULL GROUP BY ALL
        ORDER BY count(*) DESC, {column} ASC LIMIT {CATEGORY_LIMIT}
    ) THEN {column} ELSE '{OTHER}' END"""


_VIEWS: Final = """
CREATE OR REPLACE VIEW messages AS
    SELECT * FROM read_parquet('{export}/messages/*/*.parquet', hive_partitioning = true);
CREATE OR REPLACE VIEW receipts AS
    SELECT * FROM read_parquet('{export}/receipts/*/*.parquet', hive_partitioning = true);
"""

# Intermediate tables computed once, as the Spark job computes its rollups once.
_TEMP_TABLES: Final = {
    "traffic": f"""
        SELECT ts, {_folded("type", "messages")} AS type, kind,
               CASE WHEN response_code BETWEEN {CODE_RANGE[0]} AND {CODE_RANGE[1]}
                    THEN response_code END AS response_code
        FROM messages
    """,
    "fanout": """
        WITH once AS (
            SELECT event_id, index_in_event, max(delivered) AS delivered, min(ts) AS delivered_ts
            FROM receipts GROUP BY ALL
        )
        SELECT m.type, m."to", once.delivered, m.from_domain, m.to_domain,
               m.ts - m.ts % 60000 AS minute, once.delivered_ts - m.ts AS latency_ms
        FROM messages m LEFT JOIN once USING (event_id, index_in_event)
        WHERE m.kind = 'routed' AND m.event_id IS NOT NULL AND m.index_in_event IS NOT NULL
    """,
    "latency_pairs": """
        WITH calls AS (
            SELECT msg_id,
                   CASE WHEN type = 'response' THEN "to" ELSE "from" END AS requester,
                   CASE WHEN type = 'response' THEN "from" ELSE "to" END AS responder,
                   ts, type = 'response' AS is_response,
                   CASE WHEN type <> 'response' THEN type END AS type
            FROM messages
            WHERE kind = 'routed' AND msg_id IS NOT NULL AND "from" IS NOT NULL
              AND "to" IS NOT NULL AND ts IS NOT NULL AND type IS NOT NULL
        ), latest AS (
            SELECT *,
                   max(CASE WHEN NOT is_response THEN ts END) OVER so_far AS request_ts,
                   last_value(type IGNORE NULLS) OVER so_far AS request_type
            FROM calls
            WINDOW so_far AS (PARTITION BY msg_id, requester, responder ORDER BY ts, is_response
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
        )
        SELECT request_type, min(ts) - request_ts AS latency_ms
        FROM latest WHERE is_response AND request_ts IS NOT NULL
        GROUP BY msg_id, requester, responder, request_ts, request_type
    """,
    "operations": """
        WITH s AS (
            SELECT * FROM messages WHERE service IN ('allocation', 'subscription')
        ), req AS (
            SELECT event_id, runtime, ts, msg_id, "from" AS requester, "to" AS service_address,
                   service, type AS operation, addresses AS requested
            FROM s WHERE kind = 'service_request'
        ), ans AS (
            SELECT event_id, runtime, ts, msg_id, "to" AS requester, "from" AS service_address,
                   response_code, addresses AS answered, true AS has_answer
            FROM s WHERE kind = 'service_response'
        )
        SELECT req.*, ans.response_code, ans.answered, coalesce(ans.has_answer, false) AS answered_
        FROM req LEFT JOIN ans
            USING (event_id, runtime, ts, msg_id, requester, service_address)
    """,
}

_LATENCY_STATS: Final = """count(*) AS pairs,
    quantile_disc(latency_ms, 0.5) AS p50_ms, quantile_disc(latency_ms, 0.9) AS p90_ms,
    quantile_disc(latency_ms, 0.99) AS p99_ms, max(latency_ms) AS max_ms"""


def _aggregates(top_n: int) -> dict[str, str]:
    return {
        "messages_per_minute": f"""
            SELECT {MINUTE} AS minute, type, count(*) AS messages FROM traffic GROUP BY ALL""",
        "domain_traffic": f"""
            SELECT {_folded("from_domain", "messages")} AS from_domain,
                   {_folded("to_domain", "messages")} AS to_domain, count(*) AS messages,
                   coalesce(sum(body_size), 0)::BIGINT AS bytes
            FROM messages GROUP BY ALL""",
        "top_talkers": f"""
            WITH sent AS (
                SELECT * FROM messages
                WHERE kind IN ('routed', 'service_request', 'rejected_request')
            ), totals AS (
                SELECT 'runtime' AS talker, runtime AS address, count(*) AS messages,
                       coalesce(sum(body_size), 0)::BIGINT AS bytes
                FROM sent WHERE runtime IS NOT NULL GROUP BY ALL
                UNION ALL
                SELECT 'hyperty', "from", count(*), coalesce(sum(body_size), 0)::BIGINT
                FROM sent WHERE from_scheme = 'hyperty' AND "from" IS NOT NULL GROUP BY ALL
            ), ranked AS (
                SELECT *, row_number() OVER (PARTITION BY talker
                                             ORDER BY messages DESC, address ASC) AS rank
                FROM totals
            )
            SELECT talker, rank::INTEGER AS rank, address, messages, bytes
            FROM ranked WHERE rank <= {top_n}""",
        "response_codes": """
            SELECT response_code, count(*) AS responses
            FROM traffic WHERE type = 'response' GROUP BY ALL""",
        "error_rate_per_minute": f"""
            SELECT {MINUTE} AS minute, count(*) AS responses,
                   count(*) FILTER (WHERE response_code >= 400) AS errors,
                   count(*) FILTER (WHERE response_code >= 400) / count(*) AS error_rate
            FROM traffic WHERE type = 'response' AND response_code IS NOT NULL GROUP BY ALL""",
        "errors_per_minute": f"""
            SELECT {MINUTE} AS minute, response_code, count(*) AS responses
            FROM traffic WHERE type = 'response' AND response_code >= 400 GROUP BY ALL""",
        "delivery_latency": f"""
            SELECT false AS all_routes, from_domain, to_domain, {_LATENCY_STATS}
            FROM fanout WHERE latency_ms IS NOT NULL GROUP BY ALL
            UNION ALL
            SELECT true, NULL, NULL, {_LATENCY_STATS} FROM fanout WHERE latency_ms IS NOT NULL""",
        "delivery_latency_per_minute": f"""
            SELECT minute, {_LATENCY_STATS}
            FROM fanout WHERE latency_ms IS NOT NULL GROUP BY ALL""",
        "latency_overall": f"SELECT {_LATENCY_STATS} FROM latency_pairs",
        "latency_by_type": f"""
            SELECT {_folded("request_type", "latency_pairs")} AS request_type, {_LATENCY_STATS}
            FROM latency_pairs GROUP BY ALL""",
        "fanout_distribution": """
            SELECT delivered, count(*) AS messages FROM fanout GROUP BY ALL""",
        "fanout_by_address": """
            SELECT "to", count(*) AS updates, count(delivered) AS with_receipt,
                   coalesce(sum(delivered), 0)::BIGINT AS delivered_total,
                   max(delivered) AS delivered_max
            FROM fanout WHERE type = 'update' GROUP BY ALL""",
        "churn_per_minute": f"""
            WITH o AS (
                SELECT *, coalesce(answered, requested, 0) AS n,
                       coalesce(response_code BETWEEN 200 AND 299, false) AS ok
                FROM operations
                WHERE answered_ AND (
                    (service = 'allocation' AND operation IN ('create', 'delete'))
                    OR (service = 'subscription' AND operation IN ('subscribe', 'unsubscribe')))
            )
            SELECT {MINUTE} AS minute,
                   coalesce(sum(n) FILTER (WHERE ok AND operation = 'create'), 0)::BIGINT
                       AS allocated,
                   coalesce(sum(n) FILTER (WHERE ok AND operation = 'delete'), 0)::BIGINT
                       AS deleted,
                   coalesce(sum(n) FILTER (WHERE ok AND operation = 'subscribe'), 0)::BIGINT
                       AS subscribed,
                   coalesce(sum(n) FILTER (WHERE ok AND operation = 'unsubscribe'), 0)::BIGINT
                       AS unsubscribed,
                   count(*) FILTER (WHERE NOT ok) AS failed_operations
            FROM o GROUP BY ALL""",
        "batching": """
            WITH batches AS (
                SELECT event_type, carrier, messages_in_event, count(*) AS events
                FROM messages
                WHERE event_type = 'eu.rethink-project.mn.batch' AND index_in_event = 0
                GROUP BY ALL
            ), others AS (
                SELECT max(event_type) AS event_type, max(carrier) AS carrier,
                       max(messages_in_event) AS messages_in_event
                FROM messages
                WHERE (event_type IS DISTINCT FROM 'eu.rethink-project.mn.batch')
                  AND event_id IS NOT NULL
                GROUP BY event_id
            )
            SELECT event_type, carrier, messages_in_event, sum(events)::BIGINT AS events
            FROM (SELECT * FROM batches UNION ALL
                  SELECT event_type, carrier, messages_in_event, count(*) FROM others GROUP BY ALL)
            GROUP BY ALL""",
        "totals": """
            SELECT count(*) AS rows, min(ts) AS ts_min, max(ts) AS ts_max,
                   count(*) FILTER (WHERE type IS NULL) AS rows_type_null,
                   count(*) FILTER (WHERE msg_id IS NULL) AS rows_msg_id_null,
                   count(*) FILTER (WHERE "from" IS NULL) AS rows_from_null,
                   (SELECT count(*) FROM receipts) AS receipt_rows
            FROM messages""",
    }


def run_duckdb(
    export_dir: Path, output_dir: Path, top_n: int, threads: int | None = None
) -> dict[str, float]:
    """Compute and write every aggregate; return seconds per step (and `total`)."""
    started = time.perf_counter()
    output_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    with duckdb.connect() as con:
        if threads:
            con.execute(f"SET threads = {threads}")
        con.execute(_VIEWS.format(export=export_dir.as_posix()))
        for name, sql in _TEMP_TABLES.items():
            step = time.perf_counter()
            con.execute(f"CREATE TEMP TABLE {name} AS {sql}")
            timings[name] = round(time.perf_counter() - step, 3)
        for name, sql in _aggregates(top_n).items():
            step = time.perf_counter()
            target = output_dir / name
            target.mkdir(exist_ok=True)
            part = (target / "part-00000.parquet").as_posix()
            con.execute(f"COPY ({sql}) TO '{part}' (FORMAT parquet)")
            timings[name] = round(time.perf_counter() - step, 3)
    timings["total"] = round(time.perf_counter() - started, 3)
    return timings

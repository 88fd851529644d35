"""The live dashboard's Spark job: what one cycle's new rows add, as per-minute partials.

The batch job (job.py) reads a whole window every time, so its cycle grows with the traffic in
the window: an hour of a 1,000 msg/s crowd is 7M rows, minutes of Spark on the CPU a busy node
leaves over. Here each cycle reads only the rows exported since the last one and writes
*partials*: counts keyed by minute, which adapter/analytics/window.py sums over the window
without Spark. Latencies are kept as counts per exact millisecond, so the window's percentiles
are the batch job's nearest-rank ones, not estimates.

Pairs whose two halves arrive in different cycles (a message and its receipt, a request and its
answer) meet through *open* tables carried from cycle to cycle, as a streaming join keeps state:
- open_messages: routed messages with no receipt yet;
- open_receipts: receipts whose message has not been seen yet;
- open_requests: routed requests with no answer yet.
Open rows older than the window are dropped (their pair no longer counts), and so are requests
unanswered after REQUEST_HORIZON_MS: many messages (every `update` a hyperty publishes) are
never answered, and keeping each for the whole window would make every cycle carry an hour of
them. An answer later than that is not paired here (the batch job still pairs it): the live
view counts its request as unanswered.

Definitions are the batch job's (aggregates.py), with two differences that only duplicates
across cycles can show: a receipt written again in a later cycle than the first is not counted
(the first still is), and an answer in a later cycle pairs with the latest *unanswered* request
of its key. Categories are folded per cycle at PARTIAL_LIMIT (10x the window's limit) to bound
the partials, and so are talkers (a cycle keeps its PARTIAL_LIMIT heaviest senders); the window
folds again at CATEGORY_LIMIT, so the result equals the batch job's while no cycle sees more
than PARTIAL_LIMIT distinct values of one category or senders.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from adapter.analytics import aggregates as agg
from adapter.analytics.names import CATEGORY_LIMIT
from adapter.analytics.schema import KIND_ROUTED

PARTIAL_LIMIT: Final = 10 * CATEGORY_LIMIT
REQUEST_HORIZON_MS: Final = 120_000

# Partials: each cycle writes one file of each; every table has a `minute` column.
TRAFFIC: Final = "traffic"
TALKERS: Final = "talkers"
RECEIPT_ROWS: Final = "receipt_rows"
DELIVERIES: Final = "deliveries"
FANOUT: Final = "fanout"
REQUESTS: Final = "requests"
CHURN: Final = "churn"
BATCHING: Final = "batching"
PARTIALS: Final = (TRAFFIC, TALKERS, RECEIPT_ROWS, DELIVERIES, FANOUT, REQUESTS, CHURN, BATCHING)

# Open tables: carried from one cycle to the next.
OPEN_MESSAGES: Final = "open_messages"
OPEN_RECEIPTS: Final = "open_receipts"
OPEN_REQUESTS: Final = "open_requests"

_MESSAGE_KEY: Final = ("event_id", "index_in_event")

OPEN_SCHEMAS: Final = {
    OPEN_MESSAGES: StructType(
        [
            StructField("event_id", StringType()),
            StructField("index_in_event", IntegerType()),
            StructField("messages", LongType()),
            StructField("sent_ts", LongType()),
            StructField("from_domain", StringType()),
            StructField("to_domain", StringType()),
        ]
    ),
    OPEN_RECEIPTS: StructType(
        [
            StructField("event_id", StringType()),
            StructField("index_in_event", IntegerType()),
            StructField("delivered", IntegerType()),
            StructField("delivered_ts", LongType()),
        ]
    ),
    OPEN_REQUESTS: StructType(
        [
            StructField("key_hash", LongType()),
            StructField("key_hash2", IntegerType()),
            StructField("ts", LongType()),
            StructField("is_response", BooleanType()),
            StructField("type", StringType()),
        ]
    ),
}


def _minute(column: str) -> Column:
    return agg.minute_of(F.col(column)).alias("minute")


def _count(name: str) -> Column:
    return F.count(F.lit(1)).alias(name)


def _deliveries(
    messages: DataFrame, receipts: DataFrame, opened: dict[str, DataFrame], since_ms: int
) -> dict[str, DataFrame]:
    """Routed messages meet their receipts (new ones and those left open): closed pairs become
    deliveries and fan-out counts; the rest stays open.

    As in the batch job, one aggregation over the union of both sides, not a join: one shuffle,
    no sort (a full outer join took twice as long on a crowd's 30 s).
    """
    no_long, no_int, no_text = F.lit(None).cast("long"), F.lit(None).cast("int"), F.lit(None)
    sent = messages.where(
        (F.col("kind") == KIND_ROUTED)
        & F.col("event_id").isNotNull()
        & F.col("index_in_event").isNotNull()
    ).select(
        *_MESSAGE_KEY,
        F.lit(1).cast("long").alias("messages"),
        F.col("ts").alias("sent_ts"),
        "from_domain",
        "to_domain",
        no_int.alias("delivered"),
        no_long.alias("delivered_ts"),
    )
    waiting = opened[OPEN_MESSAGES].select(
        "*", no_int.alias("delivered"), no_long.alias("delivered_ts")
    )
    # A receipt without a key can match nothing (it is still counted in receipt_rows).
    keyed = receipts.where(F.col("event_id").isNotNull() & F.col("index_in_event").isNotNull())
    read = keyed.select(*_MESSAGE_KEY, "delivered", F.col("ts").alias("delivered_ts")).unionByName(
        opened[OPEN_RECEIPTS]
    )
    read = read.select(
        *_MESSAGE_KEY,
        no_long.alias("messages"),
        no_long.alias("sent_ts"),
        no_text.cast("string").alias("from_domain"),
        no_text.cast("string").alias("to_domain"),
        "delivered",
        "delivered_ts",
    )
    met = (
        sent.unionByName(waiting)
        .unionByName(read)
        .groupBy(*_MESSAGE_KEY)
        .agg(
            F.sum("messages").alias("messages"),
            F.min("sent_ts").alias("sent_ts"),
            F.max("from_domain").alias("from_domain"),
            F.max("to_domain").alias("to_domain"),
            F.max("delivered").alias("delivered"),
            F.min("delivered_ts").alias("delivered_ts"),
        )
        .persist()
    )
    closed = met.where(F.col("messages").isNotNull() & F.col("delivered_ts").isNotNull())
    timed = closed.where(F.col("sent_ts").isNotNull())
    return {
        DELIVERIES: timed.groupBy(
            _minute("sent_ts"),
            "from_domain",
            "to_domain",
            (F.col("delivered_ts") - F.col("sent_ts")).alias("latency_ms"),
        ).agg(_count("pairs")),
        FANOUT: closed.groupBy(_minute("sent_ts"), "delivered").agg(
            F.sum("messages").alias("messages")
        ),
        OPEN_MESSAGES: met.where(
            F.col("delivered_ts").isNull() & (F.col("sent_ts") >= since_ms)
        ).select(*OPEN_SCHEMAS[OPEN_MESSAGES].fieldNames()),
        # A receipt is kept open only while its message may still come.
        OPEN_RECEIPTS: met.where(
            F.col("messages").isNull() & (F.col("delivered_ts") >= since_ms)
        ).select(*OPEN_SCHEMAS[OPEN_RECEIPTS].fieldNames()),
    }


def _requests(
    messages: DataFrame, opened: dict[str, DataFrame], since_ms: int, newest_ms: int
) -> dict[str, DataFrame]:
    """New routed calls and the requests left open meet as in the batch job; answered requests
    become latency counts by request type, the unanswered stay open."""
    calls = agg.routed_calls(messages).unionByName(opened[OPEN_REQUESTS])
    calls = calls.where(F.col("ts") >= since_ms).persist()
    answered = agg.first_answers(calls).persist()
    key = list(agg.CALL_KEY)
    pending = calls.where(~F.col("is_response")).join(
        answered.select(*key, F.col("request_ts").alias("ts")), on=[*key, "ts"], how="left_anti"
    )
    pairs = answered.select(
        _minute("request_ts"),
        "request_type",
        (F.col("response_ts") - F.col("request_ts")).alias("latency_ms"),
    )
    return {
        REQUESTS: agg.fold_rare(pairs, "request_type", F.lit(1), PARTIAL_LIMIT)
        .groupBy("minute", "request_type", "latency_ms")
        .agg(_count("pairs")),
        OPEN_REQUESTS: pending.where(F.col("ts") >= newest_ms - REQUEST_HORIZON_MS).select(
            *OPEN_SCHEMAS[OPEN_REQUESTS].fieldNames()
        ),
    }


def increment(
    messages: DataFrame,
    receipts: DataFrame,
    opened: dict[str, DataFrame],
    since_ms: int,
    newest_ms: int,
) -> dict[str, DataFrame]:
    """Every partial of the new rows, and the open tables for the next cycle.

    `opened` holds the open tables the last cycle left (OPEN_SCHEMAS); `since_ms` is where the
    window starts: open rows before it are dropped. `newest_ms` is the newest `ts` read: the
    request horizon counts from it.
    """
    talkers = agg.talker_rollup(messages, _minute("ts"))
    for column in ("from_domain", "to_domain"):
        talkers = agg.fold_rare(talkers, column, F.col("rows"), PARTIAL_LIMIT)
    # Only the cycle's heaviest senders are kept by address (a top-talker list needs no more),
    # or a crowd of runtimes could fill the window with addresses. Their messages still count
    # in domain traffic.
    for column in ("sender_runtime", "sender_hyperty"):
        talkers = agg.fold_rare(talkers, column, F.col("rows"), PARTIAL_LIMIT, rest=None)
    return {
        TRAFFIC: agg.traffic_rollup(messages, PARTIAL_LIMIT),
        TALKERS: talkers.groupBy(
            "minute", "from_domain", "to_domain", "sender_runtime", "sender_hyperty"
        ).agg(*(F.sum(c).alias(c) for c in ("rows", "bytes", "from_null", "msg_id_null"))),
        RECEIPT_ROWS: receipts.groupBy(_minute("ts")).agg(_count("rows")),
        CHURN: agg.churn_rollup(messages),
        BATCHING: agg.batching_by_minute(messages),
        **_deliveries(messages, receipts, opened, since_ms),
        **_requests(messages, opened, since_ms, newest_ms),
    }

"""The aggregates of the export, as pure DataFrame transformations (no I/O, no Python UDFs).

No UDFs on purpose: the job then needs nothing but Spark on a cluster's executors.

Every aggregate below is one output directory of the job; the column lists are the contract the
dashboard and the DuckDB benchmark follow. Times are epoch milliseconds (UTC); `minute` is the
start of the minute of the message's `ts`.

Definitions the export schema leaves open, decided here:

* Categories a runtime chooses (message types, domains it names) are capped: the
  CATEGORY_LIMIT most frequent values (ties by value) are kept and the rest counted as OTHER,
  so that one runtime sending many distinct values cannot make the aggregates, and the node
  that reads them for its dashboard, grow without bound. Response codes outside 100-599 are no
  HTTP-style code and count as no code (null).
* messages_per_minute: every row (routed and journal), by `type` (null kept as its own group).
* domain_traffic: every row, `from_domain` x `to_domain`; bytes = sum of `body_size`.
* top_talkers: messages *sent by* runtimes: rows of kind routed, service_request and
  rejected_request (the node's own answers are not the runtime talking). Runtimes by `runtime`,
  hyperties by `from` where `from_scheme` = `hyperty`. Ranked by messages, ties by address.
* response_codes / error_rate_per_minute: rows of type `response`. The error rate is
  errors (code >= 400) over responses *that carry a code*; responses without an integer code are
  counted in response_codes (code null) but cannot be classified, so they are not in the rate.
* latency: routed rows only. Journal entries hold a request and its answer with one shared `ts`,
  so their latency is 0 by construction and would only dilute the figures. A response pairs with
  the latest request at or before it with the same msg_id and swapped from/to; a request answered
  more than once keeps its first answer. So duplicate ids (a re-send, ids reused by the same
  pair later, identical ids between different pairs) never create extra pairs. Percentiles are
  nearest-rank (the value at 1-based rank ceil(p * n)), exact, in ms.
* delivery latency: routed rows with a receipt, from the row's `ts` to the receipt's `ts`; a
  receipt written twice counts its first. By route (from_domain, to_domain, and all routes) and
  by the minute the message was sent. Same percentiles as above.
* errors_per_minute: responses with a code >= 400, by minute and code.
* fanout: routed rows left-joined to receipts on (event_id, index_in_event) - never on `date`,
  which for receipts is the delivery date. A receipt written twice counts once (max delivered);
  a routed message with no receipt has delivered null.
* churn_per_minute: an MN-service operation is a service_request row of service allocation
  (type create/delete) or subscription (type subscribe/unsubscribe) paired with the
  service_response of the same journal entry: same event_id, runtime, ts and msg_id, with
  from/to swapped. It counts when the response code is 2xx, for
  coalesce(response.addresses, request.addresses, 0) addresses (the response knows how many a
  `delete` by allocation key removed; for a delete by address list only the request does).
  Answered operations with another code, or none, count as failed_operations; unanswered
  requests are reported in the summary only. Other request types of these services are ignored.
* batching: one count per event, by event_type, carrier and messages_in_event: an outbox
  batch by its row with index_in_event 0 (a batch always holds messages 0..n-1), a journal event
  by distinct event_id (max of its rows' fields).
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from adapter.analytics.names import CATEGORY_LIMIT, CODE_RANGE, OTHER
from adapter.analytics.schema import (
    EVENT_TYPE_BATCH,
    KIND_REJECTED_REQUEST,
    KIND_ROUTED,
    KIND_SERVICE_REQUEST,
    KIND_SERVICE_RESPONSE,
    KINDS,
)

MINUTE_MS: Final = 60_000
SENDER_KINDS: Final = (KIND_ROUTED, KIND_SERVICE_REQUEST, KIND_REJECTED_REQUEST)
# Kinds whose `from` and `to` the node admitted. A refused message's runtime is the session that
# sent it (the node knows it), but its addresses are whatever the sender wrote: counting them
# would let a runtime put another's hyperty at the top of the talkers, or made-up domains among
# the peers, with messages the node refused.
ADMITTED_KINDS: Final = (KIND_ROUTED, KIND_SERVICE_REQUEST)
REFUSED_DOMAIN: Final = "(refused)"
PERCENTILES: Final = (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))
CHURN_OPERATIONS: Final = {
    ("allocation", "create"): "allocated",
    ("allocation", "delete"): "deleted",
    ("subscription", "subscribe"): "subscribed",
    ("subscription", "unsubscribe"): "unsubscribed",
}


def minute_of(ts: Column) -> Column:
    return ts - F.pmod(ts, F.lit(MINUTE_MS))


def _count() -> Column:
    return F.count(F.lit(1))


def fold_rare(
    frame: DataFrame,
    column: str,
    weight: Column,
    limit: int = CATEGORY_LIMIT,
    rest: str | None = OTHER,
) -> DataFrame:
    """`frame` with `column` kept for its `limit` heaviest values (by the sum of `weight`, ties
    by value) and `rest` in place of any other non-null value."""
    kept = (
        frame.where(F.col(column).isNotNull())
        .groupBy(F.col(column).alias("_kept"))
        .agg(F.sum(weight).alias("_weight"))
        .orderBy(F.desc("_weight"), F.asc("_kept"))
        .limit(limit)
        .select("_kept")
    )
    return (
        frame.join(F.broadcast(kept), F.col(column) == F.col("_kept"), "left")
        .withColumn(
            column,
            F.when(F.col(column).isNull() | F.col("_kept").isNotNull(), F.col(column)).otherwise(
                F.lit(rest).cast(frame.schema[column].dataType)
            ),
        )
        .drop("_kept")
    )


def _http_code(code: Column) -> Column:
    low, high = CODE_RANGE
    return F.when(code.between(low, high), code).cast("int")


def traffic_rollup(messages: DataFrame, limit: int = CATEGORY_LIMIT) -> DataFrame:
    """minute, type, kind, response_code -> rows, ts_min, ts_max.

    Small (minutes x types x kinds x codes, each bounded) and read once from the input; messages
    per minute, response codes, error rates and the summary's totals are all sums over it.
    """
    keys = ("minute", "type", "kind", "response_code")
    raw = messages.groupBy(
        minute_of(F.col("ts")).alias("minute"),
        "type",
        "kind",
        _http_code(F.col("response_code")).alias("response_code"),
    ).agg(_count().alias("rows"), F.min("ts").alias("ts_min"), F.max("ts").alias("ts_max"))
    return (
        fold_rare(raw, "type", F.col("rows"), limit)
        .groupBy(*keys)
        .agg(
            F.sum("rows").alias("rows"),
            F.min("ts_min").alias("ts_min"),
            F.max("ts_max").alias("ts_max"),
        )
    )


def _sum_long(column: str | Column) -> Column:
    return F.coalesce(F.sum(column), F.lit(0)).cast("long")


def messages_per_minute(traffic: DataFrame) -> DataFrame:
    """minute, type, messages."""
    return traffic.groupBy("minute", "type").agg(_sum_long("rows").alias("messages"))


def talker_rollup(messages: DataFrame, *by: Column) -> DataFrame:
    """from_domain, to_domain, sender_runtime, sender_hyperty (and `by`) -> rows, bytes, null
    counts.

    sender_runtime / sender_hyperty are null unless the row is a message the runtime (hyperty)
    sent, so one small table serves both the domain matrix and the talkers. It also counts rows
    missing `from` or `msg_id` for the summary, as this pass reads those columns anyway.
    """
    sent = F.col("kind").isin(*SENDER_KINDS)
    admitted = F.col("kind").isin(*ADMITTED_KINDS)
    refused = F.col("kind") == KIND_REJECTED_REQUEST
    return messages.groupBy(
        *by,
        F.when(refused, F.lit(REFUSED_DOMAIN)).otherwise(F.col("from_domain")).alias("from_domain"),
        F.when(refused, F.lit(REFUSED_DOMAIN)).otherwise(F.col("to_domain")).alias("to_domain"),
        F.when(sent, F.col("runtime")).alias("sender_runtime"),
        F.when(admitted & (F.col("from_scheme") == "hyperty"), F.col("from")).alias(
            "sender_hyperty"
        ),
    ).agg(
        _count().alias("rows"),
        _sum_long("body_size").alias("bytes"),
        F.count(F.when(F.col("from").isNull(), True)).alias("from_null"),
        F.count(F.when(F.col("msg_id").isNull(), True)).alias("msg_id_null"),
    )


def null_field_totals(talkers: DataFrame) -> DataFrame:
    """One row: rows_from_null, rows_msg_id_null."""
    return talkers.agg(
        _sum_long("from_null").alias("rows_from_null"),
        _sum_long("msg_id_null").alias("rows_msg_id_null"),
    )


def domain_traffic(talkers: DataFrame) -> DataFrame:
    """from_domain, to_domain, messages, bytes."""
    folded = fold_rare(fold_rare(talkers, "from_domain", F.col("rows")), "to_domain", F.col("rows"))
    return folded.groupBy("from_domain", "to_domain").agg(
        _sum_long("rows").alias("messages"), _sum_long("bytes").alias("bytes")
    )


def top_talkers(talkers: DataFrame, top_n: int) -> DataFrame:
    """talker (`runtime` | `hyperty`), rank, address, messages, bytes; `top_n` per talker."""
    per_talker = [
        talkers.where(F.col(column).isNotNull())
        .groupBy(F.col(column).alias("address"))
        .agg(_sum_long("rows").alias("messages"), _sum_long("bytes").alias("bytes"))
        .withColumn("talker", F.lit(talker))
        for talker, column in (("runtime", "sender_runtime"), ("hyperty", "sender_hyperty"))
    ]
    ranking = Window.partitionBy("talker").orderBy(F.desc("messages"), F.asc("address"))
    return (
        per_talker[0]
        .unionByName(per_talker[1])
        .withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= top_n)
        .select("talker", "rank", "address", "messages", "bytes")
    )


def _coded_responses(traffic: DataFrame) -> DataFrame:
    return traffic.where((F.col("type") == "response") & F.col("response_code").isNotNull())


def response_codes(traffic: DataFrame) -> DataFrame:
    """response_code (null: no integer code), responses."""
    return (
        traffic.where(F.col("type") == "response")
        .groupBy("response_code")
        .agg(_sum_long("rows").alias("responses"))
    )


def error_rate_per_minute(traffic: DataFrame) -> DataFrame:
    """minute, responses (with a code), errors (code >= 400), error_rate."""
    return (
        _coded_responses(traffic)
        .groupBy("minute")
        .agg(
            _sum_long("rows").alias("responses"),
            _sum_long(F.when(F.col("response_code") >= 400, F.col("rows"))).alias("errors"),
        )
        .withColumn("error_rate", F.col("errors") / F.col("responses"))
    )


CALL_KEY: Final = ("key_hash", "key_hash2")


def routed_calls(messages: DataFrame) -> DataFrame:
    """key_hash, key_hash2, ts, is_response, type (of a request): every routed request and
    response, keyed by (msg_id, requester, responder).

    The key travels as a 96-bit fingerprint (xxhash64 and murmur3 of the three strings):
    fixed-width rows shuffle and sort a third faster than the strings (measured on 10M rows), and
    two distinct keys share a fingerprint with probability about n^2 / 2^97 (< 1e-15 for 10M
    keys).
    """
    routed = messages.where(
        (F.col("kind") == KIND_ROUTED)
        & F.col("msg_id").isNotNull()
        & F.col("from").isNotNull()
        & F.col("to").isNotNull()
        & F.col("ts").isNotNull()
        & F.col("type").isNotNull()
    )
    is_response = F.col("type") == "response"
    requester = F.when(is_response, F.col("to")).otherwise(F.col("from"))
    responder = F.when(is_response, F.col("from")).otherwise(F.col("to"))
    return routed.select(
        F.xxhash64("msg_id", requester, responder).alias("key_hash"),
        F.hash("msg_id", requester, responder).alias("key_hash2"),
        "ts",
        is_response.alias("is_response"),
        F.when(~is_response, F.col("type")).alias("type"),
    )


def first_answers(calls: DataFrame) -> DataFrame:
    """key_hash, key_hash2, request_ts, request_type, response_ts: each answered request of
    `calls` (routed_calls' columns) with its first answer.

    Requests and responses of one key meet in one window ordered by time (a request before a
    response of the same ms), where "the latest request so far" is a running max: one shuffle
    and one sort.
    """
    key = list(CALL_KEY)
    so_far = (
        Window.partitionBy(*key)
        .orderBy("ts", "is_response")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    answers = calls.select(
        *key,
        "is_response",
        F.col("ts").alias("response_ts"),
        F.max(F.when(~F.col("is_response"), F.col("ts"))).over(so_far).alias("request_ts"),
        F.last("type", ignorenulls=True).over(so_far).alias("request_type"),
    ).where(F.col("is_response") & F.col("request_ts").isNotNull())
    # Grouped by a superset of the window's partition key: no second shuffle.
    return answers.groupBy(*key, "request_ts", "request_type").agg(
        F.min("response_ts").alias("response_ts")
    )


def latency_pairs(messages: DataFrame) -> DataFrame:
    """request_type, latency_ms: one row per answered routed request (rules in the module doc)."""
    return first_answers(routed_calls(messages)).select(
        "request_type", (F.col("response_ts") - F.col("request_ts")).alias("latency_ms")
    )


def _latency_stats() -> list[Column]:
    stats = [_count().alias("pairs")]
    stats += [
        F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY latency_ms)").cast("long").alias(name)
        for name, p in PERCENTILES
    ]
    stats.append(F.max("latency_ms").alias("max_ms"))
    return stats


def latency_overall(pairs: DataFrame) -> DataFrame:
    """pairs, p50_ms, p90_ms, p99_ms, max_ms (one row; nulls when there is no pair)."""
    return pairs.agg(*_latency_stats())


def latency_by_type(pairs: DataFrame) -> DataFrame:
    """request_type, pairs, p50_ms, p90_ms, p99_ms, max_ms."""
    folded = fold_rare(pairs, "request_type", F.lit(1))
    return folded.groupBy("request_type").agg(*_latency_stats())


def message_rollup(messages: DataFrame, receipts: DataFrame) -> DataFrame:
    """One row per routed message key (event_id, index_in_event) or receipt key:
    messages, receipt_rows, update_to_hash, delivered, sent_ts, delivered_ts, from_hash, to_hash.

    The join of routed messages to receipts, done as one aggregation over their union: one
    shuffle, no sort, and the receipts are deduplicated on the way (max delivered, first ts).
    Routed rows without a key cannot be joined and are left out. Strings travel as 64-bit
    hashes because a string in an aggregation buffer forces Spark into a sort-based aggregate
    (measured 2x slower); `update_addresses` and `domain_names` map them back.
    """
    key = ["event_id", "index_in_event"]
    routed = messages.where(
        (F.col("kind") == KIND_ROUTED)
        & F.col("event_id").isNotNull()
        & F.col("index_in_event").isNotNull()
    ).select(
        *key,
        F.lit(True).alias("is_message"),
        F.when(F.col("type") == "update", F.xxhash64("to")).alias("update_to_hash"),
        F.lit(None).cast("int").alias("delivered"),
        F.col("ts").alias("sent_ts"),
        F.lit(None).cast("long").alias("delivered_ts"),
        F.xxhash64("from_domain").alias("from_hash"),
        F.xxhash64("to_domain").alias("to_hash"),
    )
    # Receipts without a key stay in: they match nothing, but are counted as read.
    delivered = receipts.select(
        *key,
        F.lit(False).alias("is_message"),
        F.lit(None).cast("long").alias("update_to_hash"),
        "delivered",
        F.lit(None).cast("long").alias("sent_ts"),
        F.col("ts").alias("delivered_ts"),
        F.lit(None).cast("long").alias("from_hash"),
        F.lit(None).cast("long").alias("to_hash"),
    )
    return (
        routed.unionByName(delivered)
        # Keys are (nearly) unique, so a map-side partial aggregation would only cost time:
        # shuffle first, then aggregate once (measured 30 % faster on 10M rows).
        .repartition(*key)
        .groupBy(*key)
        .agg(
            F.count(F.when(F.col("is_message"), True)).alias("messages"),
            F.count(F.when(~F.col("is_message"), True)).alias("receipt_rows"),
            F.max("update_to_hash").alias("update_to_hash"),
            F.max("delivered").alias("delivered"),
            F.min("sent_ts").alias("sent_ts"),
            F.min("delivered_ts").alias("delivered_ts"),
            F.max("from_hash").alias("from_hash"),
            F.max("to_hash").alias("to_hash"),
        )
        .drop(*key)
    )


def fanout_rollup(per_message: DataFrame) -> DataFrame:
    """has_message, update_to_hash, delivered -> messages, receipt_rows."""
    return per_message.groupBy(
        (F.col("messages") > 0).alias("has_message"), "update_to_hash", "delivered"
    ).agg(_sum_long("messages").alias("messages"), _sum_long("receipt_rows").alias("receipt_rows"))


def delivery_times(per_message: DataFrame) -> DataFrame:
    """minute, from_hash, to_hash, latency_ms: routed messages with a receipt.

    Latency is from the message's `ts` (its event reached the homeserver) to its first receipt
    (the node handed it to the stubs), so a receipt written again later does not count.
    """
    return per_message.where(
        (F.col("messages") > 0) & F.col("delivered_ts").isNotNull() & F.col("sent_ts").isNotNull()
    ).select(
        minute_of(F.col("sent_ts")).alias("minute"),
        "from_hash",
        "to_hash",
        (F.col("delivered_ts") - F.col("sent_ts")).alias("latency_ms"),
    )


def domain_names(talkers: DataFrame) -> DataFrame:
    """domain_hash, domain: every from/to domain (null included) by its 64-bit hash."""
    both = talkers.select(F.col("from_domain").alias("domain")).unionByName(
        talkers.select(F.col("to_domain").alias("domain"))
    )
    return both.distinct().select(F.xxhash64("domain").alias("domain_hash"), "domain")


def delivery_latency_by_route(times: DataFrame, domains: DataFrame) -> DataFrame:
    """all_routes, from_domain, to_domain, pairs, p50_ms, p90_ms, p99_ms, max_ms.

    One row per (from_domain, to_domain), and one with all_routes true over every message.
    """
    per_route = times.groupBy("from_hash", "to_hash").agg(*_latency_stats())
    overall = times.agg(*_latency_stats()).select(
        F.lit(None).cast("long").alias("from_hash"), F.lit(None).cast("long").alias("to_hash"), "*"
    )
    named = F.broadcast(domains)
    return (
        per_route.join(
            named.withColumnRenamed("domain_hash", "from_hash").withColumnRenamed(
                "domain", "from_domain"
            ),
            on="from_hash",
            how="left",
        )
        .join(
            named.withColumnRenamed("domain_hash", "to_hash").withColumnRenamed(
                "domain", "to_domain"
            ),
            on="to_hash",
            how="left",
        )
        .select(
            F.lit(False).alias("all_routes"),
            "from_domain",
            "to_domain",
            "pairs",
            *(name for name, _ in PERCENTILES),
            "max_ms",
        )
        .unionByName(
            overall.where(F.col("pairs") > 0).select(
                F.lit(True).alias("all_routes"),
                F.lit(None).cast("string").alias("from_domain"),
                F.lit(None).cast("string").alias("to_domain"),
                "pairs",
                *(name for name, _ in PERCENTILES),
                "max_ms",
            )
        )
    )


def delivery_latency_per_minute(times: DataFrame) -> DataFrame:
    """minute, pairs, p50_ms, p90_ms, p99_ms, max_ms: by the minute the message was sent."""
    return times.groupBy("minute").agg(*_latency_stats())


def errors_per_minute(traffic: DataFrame) -> DataFrame:
    """minute, response_code, responses: responses with a code >= 400."""
    return (
        _coded_responses(traffic)
        .where(F.col("response_code") >= 400)
        .groupBy("minute", "response_code")
        .agg(_sum_long("rows").alias("responses"))
    )


def update_addresses(messages: DataFrame) -> DataFrame:
    """update_to_hash, to, addresses_with_hash: the distinct `to` of routed updates.

    addresses_with_hash > 1 would be a 64-bit hash collision between two addresses.
    """
    updates = messages.where((F.col("kind") == KIND_ROUTED) & (F.col("type") == "update"))
    return (
        updates.groupBy(F.xxhash64("to").alias("update_to_hash"), "to")
        .agg(_count().alias("updates"))
        .withColumn(
            "addresses_with_hash", F.count(F.lit(1)).over(Window.partitionBy("update_to_hash"))
        )
        .select("update_to_hash", "to", "addresses_with_hash")
    )


def fanout_distribution(fanout: DataFrame) -> DataFrame:
    """delivered (null: no receipt), messages."""
    return (
        fanout.where(F.col("has_message"))
        .groupBy("delivered")
        .agg(_sum_long("messages").alias("messages"))
    )


def fanout_by_address(fanout: DataFrame, addresses: DataFrame) -> DataFrame:
    """to, updates, with_receipt, delivered_total, delivered_max - routed `update` messages."""
    per_hash = (
        fanout.where(F.col("has_message") & F.col("update_to_hash").isNotNull())
        .groupBy("update_to_hash")
        .agg(
            _sum_long("messages").alias("updates"),
            _sum_long(F.when(F.col("delivered").isNotNull(), F.col("messages"))).alias(
                "with_receipt"
            ),
            _sum_long(F.col("messages") * F.col("delivered")).alias("delivered_total"),
            F.max("delivered").alias("delivered_max"),
        )
    )
    return per_hash.join(F.broadcast(addresses), on="update_to_hash").select(
        "to", "updates", "with_receipt", "delivered_total", "delivered_max"
    )


def _operation_code() -> Column:
    """1..4 for the churn operations (CHURN_OPERATIONS order), 0 for any other request."""
    code: Column = F.lit(0)
    for number, (service, operation) in reversed(list(enumerate(CHURN_OPERATIONS, start=1))):
        this = (F.col("service") == service) & (F.col("type") == operation)
        code = F.when(this, F.lit(number)).otherwise(code)
    return code


def churn_rollup(messages: DataFrame) -> DataFrame:
    """minute, operation (code), has_answer, response_code -> operations, addresses.

    Pairs each allocation/subscription request with the answer of the same journal entry by
    grouping both on the entry's key (event_id, runtime, ts, msg_id, requester, service address):
    one scan and one small shuffle instead of a join of two scans.
    """
    services = messages.where(
        F.col("service").isin("allocation", "subscription")
        & F.col("kind").isin(KIND_SERVICE_REQUEST, KIND_SERVICE_RESPONSE)
    )
    is_request = F.col("kind") == KIND_SERVICE_REQUEST
    entries = services.select(
        "event_id",
        "runtime",
        "ts",
        "msg_id",
        F.when(is_request, F.col("from")).otherwise(F.col("to")).alias("requester"),
        F.when(is_request, F.col("to")).otherwise(F.col("from")).alias("service_address"),
        is_request.alias("is_request"),
        F.when(is_request, _operation_code()).alias("operation"),
        F.when(is_request, F.col("addresses")).alias("requested"),
        F.when(~is_request, F.col("addresses")).alias("answered"),
        F.when(~is_request, F.col("response_code")).alias("response_code"),
    )
    key = ["event_id", "runtime", "ts", "msg_id", "requester", "service_address"]
    operations = (
        entries.groupBy(*key)
        .agg(
            F.count(F.when(F.col("is_request"), True)).alias("requests"),
            F.count(F.when(~F.col("is_request"), True)).alias("answers"),
            F.max("operation").alias("operation"),
            F.max("requested").alias("requested"),
            F.max("answered").alias("answered"),
            F.max("response_code").alias("response_code"),
        )
        .where(F.col("requests") > 0)
    )
    return operations.groupBy(
        minute_of(F.col("ts")).alias("minute"),
        "operation",
        (F.col("answers") > 0).alias("has_answer"),
        "response_code",
    ).agg(
        _count().alias("operations"),
        _sum_long(F.coalesce(F.col("answered"), F.col("requested"), F.lit(0))).alias("addresses"),
    )


def service_operation_totals(churn: DataFrame) -> DataFrame:
    """One row: operations (allocation/subscription requests) and how many had no answer."""
    return churn.agg(
        _sum_long("operations").alias("operations"),
        _sum_long(F.when(~F.col("has_answer"), F.col("operations"))).alias("unanswered"),
    )


def churn_per_minute(churn: DataFrame) -> DataFrame:
    """minute, allocated, deleted, subscribed, unsubscribed, failed_operations."""
    code = F.col("response_code")
    ok = F.coalesce((code >= 200) & (code < 300), F.lit(False))
    sums: list[Column] = []
    for number, name in enumerate(CHURN_OPERATIONS.values(), start=1):
        this = F.col("operation") == number
        sums.append(_sum_long(F.when(this & ok, F.col("addresses"))).alias(name))
    sums.append(_sum_long(F.when(~ok, F.col("operations"))).alias("failed_operations"))
    return churn.where(F.col("has_answer") & (F.col("operation") > 0)).groupBy("minute").agg(*sums)


BATCHING_KEYS: Final = ("event_type", "carrier", "messages_in_event")


def batching_by_minute(messages: DataFrame) -> DataFrame:
    """minute, event_type, carrier, messages_in_event, events; an event's minute is its
    first row's.

    An outbox batch event is counted by its first message (index_in_event 0): every batch holds
    messages 0..n-1, so this needs no shuffle of millions of event ids. Journal events are counted
    by distinct event_id, because which positions their rows take is the exporter's business.
    """
    is_batch = F.col("event_type") == EVENT_TYPE_BATCH
    keys = ["minute", *BATCHING_KEYS]
    batches = (
        messages.where(is_batch & (F.col("index_in_event") == 0))
        .groupBy(minute_of(F.col("ts")).alias("minute"), *BATCHING_KEYS)
        .agg(_count().alias("events"))
    )
    others = (
        messages.where(~is_batch | F.col("event_type").isNull())
        .where(F.col("event_id").isNotNull())
        .groupBy("event_id")
        .agg(
            minute_of(F.min("ts")).alias("minute"),
            *(F.max(key).alias(key) for key in BATCHING_KEYS),
        )
        .groupBy(*keys)
        .agg(_count().alias("events"))
    )
    return batches.unionByName(others).groupBy(*keys).agg(_sum_long("events").alias("events"))


def batching(messages: DataFrame) -> DataFrame:
    """event_type, carrier, messages_in_event, events."""
    return (
        batching_by_minute(messages)
        .groupBy(*BATCHING_KEYS)
        .agg(_sum_long("events").alias("events"))
    )


def message_totals(traffic: DataFrame) -> DataFrame:
    """One row of totals for the summary: rows, time range, null fields, rows per kind."""
    rows = F.col("rows")

    def rows_where(condition: Column) -> Column:
        return _sum_long(F.when(condition, rows))

    routed = F.col("kind") == KIND_ROUTED
    totals: list[Column] = [
        _sum_long(rows).alias("rows"),
        F.min("ts_min").alias("ts_min"),
        F.max("ts_max").alias("ts_max"),
        rows_where(F.col("type").isNull()).alias("rows_type_null"),
        rows_where(F.col("minute").isNull()).alias("rows_ts_null"),
        rows_where(~F.col("kind").isin(*KINDS) | F.col("kind").isNull()).alias("rows_kind_other"),
    ]
    totals += [rows_where(F.col("kind") == kind).alias(f"rows_{kind}") for kind in KINDS]
    totals += [
        rows_where(routed & (F.col("type") != "response")).alias("routed_requests"),
        rows_where(routed & (F.col("type") == "response")).alias("routed_responses"),
    ]
    return traffic.agg(*totals)


def fanout_totals(fanout: DataFrame) -> DataFrame:
    """One row: receipt rows read, and how many match no routed message."""
    return fanout.agg(
        _sum_long("receipt_rows").alias("receipt_rows"),
        _sum_long(F.when(~F.col("has_message"), F.col("receipt_rows"))).alias(
            "receipt_rows_without_message"
        ),
    )

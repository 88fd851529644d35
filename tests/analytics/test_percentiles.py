"""The job's percentiles (Spark percentile_disc) are the generator's nearest rank, exactly."""

from __future__ import annotations

import numpy as np
from pyspark.sql import SparkSession

from adapter.analytics import aggregates as agg
from tests.support.synthetic.known_answers import nearest_rank


def test_spark_percentiles_are_nearest_rank_for_every_size(spark: SparkSession) -> None:
    rng = np.random.default_rng(1)
    samples = {n: rng.integers(0, 50 if n % 2 else 5_000, size=n) for n in range(1, 302, 3)}
    frame = spark.createDataFrame(
        [(n, int(v)) for n, values in samples.items() for v in values], "n int, latency_ms long"
    )
    result = frame.groupBy("n").agg(*agg._latency_stats()).orderBy("n").collect()
    for row in result:
        ordered = np.sort(samples[row["n"]])
        for name, p in agg.PERCENTILES:
            assert row[name] == nearest_rank(ordered, p), (row["n"], name)
        assert row["max_ms"] == ordered[-1]
        assert row["pairs"] == len(ordered)
    assert len(result) == len(samples)


def test_latency_pairing_rules(spark: SparkSession) -> None:
    """Hand-made cases for the rules in aggregates' module doc."""
    columns = "kind string, msg_id string, type string, from string, to string, ts long"
    a, b, c = "hyperty://x/a", "hyperty://x/b", "hyperty://x/c"
    rows = [
        # answered once: 10 ms
        ("routed", "1", "ping", a, b, 100),
        ("routed", "1", "response", b, a, 110),
        # same id between another pair: 7 ms, must not pair with the above
        ("routed", "1", "read", c, b, 200),
        ("routed", "1", "response", b, c, 207),
        # re-sent at 305 before the answer at 320: the answer pairs with the re-send (15 ms)
        ("routed", "2", "ping", a, b, 300),
        ("routed", "2", "ping", a, b, 305),
        ("routed", "2", "response", b, a, 320),
        # answered twice: the first answer counts (4 ms)
        ("routed", "3", "create", a, c, 400),
        ("routed", "3", "response", c, a, 404),
        ("routed", "3", "response", c, a, 450),
        # an answer before its request, an answer with from/to not swapped, a journal pair
        ("routed", "4", "ping", a, b, 500),
        ("routed", "4", "response", b, a, 499),
        ("routed", "5", "ping", a, b, 600),
        ("routed", "5", "response", a, b, 601),
        ("service_request", "6", "create", a, "domain://msg-node.x/sm", 700),
        ("service_response", "6", "response", "domain://msg-node.x/sm", a, 700),
        # same ms: a request before a response of the same ms
        ("routed", "7", "ping", c, a, 800),
        ("routed", "7", "response", a, c, 800),
    ]
    pairs = agg.latency_pairs(spark.createDataFrame(rows, columns))
    got = sorted((r["request_type"], r["latency_ms"]) for r in pairs.collect())
    assert got == sorted([("ping", 10), ("read", 7), ("ping", 15), ("create", 4), ("ping", 0)])

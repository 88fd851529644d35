"""Names of the job's outputs: one Parquet directory per aggregate, plus summary.json.

Kept apart from the Spark code so the dashboard needs only pyarrow to find them.
"""

from __future__ import annotations

from typing import Final

MESSAGES_PER_MINUTE: Final = "messages_per_minute"
DOMAIN_TRAFFIC: Final = "domain_traffic"
TOP_TALKERS: Final = "top_talkers"
RESPONSE_CODES: Final = "response_codes"
ERROR_RATE_PER_MINUTE: Final = "error_rate_per_minute"
LATENCY_OVERALL: Final = "latency_overall"
LATENCY_BY_TYPE: Final = "latency_by_type"
FANOUT_DISTRIBUTION: Final = "fanout_distribution"
FANOUT_BY_ADDRESS: Final = "fanout_by_address"
CHURN_PER_MINUTE: Final = "churn_per_minute"
BATCHING: Final = "batching"
DELIVERY_LATENCY: Final = "delivery_latency"
DELIVERY_LATENCY_PER_MINUTE: Final = "delivery_latency_per_minute"
ERRORS_PER_MINUTE: Final = "errors_per_minute"

AGGREGATE_NAMES: Final = (
    MESSAGES_PER_MINUTE,
    DOMAIN_TRAFFIC,
    TOP_TALKERS,
    RESPONSE_CODES,
    ERROR_RATE_PER_MINUTE,
    LATENCY_OVERALL,
    LATENCY_BY_TYPE,
    FANOUT_DISTRIBUTION,
    FANOUT_BY_ADDRESS,
    CHURN_PER_MINUTE,
    BATCHING,
    DELIVERY_LATENCY,
    DELIVERY_LATENCY_PER_MINUTE,
    ERRORS_PER_MINUTE,
)

SUMMARY_FILE: Final = "summary.json"

# Bounds every engine applies to what runtimes choose (adapter/analytics/aggregates.py's doc):
# the most frequent CATEGORY_LIMIT values of a category are kept, the rest count as OTHER, and
# a response code outside CODE_RANGE counts as no code.
CATEGORY_LIMIT: Final = 100
OTHER: Final = "(other)"
CODE_RANGE: Final = (100, 599)

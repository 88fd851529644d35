"""Prometheus metrics of the Matrix side, registered on the registry the node passes in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class AppserviceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.hs_requests = Histogram(
            "rethink_mn_homeserver_request_seconds",
            "Requests the node made to the homeserver, by endpoint and outcome.",
            ["endpoint", "status"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.hs_retries = Counter(
            "rethink_mn_homeserver_retries_total",
            "Homeserver requests retried after a 429, a 5xx or a connection failure.",
            ["endpoint", "reason"],
            registry=registry,
        )
        self.transactions = Counter(
            "rethink_mn_as_transactions_total",
            "Appservice transactions pushed by the homeserver, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.transaction_events = Counter(
            "rethink_mn_as_events_total",
            "Events received in appservice transactions, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.transaction_seconds = Histogram(
            "rethink_mn_as_transaction_seconds",
            "Time to process one appservice transaction.",
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
        )

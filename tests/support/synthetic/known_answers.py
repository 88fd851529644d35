"""Expected aggregates of a synthetic export, accumulated chunk by chunk with numpy.

This is deliberately a second, independent implementation of the definitions in
`adapter/analytics/aggregates.py`: it counts the generator's integer codes and uses the ground
truth the generator recorded (which request each response answers, what each service call
changed), so a Spark result that matches it is evidence, not a tautology.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from adapter.analytics import aggregates as agg
from adapter.analytics import names
from adapter.analytics.schema import (
    CARRIERS,
    EVENT_TYPE_BATCH,
    EVENT_TYPE_JOURNAL,
    KINDS,
)
from tests.support.synthetic.traffic import (
    K_REJECTED_REQUEST,
    K_ROUTED,
    K_SERVICE_REQUEST,
    NULL,
    OP_ALLOCATE,
    OP_DELETE,
    OP_SUBSCRIBE,
    OP_UNSUBSCRIBE,
    S_ALLOCATION,
    S_SUBSCRIPTION,
    Chunk,
)
from tests.support.synthetic.world import T_RESPONSE, T_UPDATE, TYPES, IntArray, World

MINUTE_MS: Final = 60_000
_EVENT_TYPES: Final = (EVENT_TYPE_BATCH, EVENT_TYPE_JOURNAL)
_CHURN_COLUMNS: Final = {
    OP_ALLOCATE: "allocated",
    OP_DELETE: "deleted",
    OP_SUBSCRIBE: "subscribed",
    OP_UNSUBSCRIBE: "unsubscribed",
}


@dataclass(frozen=True)
class KnownAnswers:
    aggregates: dict[str, pa.Table]
    """Expected content of each aggregate directory, by aggregate name (row order irrelevant)."""
    summary: dict[str, Any]
    """Expected totals (a subset of the job's summary.json, same keys)."""


def _counts(keys: IntArray, weights: IntArray | None = None) -> dict[int, int]:
    values, inverse = np.unique(keys, return_inverse=True)
    if weights is None:
        sums = np.bincount(inverse)
    else:
        sums = np.bincount(inverse, weights=weights.astype(np.float64))
    return {int(v): int(s) for v, s in zip(values, sums, strict=True)}


def nearest_rank(sorted_values: IntArray, p: float) -> int:
    """The value at 1-based rank ceil(p * n) of an ascending array."""
    rank = max(1, math.ceil(p * len(sorted_values)))
    return int(sorted_values[rank - 1])


_STAT_COLUMNS: Final = [
    ("pairs", pa.int64()),
    ("p50_ms", pa.int64()),
    ("p90_ms", pa.int64()),
    ("p99_ms", pa.int64()),
    ("max_ms", pa.int64()),
]


def _stats(selected: IntArray) -> dict[str, Any]:
    """pairs, nearest-rank percentiles and max of some latencies (None when there are none)."""
    ordered = np.sort(selected)
    if len(ordered) == 0:
        return {"pairs": 0, **dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "max_ms"))}
    return {
        "pairs": len(ordered),
        **{name: nearest_rank(ordered, p) for name, p in agg.PERCENTILES},
        "max_ms": int(ordered[-1]),
    }


def _optional(code: int, names: tuple[str, ...]) -> str | None:
    return None if code == NULL else names[code]


# The domain pair refused requests count in (adapter/analytics/aggregates.py REFUSED_DOMAIN).
REFUSED_DOMAIN = "(refused)"
REFUSED_KEY = -2


class KnownAnswerBuilder:
    def __init__(self, world: World, top_n: int) -> None:
        self.world = world
        self.top_n = top_n
        self.per_minute_type: Counter[int] = Counter()
        self.domain_messages: Counter[int] = Counter()
        self.domain_bytes: Counter[int] = Counter()
        self.runtime_messages = np.zeros(world.runtimes, dtype=np.int64)
        self.runtime_bytes = np.zeros(world.runtimes, dtype=np.int64)
        self.hyperty_messages = np.zeros(len(world.pool), dtype=np.int64)
        self.hyperty_bytes = np.zeros(len(world.pool), dtype=np.int64)
        self.codes: Counter[int] = Counter()
        self.minute_responses: Counter[int] = Counter()
        self.minute_errors: Counter[int] = Counter()
        self.latency_type: list[IntArray] = []
        self.latency_ms: list[IntArray] = []
        self.minute_error_codes: Counter[tuple[int, int]] = Counter()
        self.delivery_route: list[IntArray] = []
        self.delivery_minute: list[IntArray] = []
        self.delivery_ms: list[IntArray] = []
        self.delivered: Counter[int] = Counter()
        self.updates = np.zeros(len(world.pool), dtype=np.int64)
        self.updates_with_receipt = np.zeros(len(world.pool), dtype=np.int64)
        self.updates_delivered = np.zeros(len(world.pool), dtype=np.int64)
        self.updates_max = np.full(len(world.pool), NULL, dtype=np.int64)
        self.churn: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self.batches: Counter[tuple[int, int, int]] = Counter()
        self.totals: Counter[str] = Counter()
        self.ts_min: int | None = None
        self.ts_max: int | None = None

    def add(self, chunk: Chunk) -> None:
        r = chunk.rows
        world = self.world
        kind, mtype, frm, to = r["kind"], r["type"], r["from"], r["to"]
        body = np.maximum(r["body_size"], 0)
        minute_index = r["ts"] // MINUTE_MS
        self.per_minute_type.update(_counts(minute_index * 16 + (mtype + 1)))

        authorities = len(world.authorities) + 1
        from_auth = np.where(frm >= 0, world.pool_authority[frm], NULL) + 1
        to_auth = np.where(to >= 0, world.pool_authority[to], NULL) + 1
        domain_key = from_auth * authorities + to_auth
        # A refused request's addresses are whatever its runtime wrote: it counts in a domain
        # pair of its own, never for the domains it names.
        refused = kind == K_REJECTED_REQUEST
        self.domain_messages.update(_counts(np.where(refused, REFUSED_KEY, domain_key)))
        self.domain_bytes.update(_counts(np.where(refused, REFUSED_KEY, domain_key), body))

        sent = np.isin(kind, [K_ROUTED, K_SERVICE_REQUEST, K_REJECTED_REQUEST])
        by_runtime = sent & (r["runtime"] >= 0)
        self.runtime_messages += np.bincount(r["runtime"][by_runtime], minlength=world.runtimes)
        self.runtime_bytes += np.bincount(
            r["runtime"][by_runtime], weights=body[by_runtime], minlength=world.runtimes
        ).astype(np.int64)
        by_hyperty = np.isin(kind, [K_ROUTED, K_SERVICE_REQUEST]) & (frm >= 0)
        by_hyperty[by_hyperty] = world.pool_is_hyperty[frm[by_hyperty]]
        pool_size = len(world.pool)
        self.hyperty_messages += np.bincount(frm[by_hyperty], minlength=pool_size)
        self.hyperty_bytes += np.bincount(
            frm[by_hyperty], weights=body[by_hyperty], minlength=pool_size
        ).astype(np.int64)

        responses = mtype == T_RESPONSE
        self.codes.update(_counts(r["code"][responses]))
        coded = responses & (r["code"] >= 0)
        self.minute_responses.update(_counts(minute_index[coded]))
        self.minute_errors.update(_counts(minute_index[coded & (r["code"] >= 400)]))
        errors = coded & (r["code"] >= 400)
        self.minute_error_codes.update(
            zip(minute_index[errors].tolist(), r["code"][errors].tolist(), strict=True)
        )
        self._add_deliveries(chunk, domain_key, minute_index)

        self.latency_type.append(chunk.latency_type)
        self.latency_ms.append(chunk.latency_ms)

        routed = kind == K_ROUTED
        self.delivered.update(_counts(r["delivered"][routed]))
        updates = routed & (mtype == T_UPDATE)
        update_to, update_delivered = to[updates], r["delivered"][updates]
        self.updates += np.bincount(update_to, minlength=pool_size)
        with_receipt = update_delivered >= 0
        self.updates_with_receipt += np.bincount(update_to[with_receipt], minlength=pool_size)
        self.updates_delivered += np.bincount(
            update_to[with_receipt], weights=update_delivered[with_receipt], minlength=pool_size
        ).astype(np.int64)
        np.maximum.at(self.updates_max, update_to, update_delivered)

        for minute, op, ok, addresses in zip(
            *(chunk.churn[k].tolist() for k in ("minute", "op", "ok", "addresses")), strict=True
        ):
            row = self.churn[minute]
            row.update({name: 0 for name in (*_CHURN_COLUMNS.values(), "failed_operations")})
            if ok:
                row[_CHURN_COLUMNS[op]] += addresses
            else:
                row["failed_operations"] += 1

        _, first = np.unique(r["event"], return_index=True)
        self.batches.update(
            zip(
                r["event_type"][first].tolist(),
                r["carrier"][first].tolist(),
                r["n_in_event"][first].tolist(),
                strict=True,
            )
        )

        totals = self.totals
        totals["rows"] += len(kind)
        totals["receipt_rows"] += len(chunk.receipts["event"])
        totals["events"] += len(first)
        totals["rows_type_null"] += int((mtype == NULL).sum())
        totals["rows_msg_id_null"] += int((r["msg_id"] == NULL).sum())
        totals["rows_from_null"] += int((frm == NULL).sum())
        for code, name in enumerate(KINDS):
            totals[f"rows_{name}"] += int((kind == code).sum())
        totals["routed_requests"] += int((routed & (mtype >= 0) & ~responses).sum())
        totals["routed_responses"] += int((routed & responses).sum())
        services = np.isin(r["service"], [S_ALLOCATION, S_SUBSCRIPTION])
        totals["service_operations"] += int((services & (kind == K_SERVICE_REQUEST)).sum())
        if len(kind):
            low, high = int(r["ts"].min()), int(r["ts"].max())
            self.ts_min = low if self.ts_min is None else min(self.ts_min, low)
            self.ts_max = high if self.ts_max is None else max(self.ts_max, high)

    def _add_deliveries(self, chunk: Chunk, route: IntArray, minute_index: IntArray) -> None:
        """Routed rows with a receipt: first receipt ts minus the row's ts, by route and minute."""
        r, receipts = chunk.rows, chunk.receipts
        key_bits = 20  # index_in_event < 2**20, as the generator's own key
        receipt_key = (receipts["event"] << key_bits) + receipts["idx"]
        order = np.lexsort((receipts["ts"], receipt_key))
        keys, first = np.unique(receipt_key[order], return_index=True)
        first_ts = receipts["ts"][order][first]
        row_key = (r["event"] << key_bits) + r["idx"]
        slot = np.minimum(np.searchsorted(keys, row_key), len(keys) - 1)
        found = (r["kind"] == K_ROUTED) & (len(keys) > 0) & (keys[slot] == row_key)
        self.delivery_route.append(route[found])
        self.delivery_minute.append(minute_index[found])
        self.delivery_ms.append(first_ts[slot][found] - r["ts"][found])

    def _deliveries(self, authority: Any) -> tuple[pa.Table, pa.Table]:
        authorities = len(self.world.authorities) + 1
        routes = np.concatenate(self.delivery_route)
        minutes = np.concatenate(self.delivery_minute)
        values = np.concatenate(self.delivery_ms)
        by_route = [
            {
                "all_routes": False,
                "from_domain": authority(int(route) // authorities),
                "to_domain": authority(int(route) % authorities),
                **_stats(values[routes == route]),
            }
            for route in np.unique(routes)
        ]
        by_route.append(
            {"all_routes": True, "from_domain": None, "to_domain": None, **_stats(values)}
        )
        by_minute = [
            {"minute": int(m) * MINUTE_MS, **_stats(values[minutes == m])}
            for m in np.unique(minutes)
        ]
        return (
            _table(
                by_route,
                [
                    ("all_routes", pa.bool_()),
                    ("from_domain", pa.string()),
                    ("to_domain", pa.string()),
                    *_STAT_COLUMNS,
                ],
            ),
            _table(by_minute, [("minute", pa.int64()), *_STAT_COLUMNS]),
        )

    def _talkers(self) -> pa.Table:
        world = self.world
        rows: list[dict[str, Any]] = []
        candidates = {
            "runtime": [
                (world.runtime_urls[i], int(self.runtime_messages[i]), int(self.runtime_bytes[i]))
                for i in np.flatnonzero(self.runtime_messages)
            ],
            "hyperty": [
                (world.pool[i], int(self.hyperty_messages[i]), int(self.hyperty_bytes[i]))
                for i in np.flatnonzero(self.hyperty_messages)
            ],
        }
        for talker, entries in candidates.items():
            entries.sort(key=lambda e: (-e[1], e[0]))
            for rank, (address, messages, size) in enumerate(entries[: self.top_n], start=1):
                rows.append(
                    {
                        "talker": talker,
                        "rank": rank,
                        "address": address,
                        "messages": messages,
                        "bytes": size,
                    }
                )
        return _table(
            rows,
            [
                ("talker", pa.string()),
                ("rank", pa.int32()),
                ("address", pa.string()),
                ("messages", pa.int64()),
                ("bytes", pa.int64()),
            ],
        )

    def _latency(self) -> tuple[pa.Table, pa.Table]:
        types = np.concatenate(self.latency_type) if self.latency_type else np.zeros(0, np.int64)
        values = np.concatenate(self.latency_ms) if self.latency_ms else np.zeros(0, np.int64)

        overall = _table([_stats(values)], _STAT_COLUMNS)
        by_type = _table(
            [
                {"request_type": TYPES[int(t)], **_stats(values[types == t])}
                for t in np.unique(types)
            ],
            [("request_type", pa.string()), *_STAT_COLUMNS],
        )
        return overall, by_type

    def finish(self) -> KnownAnswers:
        world = self.world
        authorities = len(world.authorities) + 1

        def authority(code: int) -> str | None:
            return None if code == 0 else world.authorities[code - 1]

        tables: dict[str, pa.Table] = {}
        tables[names.MESSAGES_PER_MINUTE] = _table(
            [
                {
                    "minute": (key // 16) * MINUTE_MS,
                    "type": _optional(key % 16 - 1, TYPES),
                    "messages": n,
                }
                for key, n in self.per_minute_type.items()
            ],
            [("minute", pa.int64()), ("type", pa.string()), ("messages", pa.int64())],
        )
        tables[names.DOMAIN_TRAFFIC] = _table(
            [
                {
                    "from_domain": REFUSED_DOMAIN
                    if key == REFUSED_KEY
                    else authority(key // authorities),
                    "to_domain": REFUSED_DOMAIN
                    if key == REFUSED_KEY
                    else authority(key % authorities),
                    "messages": n,
                    "bytes": self.domain_bytes[key],
                }
                for key, n in self.domain_messages.items()
            ],
            [
                ("from_domain", pa.string()),
                ("to_domain", pa.string()),
                ("messages", pa.int64()),
                ("bytes", pa.int64()),
            ],
        )
        tables[names.TOP_TALKERS] = self._talkers()
        tables[names.RESPONSE_CODES] = _table(
            [
                {"response_code": None if code == NULL else code, "responses": n}
                for code, n in self.codes.items()
            ],
            [("response_code", pa.int32()), ("responses", pa.int64())],
        )
        tables[names.ERROR_RATE_PER_MINUTE] = _table(
            [
                {
                    "minute": minute * MINUTE_MS,
                    "responses": n,
                    "errors": self.minute_errors[minute],
                    "error_rate": self.minute_errors[minute] / n,
                }
                for minute, n in self.minute_responses.items()
            ],
            [
                ("minute", pa.int64()),
                ("responses", pa.int64()),
                ("errors", pa.int64()),
                ("error_rate", pa.float64()),
            ],
        )
        tables[names.ERRORS_PER_MINUTE] = _table(
            [
                {"minute": minute * MINUTE_MS, "response_code": code, "responses": n}
                for (minute, code), n in self.minute_error_codes.items()
            ],
            [("minute", pa.int64()), ("response_code", pa.int32()), ("responses", pa.int64())],
        )
        by_route, by_minute = self._deliveries(authority)
        tables[names.DELIVERY_LATENCY] = by_route
        tables[names.DELIVERY_LATENCY_PER_MINUTE] = by_minute
        overall, by_type = self._latency()
        tables[names.LATENCY_OVERALL] = overall
        tables[names.LATENCY_BY_TYPE] = by_type
        tables[names.FANOUT_DISTRIBUTION] = _table(
            [
                {"delivered": None if d == NULL else d, "messages": n}
                for d, n in self.delivered.items()
            ],
            [("delivered", pa.int32()), ("messages", pa.int64())],
        )
        tables[names.FANOUT_BY_ADDRESS] = _table(
            [
                {
                    "to": world.pool[i],
                    "updates": int(self.updates[i]),
                    "with_receipt": int(self.updates_with_receipt[i]),
                    "delivered_total": int(self.updates_delivered[i]),
                    "delivered_max": None
                    if self.updates_max[i] == NULL
                    else int(self.updates_max[i]),
                }
                for i in np.flatnonzero(self.updates)
            ],
            [
                ("to", pa.string()),
                ("updates", pa.int64()),
                ("with_receipt", pa.int64()),
                ("delivered_total", pa.int64()),
                ("delivered_max", pa.int32()),
            ],
        )
        churn_names = [*_CHURN_COLUMNS.values(), "failed_operations"]
        tables[names.CHURN_PER_MINUTE] = _table(
            [
                {"minute": minute, **{name: counts[name] for name in churn_names}}
                for minute, counts in self.churn.items()
            ],
            [("minute", pa.int64()), *((name, pa.int64()) for name in churn_names)],
        )
        tables[names.BATCHING] = _table(
            [
                {
                    "event_type": _EVENT_TYPES[event_type],
                    "carrier": CARRIERS[carrier],
                    "messages_in_event": size,
                    "events": n,
                }
                for (event_type, carrier, size), n in self.batches.items()
            ],
            [
                ("event_type", pa.string()),
                ("carrier", pa.string()),
                ("messages_in_event", pa.int32()),
                ("events", pa.int64()),
            ],
        )
        return KnownAnswers(aggregates=tables, summary=self._summary(tables))

    def _summary(self, tables: dict[str, pa.Table]) -> dict[str, Any]:
        t = self.totals
        responses = sum(self.codes.values())
        with_code = sum(n for code, n in self.codes.items() if code != NULL)
        errors = sum(n for code, n in self.codes.items() if code >= 400)
        return {
            "rows_read": {"messages": t["rows"], "receipts": t["receipt_rows"]},
            "events": t["events"],
            "time_range": {"ts_min": self.ts_min, "ts_max": self.ts_max},
            "messages": {
                "rows_type_null": t["rows_type_null"],
                "rows_msg_id_null": t["rows_msg_id_null"],
                "rows_from_null": t["rows_from_null"],
                **{f"rows_{kind}": t[f"rows_{kind}"] for kind in KINDS},
                "routed_requests": t["routed_requests"],
                "routed_responses": t["routed_responses"],
            },
            "responses": {
                "total": responses,
                "with_code": with_code,
                "errors": errors,
                "error_rate": errors / with_code if with_code else None,
            },
            "latency": {"pairs": tables[names.LATENCY_OVERALL].column("pairs")[0].as_py()},
            "delivery_latency": {
                key: tables[names.DELIVERY_LATENCY]
                .filter(pc.field("all_routes"))
                .column(key)[0]
                .as_py()
                for key in ("pairs", "p50_ms", "p99_ms")
            },
            "fanout": {
                "routed_messages": sum(self.delivered.values()),
                "without_receipt": self.delivered[NULL],
            },
            "service_operations": {
                "allocation_and_subscription_requests": t["service_operations"],
                "unanswered": 0,
            },
        }


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, pa.DataType]]) -> pa.Table:
    schema = pa.schema(columns)
    return pa.Table.from_pylist(rows, schema=schema)

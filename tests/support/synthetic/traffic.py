"""One chunk of synthetic node traffic, as integer code arrays, with its ground truth.

What a chunk holds (shares of rows, roughly): hyperty request/response pairs (46 %: ping, read,
create, execute, delete; answered after a log-normal latency, a few unanswered, re-sent or
answered twice, some 404/500/403 answers), reporter updates `<obj>` -> `<obj>/changes` (34 %,
receipts give each object's observer count as fan-out), MN-service journal entries (15 %:
allocations, subscriptions, registry, global registry, IdM), rejected messages (3 %: unknown
destination 404, oversize 413, policy 403, frames that are not JSON), requests to several
destinations (`to` as a list), orphan responses and rows that are not JSON objects.

Routed messages are batched into outbox events per runtime the way the node does: messages that
arrive close together (bursts) share an event, up to a cap; big events go through the media
repository. The ground truth (which request a response answers and after how long, how many
observers each update reached, what each service call allocated) is recorded as the traffic is
made, never recovered from the rows afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from tests.support.synthetic.world import (
    T_CREATE,
    T_DELETE,
    T_EXECUTE,
    T_PING,
    T_READ,
    T_RESPONSE,
    T_SUBSCRIBE,
    T_UNSUBSCRIBE,
    T_UPDATE,
    IntArray,
    World,
)

NULL: Final = -1
BoolArray = npt.NDArray[np.bool_]

EVENT_BATCH, EVENT_JOURNAL = 0, 1
CARRIER_INLINE, CARRIER_MEDIA = 0, 1
# Codes of schema.KINDS and schema.SERVICES, in their order.
K_ROUTED, K_SERVICE_REQUEST, K_SERVICE_RESPONSE, K_REJECTED_REQUEST, K_REJECTED_RESPONSE = range(5)
S_ALLOCATION, S_SUBSCRIPTION, S_REGISTRY, S_GLOBAL_REGISTRY, S_IDM, S_OTHER = range(6)
# Churn operations, as counted by the job.
OP_ALLOCATE, OP_DELETE, OP_SUBSCRIBE, OP_UNSUBSCRIBE = range(4)

ROW_FIELDS: Final = (
    "event",
    "event_type",
    "runtime",
    "ots",
    "ts",
    "carrier",
    "n_in_event",
    "idx",
    "kind",
    "msg_id",
    "id_style",
    "type",
    "from",
    "to",
    "to_count",
    "body_size",
    "code",
    "service",
    "addresses",
    "delivered",
)

BATCH_GAP_MS: Final = 25
BATCH_CAP: Final = 200
JOURNAL_CAP_ENTRIES: Final = 50
MEDIA_THRESHOLD_BYTES: Final = 60_000
ORPHAN_ID_BASE: Final = 10**12
"""Ids of responses nobody asked for start here, far above any sender's counter."""

_SIZE_RANGE: Final = {
    T_PING: (20, 120),
    T_READ: (40, 400),
    T_CREATE: (200, 3000),
    T_EXECUTE: (100, 1000),
    T_DELETE: (30, 200),
    T_RESPONSE: (20, 500),
    T_SUBSCRIBE: (60, 300),
    T_UNSUBSCRIBE: (60, 300),
}


@dataclass
class Chunk:
    rows: dict[str, IntArray]
    receipts: dict[str, IntArray]
    """event, idx, delivered, ts."""
    latency_type: IntArray
    latency_ms: IntArray
    churn: dict[str, IntArray]
    """minute (ms), op, ok (0/1), addresses: one entry per answered churn operation."""
    events: int


@dataclass
class _Part:
    """Columns of some rows; missing columns are null."""

    size: int
    cols: dict[str, IntArray] = field(default_factory=dict)

    def col(self, name: str) -> IntArray:
        return self.cols.get(name, np.full(self.size, NULL, dtype=np.int64))


def _concat(parts: list[_Part]) -> _Part:
    size = sum(p.size for p in parts)
    return _Part(size, {name: np.concatenate([p.col(name) for p in parts]) for name in ROW_FIELDS})


def _ints(values: npt.ArrayLike) -> IntArray:
    return np.asarray(values, dtype=np.int64)


def _body_sizes(rng: np.random.Generator, types: IntArray) -> IntArray:
    sizes = np.zeros(len(types), dtype=np.int64)
    for type_code, (low, high) in _SIZE_RANGE.items():
        mask = types == type_code
        sizes[mask] = rng.integers(low, high, size=int(mask.sum()))
    updates = types == T_UPDATE
    # Reporter payloads: mostly a few hundred bytes, with a long tail of big documents; a few
    # are too big for an event on their own (their batch goes through the media repository).
    sizes[updates] = np.clip(rng.lognormal(np.log(400), 1.0, int(updates.sum())), 20, 50_000)
    huge = updates & (rng.random(len(types)) < 0.003)
    sizes[huge] = rng.integers(65_000, 200_000, size=int(huge.sum()))
    return sizes


@dataclass(frozen=True)
class _Batches:
    item_event: IntArray
    item_index: IntArray
    event_size: IntArray
    event_ts: IntArray


def _batch(
    rng: np.random.Generator, group: IntArray, desired: IntArray, gap: int, cap: int
) -> _Batches:
    """Cut each group's (runtime's) time-ordered items into events like the node's batcher.

    A new event starts when the group changes, when the stream was idle for more than `gap`
    ms, or when the event is full. The event reaches the homeserver a little after its last
    item, and a room's events never go back in time.
    """
    n = len(group)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _Batches(empty, empty, empty, empty)
    order = np.lexsort((desired, group))
    g, t = group[order], desired[order]
    run_start = np.ones(n, dtype=np.bool_)
    run_start[1:] = (g[1:] != g[:-1]) | (t[1:] - t[:-1] > gap)
    run = np.cumsum(run_start) - 1
    position = np.arange(n) - np.flatnonzero(run_start)[run]
    starts_event = position % cap == 0
    event = np.cumsum(starts_event) - 1
    first = np.flatnonzero(starts_event)
    last = np.append(first[1:], n) - 1
    sizes = last - first + 1
    event_group = g[first]
    ts = t[last] + rng.integers(3, 40, size=len(first))
    offset = event_group << 42  # makes one cumulative max restart per group
    ts = np.maximum.accumulate(ts + offset) - offset
    item_event = np.empty(n, dtype=np.int64)
    item_index = np.empty(n, dtype=np.int64)
    item_event[order] = event
    item_index[order] = position % cap
    return _Batches(item_event, item_index, sizes.astype(np.int64), ts.astype(np.int64))


@dataclass(frozen=True)
class _Outbox:
    part: _Part
    batches: _Batches
    sent_at: IntArray
    """Per row: ts of the event that carried it."""
    requests: IntArray
    """Rows that are requests to one address."""
    list_requests: IntArray
    """Rows that are requests to a list of addresses."""
    first_destination: IntArray
    """Per row: first address of its list (meaningful for list_requests only)."""


@dataclass(frozen=True)
class _Answers:
    part: _Part
    batches: _Batches
    latency_type: IntArray
    latency_ms: IntArray


class ChunkMaker:
    """Makes consecutive chunks; keeps what must stay unique across them (ids, event numbers)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.next_id = np.zeros(len(world.pool), dtype=np.int64)
        self.next_event = 0
        self.next_orphan = ORPHAN_ID_BASE

    def _ids(self, senders: IntArray) -> IntArray:
        """Per-sender increasing message ids (ids collide *between* senders, as in reTHINK)."""
        ids = np.full(len(senders), NULL, dtype=np.int64)
        known = senders >= 0
        s = senders[known]
        order = np.argsort(s, kind="stable")
        sorted_s = s[order]
        starts = np.ones(len(s), dtype=np.bool_)
        starts[1:] = sorted_s[1:] != sorted_s[:-1]
        group_first = np.flatnonzero(starts)[np.cumsum(starts) - 1]
        rank = np.arange(len(s)) - group_first
        assigned = np.empty(len(s), dtype=np.int64)
        assigned[order] = self.next_id[sorted_s] + rank
        ids[known] = assigned
        np.add.at(self.next_id, s, 1)
        return ids

    def _senders(
        self, rng: np.random.Generator, n: int, t0: int, window: int
    ) -> tuple[IntArray, IntArray]:
        """(runtime, desired ms) of n messages: a third in bursts, the rest spread out."""
        world = self.world
        runtime = rng.choice(world.runtimes, size=n, p=world.runtime_weight).astype(np.int64)
        desired = t0 + rng.integers(0, window, size=n)
        in_burst = rng.random(n) < 0.35
        bursts = max(1, int(in_burst.sum()) // 40)
        burst_weight = 1.0 / np.arange(1, bursts + 1) ** 0.7
        which = rng.choice(bursts, size=int(in_burst.sum()), p=burst_weight / burst_weight.sum())
        burst_runtime = rng.choice(world.runtimes, size=bursts, p=world.runtime_weight)
        burst_ts = t0 + rng.integers(0, window, size=bursts)
        runtime[in_burst] = burst_runtime[which]
        desired[in_burst] = burst_ts[which] + rng.integers(0, 8, size=len(which))
        return runtime, desired.astype(np.int64)

    def _random_hyperty(self, rng: np.random.Generator, n: int) -> IntArray:
        flat = self.world.hyperty.ravel()
        return flat[rng.integers(0, len(flat), size=n)]

    def _own_hyperty(self, rng: np.random.Generator, runtime: IntArray) -> IntArray:
        per_runtime = self.world.hyperty.shape[1]
        return self.world.hyperty[runtime, rng.integers(0, per_runtime, size=len(runtime))]

    def make(self, rng: np.random.Generator, t0: int, window: int, target_rows: int) -> Chunk:
        # Each request yields ~1.98 rows (answers, re-sends, double answers), a list request ~1.7.
        outbox = self._outbox(
            rng,
            t0,
            window,
            requests=int(0.46 * target_rows / 1.978),
            updates=int(0.342 * target_rows),  # shares of rows add up to 1
            multi=int(0.015 * target_rows / 1.7),
            orphans=max(1, int(0.002 * target_rows)),
            garbage=max(1, int(0.001 * target_rows)),
        )
        answers = self._answers(rng, outbox)
        journal, churn = self._journal(
            rng, t0, window, int(0.15 * target_rows / 2), max(2, int(0.03 * target_rows / 2))
        )
        events_before = self.next_event
        for part, batches in ((outbox.part, outbox.batches), (answers.part, answers.batches)):
            self._place_in_events(part, batches)
        journal.cols["event"] += self.next_event
        self.next_event = int(journal.cols["event"].max(initial=self.next_event - 1)) + 1
        rows = _concat([outbox.part, answers.part, journal])
        receipts = _receipts(rng, _concat([outbox.part, answers.part]))
        # A routed message's receipt may be missing: the row then counts as delivered null.
        rows.cols["delivered"] = _delivered_with_receipt(rows, receipts)
        order = np.lexsort((rows.cols["idx"], rows.cols["event"]))
        return Chunk(
            rows={name: values[order] for name, values in rows.cols.items()},
            receipts=receipts,
            latency_type=answers.latency_type,
            latency_ms=answers.latency_ms,
            churn=churn,
            events=self.next_event - events_before,
        )

    def _place_in_events(self, part: _Part, batches: _Batches) -> None:
        """Give routed rows their outbox event's columns (numbered after earlier events)."""
        base = self.next_event
        self.next_event += len(batches.event_size)
        part.cols["event"] = base + batches.item_event
        part.cols["idx"] = batches.item_index
        part.cols["n_in_event"] = batches.event_size[batches.item_event]
        part.cols["ots"] = batches.event_ts[batches.item_event]
        part.cols["ts"] = part.cols["ots"]  # a routed message's time is its event's
        part.cols["event_type"] = np.full(part.size, EVENT_BATCH, dtype=np.int64)
        part.cols["carrier"] = _carrier(batches.item_event, part.cols["body_size"])

    def _outbox(
        self,
        rng: np.random.Generator,
        t0: int,
        window: int,
        *,
        requests: int,
        updates: int,
        multi: int,
        orphans: int,
        garbage: int,
    ) -> _Outbox:
        """What the runtimes send for routing, batched into their outbox events."""
        world = self.world
        category = np.repeat(np.arange(5), [requests, updates, multi, orphans, garbage])
        rng.shuffle(category)
        n = len(category)
        runtime, desired = self._senders(rng, n, t0, window)
        is_req, is_upd, is_multi = category == 0, category == 1, category == 2
        is_orphan, is_garbage = category == 3, category == 4

        sender_hyperty = self._own_hyperty(rng, runtime)
        obj_slot = rng.integers(0, world.obj.shape[1], size=n)
        frm = np.where(is_upd, world.obj[runtime, obj_slot], sender_hyperty)
        frm[is_garbage] = NULL
        to = self._random_hyperty(rng, n)
        clash = to == frm
        to[clash] = self._random_hyperty(rng, int(clash.sum()))  # rare; a second clash is fine
        to[is_upd] = world.changes[runtime[is_upd], obj_slot[is_upd]]
        multi_pick = rng.integers(0, len(world.multi), size=n)
        to[is_multi] = world.multi[multi_pick[is_multi]]
        to[is_garbage] = NULL
        to_count = np.where(is_multi, world.multi_count[multi_pick], 1)
        to_count[is_garbage] = NULL

        request_type = rng.choice(
            [T_PING, T_READ, T_CREATE, T_EXECUTE, T_DELETE], size=n, p=[0.5, 0.2, 0.12, 0.1, 0.08]
        )
        mtype = np.select(
            [is_req, is_upd, is_multi, is_orphan],
            [request_type, T_UPDATE, T_EXECUTE, T_RESPONSE],
            NULL,
        ).astype(np.int64)
        msg_id = self._ids(np.where(is_req | is_upd | is_multi, frm, NULL))
        msg_id[is_orphan] = self.next_orphan + np.arange(int(is_orphan.sum()))
        self.next_orphan += int(is_orphan.sum())
        body = _body_sizes(rng, mtype)
        body[is_garbage] = NULL
        subscribers = world.subscribers[runtime, obj_slot]
        delivered = np.select(
            [is_req, is_upd, is_multi, is_orphan],
            [
                (rng.random(n) > 0.03).astype(np.int64),
                np.maximum(subscribers + rng.integers(-1, 2, size=n), 0),
                to_count,
                np.ones(n, dtype=np.int64),
            ],
            0,
        ).astype(np.int64)
        part = _Part(
            n,
            {
                "runtime": runtime,
                "kind": np.full(n, K_ROUTED, dtype=np.int64),
                "msg_id": msg_id,
                "id_style": (frm % 5 == 0).astype(np.int64),
                "type": mtype,
                "from": frm,
                "to": to,
                "to_count": _ints(to_count),
                "body_size": body,
                "code": _ints(np.where(is_orphan, 200, NULL)),
                "delivered": delivered,
            },
        )
        batches = _batch(rng, runtime, desired, BATCH_GAP_MS, BATCH_CAP)
        return _Outbox(
            part=part,
            batches=batches,
            sent_at=batches.event_ts[batches.item_event],
            requests=np.flatnonzero(is_req),
            list_requests=np.flatnonzero(is_multi),
            first_destination=world.multi_first[multi_pick],
        )

    def _answers(self, rng: np.random.Generator, outbox: _Outbox) -> _Answers:
        """Responses (some late, some twice), re-sent requests, and the true latencies."""
        world, sent = self.world, outbox.part.cols
        sent_at = outbox.sent_at
        answered = outbox.requests[rng.random(len(outbox.requests)) > 0.03]
        latency = np.minimum(1 + rng.lognormal(np.log(35), 0.9, len(answered)), 20_000)
        latency = latency.astype(np.int64)
        roll = rng.random(len(answered))
        resent = roll < 0.005
        doubled = (roll >= 0.005) & (roll < 0.008)
        codes = rng.choice([200, 404, 500, 403], size=len(answered), p=[0.95, 0.025, 0.015, 0.01])
        answer_desired = sent_at[answered] + latency

        # A request to a list of addresses gets an answer from its first address: it never
        # pairs, since the answer's `from` is not the request's `to`.
        lists = outbox.list_requests
        lists_answered = lists[rng.random(len(lists)) < 0.7]

        resend_rows = answered[resent]
        resend_desired = sent_at[resend_rows] + rng.integers(
            1, 2 * latency[resent] + 2, size=int(resent.sum())
        )
        double_desired = answer_desired[doubled] + rng.integers(1, 500, size=int(doubled.sum()))

        def response(rows: IntArray, responder: IntArray, code: IntArray) -> _Part:
            return _Part(
                len(rows),
                {
                    "runtime": world.pool_runtime[responder],
                    "msg_id": sent["msg_id"][rows],
                    "id_style": sent["id_style"][rows],
                    "type": np.full(len(rows), T_RESPONSE, dtype=np.int64),
                    "from": responder,
                    "to": sent["from"][rows],
                    "to_count": np.ones(len(rows), dtype=np.int64),
                    "code": code,
                },
            )

        resend = _Part(len(resend_rows), {name: v[resend_rows] for name, v in sent.items()})
        part = _concat(
            [
                response(answered, sent["to"][answered], codes),
                response(answered[doubled], sent["to"][answered[doubled]], codes[doubled]),
                response(
                    lists_answered,
                    outbox.first_destination[lists_answered],
                    np.full(len(lists_answered), 200),
                ),
                resend,
            ]
        )
        part.cols["kind"] = np.full(part.size, K_ROUTED, dtype=np.int64)
        is_resend = np.zeros(part.size, dtype=np.bool_)
        is_resend[part.size - resend.size :] = True
        body = _body_sizes(rng, part.cols["type"])
        part.cols["body_size"] = np.where(is_resend, part.cols["body_size"], body)
        part.cols["delivered"] = np.ones(part.size, dtype=np.int64)
        desired = np.concatenate(
            [
                answer_desired,
                double_desired,
                sent_at[lists_answered] + rng.integers(5, 200, size=len(lists_answered)),
                resend_desired,
            ]
        ).astype(np.int64)
        batches = _batch(rng, part.cols["runtime"], desired, BATCH_GAP_MS, BATCH_CAP)
        at = batches.event_ts[batches.item_event]

        # Ground truth of the pairing rule: a response answers the latest request at or before
        # it; a request keeps its first answer.
        n_answers, n_doubles = len(answered), int(doubled.sum())
        answer_ts = at[:n_answers]
        first_answer = answer_ts.copy()
        first_answer[doubled] = np.minimum(
            answer_ts[doubled], at[n_answers : n_answers + n_doubles]
        )
        asked_at = sent_at[answered].copy()
        resend_ts = at[part.size - resend.size :]
        before_answer = resend_ts <= answer_ts[resent]
        asked_at[np.flatnonzero(resent)[before_answer]] = resend_ts[before_answer]
        return _Answers(
            part=part,
            batches=batches,
            latency_type=sent["type"][answered],
            latency_ms=first_answer - asked_at,
        )

    def _journal(
        self, rng: np.random.Generator, t0: int, window: int, n_service: int, n_rejected: int
    ) -> tuple[_Part, dict[str, IntArray]]:
        """MN-service and rejected entries of the journal, and what each operation changed."""
        world = self.world
        n = n_service + n_rejected
        # Service categories 0-7, rejected categories 8-11.
        service_category = rng.choice(
            8, size=n_service, p=[0.25, 0.12, 0.25, 0.12, 0.15, 0.05, 0.01, 0.05]
        )
        rejected_category = 8 + rng.choice(4, size=n_rejected, p=[0.7, 0.15, 0.1, 0.05])
        category = np.concatenate([service_category, rejected_category])
        rng.shuffle(category)
        runtime = rng.choice(world.runtimes, size=n, p=world.runtime_weight).astype(np.int64)
        entry_ts = (t0 + rng.integers(0, window, size=n)).astype(np.int64)
        domain = world.runtime_domain[runtime]
        alloc_create, alloc_delete, subscribe, unsubscribe = (category == c for c in range(4))
        registry, global_registry, idm, other = (category == c for c in range(4, 8))
        unknown, oversize, policy, garbage = (category == c for c in range(8, 12))
        allocation = alloc_create | alloc_delete
        subscription = subscribe | unsubscribe
        rejected = category >= 8

        requester = np.where(
            allocation, world.runtime_allocation_address[runtime], self._own_hyperty(rng, runtime)
        )
        requester[garbage] = NULL
        service_address = np.select(
            [
                allocation,
                subscription,
                registry,
                global_registry,
                idm,
                other,
                unknown,
                oversize | policy,
            ],
            [
                world.allocation_service[domain],
                world.subscription_manager[domain],
                world.registry[domain],
                np.full(n, world.global_registry),
                world.idm[domain],
                world.other_service[domain],
                world.unknown[rng.integers(0, len(world.unknown), size=n)],
                self._random_hyperty(rng, n),
            ],
            NULL,
        ).astype(np.int64)
        request_type = np.select(
            [alloc_create, alloc_delete, subscribe, unsubscribe, unknown, policy],
            [T_CREATE, T_DELETE, T_SUBSCRIBE, T_UNSUBSCRIBE, T_PING, T_CREATE],
            T_READ,
        ).astype(np.int64)
        request_type[registry & (rng.random(n) < 0.3)] = T_CREATE
        request_type[oversize | garbage] = NULL  # text cut at 4 kB / not JSON: no fields
        addresses = np.select(
            [alloc_create, alloc_delete, subscription],
            [
                np.where(rng.random(n) < 0.8, 1, rng.integers(2, 11, size=n)),
                rng.integers(1, 6, size=n),
                rng.integers(1, 4, size=n),
            ],
            NULL,
        ).astype(np.int64)
        ok = rng.random(n) < 0.95
        code = np.select(
            [
                allocation | subscription,
                registry,
                global_registry,
                idm,
                other | unknown,
                oversize,
                policy,
            ],
            [
                np.where(ok, 200, 400),
                rng.choice([200, 404, 504], size=n, p=[0.8, 0.15, 0.05]),
                rng.choice([200, 404], size=n, p=[0.7, 0.3]),
                np.full(n, 501),
                np.full(n, 404),
                np.full(n, 413),
                np.full(n, 403),
            ],
            NULL,
        ).astype(np.int64)
        ids = self._ids(requester)
        service = np.select(
            [allocation, subscription, registry, global_registry, idm],
            [S_ALLOCATION, S_SUBSCRIPTION, S_REGISTRY, S_GLOBAL_REGISTRY, S_IDM],
            S_OTHER,
        ).astype(np.int64)
        # Now and then only some of the resources could be subscribed: the answer says how many.
        subscribed = addresses - np.where(
            rng.random(n) < 0.1, rng.integers(0, np.maximum(addresses, 1)), 0
        )
        answer_addresses = np.select(
            [ok & alloc_create, ok & subscribe], [addresses, subscribed], NULL
        ).astype(np.int64)
        changed = np.where(answer_addresses >= 0, answer_addresses, addresses)
        request_body = _body_sizes(rng, request_type)
        request_body[oversize | garbage] = NULL
        answer_body = rng.integers(30, 120, size=n) + 45 * np.where(ok & alloc_create, addresses, 0)
        answer_body[garbage] = 0  # the cmd:error control frame has no reTHINK body

        request = _Part(
            n,
            {
                "kind": np.where(rejected, K_REJECTED_REQUEST, K_SERVICE_REQUEST),
                "msg_id": np.where(oversize | garbage, NULL, ids),
                "type": request_type,
                "from": np.where(oversize, NULL, requester),
                "to": np.where(oversize, NULL, service_address),
                "body_size": request_body,
                "addresses": addresses,
            },
        )
        answer = _Part(
            n,
            {
                "kind": np.where(rejected, K_REJECTED_RESPONSE, K_SERVICE_RESPONSE),
                "msg_id": np.where(garbage, NULL, ids),
                "type": np.where(garbage, NULL, T_RESPONSE),
                "from": service_address,
                "to": requester,
                "body_size": answer_body,
                "code": code,
                "addresses": answer_addresses,
            },
        )
        for part in (request, answer):
            part.cols["to_count"] = np.where(part.cols["to"] >= 0, 1, NULL)
            part.cols["id_style"] = np.zeros(n, dtype=np.int64)
            part.cols["runtime"] = runtime
            part.cols["ts"] = entry_ts
            part.cols["service"] = service

        churn_op = np.select(
            [alloc_create, alloc_delete, subscribe, unsubscribe],
            [OP_ALLOCATE, OP_DELETE, OP_SUBSCRIBE, OP_UNSUBSCRIBE],
            NULL,
        ).astype(np.int64)
        is_churn = churn_op >= 0
        churn = {
            "minute": entry_ts[is_churn] // 60_000 * 60_000,
            "op": churn_op[is_churn],
            "ok": ok[is_churn].astype(np.int64),
            "addresses": changed[is_churn],
        }
        return _journal_events(rng, request, answer, entry_ts), churn


def _journal_events(
    rng: np.random.Generator, request: _Part, answer: _Part, entry_ts: IntArray
) -> _Part:
    """Batch journal entries (a request row and its answer row each) into journal events."""
    n = request.size
    batches = _batch(rng, np.zeros(n, dtype=np.int64), entry_ts, BATCH_GAP_MS, JOURNAL_CAP_ENTRIES)
    for offset, part in enumerate((request, answer)):
        part.cols["event"] = batches.item_event
        part.cols["idx"] = 2 * batches.item_index + offset
        part.cols["n_in_event"] = 2 * batches.event_size[batches.item_event]
        part.cols["ots"] = batches.event_ts[batches.item_event]
        part.cols["event_type"] = np.full(n, EVENT_JOURNAL, dtype=np.int64)
    both = _concat([request, answer])
    both.cols["carrier"] = _carrier(
        np.concatenate([batches.item_event, batches.item_event]), both.cols["body_size"]
    )
    return both


def _carrier(item_event: IntArray, body_size: IntArray) -> IntArray:
    """Media when the event's messages would not fit in one PDU."""
    if len(item_event) == 0:
        return np.zeros(0, dtype=np.int64)
    # ~80 bytes of envelope per message besides its body.
    event_bytes = np.bincount(item_event, weights=np.maximum(body_size, 0) + 80)
    return np.where(event_bytes[item_event] > MEDIA_THRESHOLD_BYTES, CARRIER_MEDIA, CARRIER_INLINE)


def _receipts(rng: np.random.Generator, routed: _Part) -> dict[str, IntArray]:
    """Receipt rows of routed events; 1 % of events have none, 0.2 % of rows are written twice.

    The job keeps the larger count of a receipt written twice, which is the first one here.
    """
    events, first = np.unique(routed.cols["event"], return_index=True)
    has_receipt = rng.random(len(events)) > 0.01
    delivery_ts = routed.cols["ots"][first] + rng.integers(1, 30, size=len(events))
    slot = np.searchsorted(events, routed.cols["event"])
    keep = has_receipt[slot]
    receipts = {
        "event": routed.cols["event"][keep],
        "idx": routed.cols["idx"][keep],
        "delivered": routed.cols["delivered"][keep],
        "ts": delivery_ts[slot][keep],
    }
    again = rng.random(len(receipts["event"])) < 0.002
    repeated = {name: values[again] for name, values in receipts.items()}
    # A receipt written again, later, sometimes counts fewer connections (some went away).
    repeated["ts"] = repeated["ts"] + 1000
    repeated["delivered"] = np.maximum(
        repeated["delivered"] - rng.integers(0, 2, len(repeated["ts"])), 0
    )
    return {name: np.concatenate([receipts[name], repeated[name]]) for name in receipts}


def _delivered_with_receipt(rows: _Part, receipts: dict[str, IntArray]) -> IntArray:
    """Per row: delivered from its receipt, NULL when it has none (or is not routed)."""
    key_bits = 20  # index_in_event < 2**20
    row_key = (rows.cols["event"] << key_bits) + rows.cols["idx"]
    receipt_key = np.unique((receipts["event"] << key_bits) + receipts["idx"])
    found = np.isin(row_key, receipt_key) & (rows.cols["kind"] == K_ROUTED)
    return np.where(found, rows.cols["delivered"], NULL)

"""What runtimes make the node hold is bounded per client and in total (issue 41, "Every
resource bounded per client and in total"): subscriptions, registry entries and dedupe marks.
Each decision on its own: taken in one step with the check (requests racing across an await
cannot both pass), refused with 429 for the client and 503 for the node, counted, and given back
when what was held goes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry

from adapter.access import AccessMonitor
from adapter.bounds import Bound
from adapter.config import DomainRegistryConfig
from adapter.envelope import Message, parse
from adapter.observability import NodeMetrics
from adapter.routing.local_origins import LocalOrigins
from adapter.routing.marks import SenderMarks
from adapter.routing.settlement import Settlement
from adapter.routing_table import RoutingTable
from adapter.services.allocation import AllocationService
from adapter.services.base import Requester
from adapter.services.registry_builtin import BuiltinRegistry, build_builtin_registry
from adapter.services.registry_entries import RegistryEntries
from adapter.services.subscriptions import SubscriptionService
from adapter.storage.checkpoints import CheckpointStore
from adapter.storage.database import Database
from adapter.storage.models import Base
from adapter.storage.registry_models import RegistryEntry

CLIENT_OF = {1: "ip:10.0.0.1", 2: "ip:10.0.0.1", 3: "ip:10.0.0.2"}


class _Routes:
    async def subscribe(self, _session: int, _addresses: list[str]) -> None:
        await asyncio.sleep(0.001)  # a round trip: room for a race

    async def unsubscribe(self, _session: int, _addresses: list[str]) -> None:
        await asyncio.sleep(0)


def _message(kind: str, body: dict[str, object]) -> Message:
    return parse(
        orjson.dumps(
            {"id": 1, "type": kind, "from": "x://m", "to": "domain://msg-node.d/sm", "body": body}
        ).decode()
    )


def _subscription_service(
    per_client: int, total: int
) -> tuple[SubscriptionService, RoutingTable, list[tuple[str, str]]]:
    table = RoutingTable()
    for session_id in CLIENT_OF:
        table.add_runtime(session_id, f"runtime://d/{session_id}")
    refused: list[tuple[str, str]] = []
    bound = Bound("subscriptions", per_client, total, lambda r, s: refused.append((r, s)))
    service = SubscriptionService(
        table,
        AccessMonitor("d", table),
        _Routes(),  # type: ignore[arg-type]
        bound=bound,
        client_of=CLIENT_OF.__getitem__,
    )
    return service, table, refused


def _streams(*names: str) -> dict[str, object]:
    return {"resources": [f"comm://d/{name}/changes" for name in names]}


async def test_subscriptions_are_bounded_per_client_over_its_sessions_and_in_total() -> None:
    service, table, refused = _subscription_service(per_client=3, total=5)

    async def subscribe(session_id: int, *names: str) -> int:
        requester = Requester(session_id, f"runtime://d/{session_id}")
        return (await service.handle(_message("subscribe", _streams(*names)), requester)).code

    # Two sessions of one client racing: between them at most the client's three.
    codes = await asyncio.gather(subscribe(1, "a", "b"), subscribe(2, "c", "d"))
    assert sorted(codes) == [200, 429]
    assert refused == [("subscriptions", "client")]
    # What a session holds already costs nothing again.
    winner = 1 if table.subscriptions_of(1) else 2
    assert await subscribe(winner, "a", "b", "c", "d") == 429
    assert await subscribe(winner, *("ab" if winner == 1 else "cd")) == 200
    assert service.shares.bound.held("ip:10.0.0.1") == 2
    assert await subscribe(1, "e") == 200
    assert await subscribe(2, "f") == 429
    # Another client is not held to that client's share; the node's total holds for all.
    assert await subscribe(3, "g") == 200
    assert await subscribe(3, "h", "i") == 503
    assert refused[-1] == ("subscriptions", "total")
    # What is let go may be taken again: an unsubscribe, and a session's end.
    requester = Requester(1, "runtime://d/1")
    held = sorted(table.subscriptions_of(1))
    answer = await service.handle(_message("unsubscribe", {"resources": held[:1]}), requester)
    assert answer.code == 200
    assert await subscribe(2, "f") == 200
    table.remove_session(2)
    assert service.shares.bound.held("ip:10.0.0.1") == len(table.subscriptions_of(1))
    assert await subscribe(3, "h") == 200
    held_in_all = sum(table.holdings(s).subscriptions for s in CLIENT_OF)
    assert service.shares.bound.taken == held_in_all


async def test_subscriptions_read_back_at_a_start_count_under_their_client() -> None:
    service, table, _refused = _subscription_service(per_client=2, total=10)
    table.subscribe(1, ["comm://d/a/changes", "comm://d/b/changes"])
    service.restore()
    requester = Requester(2, "runtime://d/2")
    assert (await service.handle(_message("subscribe", _streams("c")), requester)).code == 429
    table.remove_session(1)
    assert (await service.handle(_message("subscribe", _streams("c")), requester)).code == 200


def test_addresses_read_back_at_a_start_count_under_their_client() -> None:
    table = RoutingTable()
    table.add_allocations(1, ["hyperty://d/a", "hyperty://d/b"], None)
    table.add_allocations(3, ["hyperty://d/c"], None)
    bound = Bound("addresses", 3, 10)
    service = AllocationService(
        "d",
        table,
        AccessMonitor("d", table),
        _Routes(),  # type: ignore[arg-type]
        bound=bound,
        client_of=CLIENT_OF.__getitem__,
    )
    table.on_allocations_removed = service.let_go
    service.restore()
    assert (bound.held("ip:10.0.0.1"), bound.held("ip:10.0.0.2"), bound.taken) == (2, 1, 3)
    # The client's second session may take one more; what the first held goes back with it.
    assert bound.refusal("ip:10.0.0.1", 2) is not None
    table.remove_session(1)
    assert (bound.held("ip:10.0.0.1"), bound.taken) == (0, 1)


async def test_local_sender_marks_are_bounded_per_client_and_in_total_and_go_with_their_sender(
    tmp_path: Path,
) -> None:
    """A client minting sender ids (a fresh stub instance at every connect, from many sessions)
    keeps at most its share of marks, the node its total, in memory and in ``sender_marks``;
    the marks of a sender that is gone leave both."""
    db = Database(f"sqlite:///{tmp_path / 'marks.sqlite'}")
    await db.run(lambda conn: Base.metadata.create_all(conn))
    try:
        store = CheckpointStore(db)
        sender_marks = SenderMarks()
        settlement = Settlement(store, NodeMetrics(CollectorRegistry()), sender_marks)
        marks = sender_marks.routed
        refused: list[tuple[str, str]] = []

        def client_of(origin: str) -> str:
            return "ip:flood" if origin.startswith("f") else "ip:honest"

        origins = LocalOrigins(
            client_of, settlement.let_go, 3, 5, lambda r, s: refused.append((r, s))
        )
        sender_marks.on_new_origin = origins.seen
        ledger = settlement.ledger("!lane")

        def delivered(*senders: str) -> None:
            ticket = ledger.open("$e" + senders[0])
            for origin in senders:
                sender_marks.route(origin, 1, ticket)
            ticket.seal()

        delivered("h1.stub", "h2.stub")
        delivered(*(f"f{i}.stub" for i in range(10)))
        await settlement.checkpoint()
        assert sorted(marks) == ["f7.stub", "f8.stub", "f9.stub", "h1.stub", "h2.stub"]
        assert sorted(await store.marks()) == sorted(marks)
        assert refused.count(("marks", "client")) == 7
        # The node's total: a third honest sender pushes out the oldest of all.
        delivered("h3.stub")
        assert "h1.stub" not in marks and refused[-1] == ("marks", "total")
        # The node's own numbering and a peer's senders are not counted here.
        delivered("mn.node", "peer:b.example/x")
        assert len(origins) == 5
        # A sender that is gone: its mark leaves memory and the table.
        origins.gone(["f9.stub"])
        await settlement.checkpoint()
        assert "f9.stub" not in marks and "f9.stub" not in await store.marks()
        assert origins.held("ip:flood") == 2
    finally:
        await db.dispose()


def _registration(url: str, runtime: str) -> Message:
    value: dict[str, object] = {
        "url": url,
        "runtime": runtime,
        "status": "live",
        "expires": 60,
        "resources": ["chat"],
        "dataSchemes": ["comm"],
    }
    if url.startswith("hyperty://"):
        value |= {"user": f"user://d/{runtime[-1]}", "descriptor": "hyperty-catalogue://c/h"}
    else:
        value |= {"name": "chat", "schema": "hyperty-catalogue://c/s", "reporter": "hyperty://d/r"}
    return parse(
        orjson.dumps(
            {
                "id": 1,
                "type": "create",
                "from": f"{runtime}/registry",
                "to": "domain://registry.d/",
                "body": {"value": value},
            }
        ).decode()
    )


async def test_registry_entries_are_bounded_per_client_and_in_total_and_counted_back() -> None:
    """A client registering from many runtimes holds at most its share of entries (429), the
    node its total (503), counted; registering an entry again costs nothing more; what the
    database no longer holds is given back at the next sweep, and what it held at a start is
    counted under the clients of the sessions that own it."""
    db = Database("sqlite:///:memory:")
    await db.run(lambda conn: RegistryEntry.__table__.create(conn))
    refused: list[tuple[str, str]] = []
    claims_of_sessions = {"claim-1": "ip:flood", "claim-2": "ip:flood", "claim-3": "ip:honest"}
    clients = dict(zip(CLIENT_OF, claims_of_sessions.values(), strict=True))
    try:

        def build() -> tuple[BuiltinRegistry, RegistryEntries]:
            entries = RegistryEntries(
                Bound("registry_entries", 3, 5, lambda r, s: refused.append((r, s))),
                lambda: claims_of_sessions,
            )
            registry = build_builtin_registry(
                DomainRegistryConfig(),
                db,
                None,
                entries=entries,
                client_of=clients.__getitem__,
            )
            assert registry is not None
            return registry, entries

        registry, entries = build()

        async def register(session_id: int, url: str) -> int:
            runtime = f"runtime://d/{session_id}"
            requester = Requester(session_id, runtime, claim=f"claim-{session_id}")
            reply = await registry.service.handle(_registration(url, runtime), requester)
            return reply.code

        codes = [await register(1 + i % 2, f"hyperty://d/f{i}") for i in range(4)]
        assert codes == [200, 200, 200, 429]
        assert await register(1, "hyperty://d/f0") == 200  # again: no new entry
        assert await register(3, "comm://d/h0") == 200
        # Another runtime's entry is refused by the registry: its place is given back.
        assert await register(3, "hyperty://d/f1") == 403
        assert entries.bound.taken == 4
        assert await register(3, "comm://d/h1") == 200
        assert await register(3, "comm://d/h2") == 503
        assert refused == [("registry_entries", "client"), ("registry_entries", "total")]

        # Gone from the database (the sweep removed it): given back at the next recount.
        await db.run(
            lambda conn: conn.execute(
                RegistryEntry.__table__.delete().where(RegistryEntry.url == "hyperty://d/f0")
            )
        )
        await registry.expiry.sweep_once()
        assert entries.bound.held("ip:flood") == 2
        assert await register(2, "hyperty://d/f9") == 200

        # A start: what the database holds counts under the owners' sessions' clients.
        registry, entries = build()
        await registry.expiry.recount()
        assert entries.bound.held("ip:flood") == 3 and entries.bound.taken == 5
        assert await register(1, "hyperty://d/f10") == 429
    finally:
        await db.dispose()

"""The composition root and the core build without a homeserver (issue 44): the core alone, and
with each feature attached, on SQLite in a temporary directory. A feature registers what it
adds through the core's hooks; the core alone starts and stops with nothing but its database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from adapter import carrier
from adapter.config import NodeConfig, parse_config
from adapter.core import Core
from adapter.node import Node
from adapter.routing.delivery import Delivery
from adapter.routing.lanes import Outgoing
from adapter.services.connectors import DomainRegistryConnector
from adapter.sessions.session import Session
from adapter.storage import migrate

A, B = "a.example", "b.example"


def _config(tmp_path: Path, **extra: Any) -> NodeConfig:
    raw: dict[str, Any] = {
        "domain": A,
        # Nothing listens there: the core must build (and start) without a homeserver.
        "homeserver": {"url": "http://127.0.0.1:9", "server_name": "hs.a.example"},
        "appservice": {
            "as_token": "a" * 20,
            "hs_token": "h" * 20,
            "listen": {"host": "127.0.0.1", "port": 0},
        },
        "stub": {"listen": {"host": "127.0.0.1", "port": 0}},
        "database": {"url": f"sqlite:///{tmp_path / 'node.sqlite'}"},
        "dashboard": {"enabled": False},
    }
    raw.update(extra)
    return parse_config(raw, "test", environ={})


async def _close(core: Core) -> None:
    """What a built but never started core holds: its connection pools and its database."""
    await core.http.close()
    await core.peer_http.close()
    await core.db.dispose()


def test_the_core_alone_builds_and_routes_inside_its_domain(tmp_path: Path) -> None:
    async def build() -> None:
        core = Core(_config(tmp_path, registry={"builtin": {"enabled": False}}))
        core.assemble()
        try:
            assert core.features == []
            assert core.lanes is not None and core.outboxes is core.lanes
            # No feature: no way abroad, no catch-up, and the registry is the relay.
            assert core.ingress._abroad is None and core.ingress._catch_up is None
            assert core.delivery._foreign is None and core.delivery._send_on is None
            assert isinstance(core.connectors[0], DomainRegistryConnector)
        finally:
            await _close(core)

    asyncio.run(build())


def test_the_built_in_registry_attaches_as_a_feature(tmp_path: Path) -> None:
    async def build() -> None:
        node = Node(_config(tmp_path))
        try:
            feature = node.builtin_registry
            assert feature is not None and feature.registry is not None
            assert node.core.features == [feature]
            assert node.core.connectors[0] is feature.registry.service
            assert node.core.hooks.claim_in_use is not None
            assert len(node.core.lifecycle.released) == 3  # table, policy, then presence
        finally:
            await _close(node.core)

    asyncio.run(build())


def test_the_bounds_of_issue_41_are_built_from_the_configuration(tmp_path: Path) -> None:
    """Subscriptions and local dedupe marks are the core's (delivery tells of each new
    origin); the built-in registry's entries are its feature's, counted by its service and
    read back by its sweep."""

    async def build() -> None:
        node = Node(
            _config(
                tmp_path,
                quotas={
                    "subscriptions_per_client": 7,
                    "subscriptions_total": 70,
                    "marks_per_client": 8,
                    "marks_total": 80,
                },
                registry={"builtin": {"entries_per_client": 9, "entries_total": 90}},
            )
        )
        core = node.core
        try:
            subscriptions = core.subscription_service.shares.bound
            assert (subscriptions.per_client, subscriptions.total) == (7, 70)
            marks = core.local_origins
            assert (marks.per_client, marks.total) == (8, 80)
            assert core.sender_marks.on_new_origin == marks.seen
            feature = node.builtin_registry
            assert feature is not None and feature.registry is not None
            entries = feature.registry.service._entries
            assert entries is not None and feature.registry.expiry._entries is entries
            assert (entries.bound.per_client, entries.bound.total) == (9, 90)
        finally:
            await _close(core)

    asyncio.run(build())


def test_federation_attaches_the_way_abroad_and_its_consumers(tmp_path: Path) -> None:
    async def build() -> None:
        node = Node(_config(tmp_path, federation={"peers": {B: {"server_name": "hs.b.example"}}}))
        core = node.core
        try:
            feature = node.federation_feature
            assert feature is not None and feature.links is not None
            assert node.federation is feature.links and node.peer_feeds is not None
            assert core.ingress._abroad is core.hooks.abroad is not None
            assert core.delivery._foreign is not None
            assert core.inbound._consumers.keys() >= {"m.room.member", carrier.BATCH_EVENT}
            # The runtime's subscriptions abroad end before the table forgets them.
            assert core.lifecycle.released[0] == feature._runtime_left
        finally:
            await _close(core)

    asyncio.run(build())


def test_the_dashboard_attaches_its_routes_and_tap(tmp_path: Path) -> None:
    async def build() -> None:
        node = Node(_config(tmp_path, dashboard={"enabled": True, "state_dir": str(tmp_path)}))
        try:
            assert node.ops is not None and node.ops.dashboard is not None
            assert node.dashboard_tap is not None
            assert len(node.core.hooks.transactions) == 1
            assert len(node.core.hooks.appservice_routes) == 2  # the dashboard, the registry
        finally:
            await _close(node.core)

    asyncio.run(build())


def test_the_cluster_attaches_its_catch_up_and_take_over(tmp_path: Path) -> None:
    """Several processes need PostgreSQL to run; to be built, SQLite's file is enough (the
    configuration's check of that is passed by with a copy)."""

    async def build() -> None:
        config = _config(tmp_path, federation={"peers": {B: {"server_name": "hs.b.example"}}})
        cluster = config.cluster.model_copy(update={"process": "p2", "federation_process": "p1"})
        node = Node(config.model_copy(update={"cluster": cluster}), on_struck=lambda: None)
        core = node.core
        try:
            assert node.cluster is not None and node.siblings is not None
            assert node.cluster.take_over is not None and node.cluster.shared_routes is not None
            assert core.ingress._catch_up == node.cluster.shared_routes.caught_up
            # Not the federation process: peers are reached through the lanes, no links here.
            assert node.federation is None and node.peer_feeds is None
            assert core.delivery._send_on is None and core.hooks.peer_links is None
            assert [type(f).__name__ for f in core.features] == [
                "RegistryFeature",
                "FederationFeature",
                "ClusterFeature",
            ]
        finally:
            await _close(core)

    asyncio.run(build())


class _Outbox:
    """Delivers at once (no lanes, so no homeserver)."""

    def __init__(self, delivery: Delivery) -> None:
        self._delivery = delivery

    def has_room_for(self, size: int) -> bool:
        return True

    async def wait_for_room(self, size: int, timeout: float) -> bool:
        return True

    def push(self, item: Outgoing) -> None:
        asyncio.get_running_loop().create_task(self._delivery.deliver([item.routed], None))


class _Outboxes:
    def __init__(self, delivery: Delivery) -> None:
        self._outbox = _Outbox(delivery)

    def for_node(self) -> _Outbox:
        return self._outbox

    def for_session(self, session: Session) -> _Outbox:
        return self._outbox


def test_the_core_starts_and_stops_without_a_homeserver(tmp_path: Path) -> None:
    async def run() -> None:
        config = _config(tmp_path, routing={"journal": False})
        await migrate.upgrade(config.database.url)
        node = Node(config, outboxes=_Outboxes)
        await node.start()
        try:
            assert node.core.running
            assert node.appservice_port and node.stub_port
            assert node.core.appservice_port != node.core.stub_port
        finally:
            await node.stop()
        assert not node.core.running

    asyncio.run(run())


class _Recorder:
    """A feature that notes each point of the start and the stop it is called at."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self._name, self._calls = name, calls

    def _note(self, point: str) -> None:
        self._calls.append(f"{self._name}:{point}")

    def attach(self, core: Core) -> None:
        hooks = core.hooks
        self._note("attach")

        async def before_load() -> None:
            self._note("before_load")

        async def sessions_loaded() -> None:
            self._note("sessions_loaded")

        async def lanes_started(_positions: dict[str, str]) -> None:
            self._note("lanes_started")

        async def stopping() -> None:
            self._note("stopping")

        hooks.before_load.append(before_load)
        hooks.marks_loaded.append(lambda _epoch, _marks: self._note("marks_loaded"))
        hooks.sessions_loaded.append(sessions_loaded)
        hooks.appservice_routes.append(lambda _app: self._note("appservice_routes"))
        hooks.lanes_started.append(lanes_started)
        hooks.stopping.append(stopping)
        hooks.assembled.append(lambda: self._note("assembled"))

    async def start(self) -> None:
        self._note("start")

    async def stop(self) -> None:
        self._note("stop")


def test_features_are_called_in_their_order_at_each_point(tmp_path: Path) -> None:
    async def run() -> None:
        config = _config(
            tmp_path, routing={"journal": False}, registry={"builtin": {"enabled": False}}
        )
        await migrate.upgrade(config.database.url)
        calls: list[str] = []
        core = Core(config, outboxes=_Outboxes)
        core.attach(_Recorder("first", calls))
        core.attach(_Recorder("second", calls))
        core.assemble()
        await core.start()
        await core.stop()
        points = [
            "before_load",
            "marks_loaded",
            "sessions_loaded",
            "appservice_routes",
            "lanes_started",
            "start",
            "stopping",
            "stop",
        ]
        assert calls == [
            "first:attach",
            "second:attach",
            "first:assembled",
            "second:assembled",
            *(f"{name}:{point}" for point in points for name in ("first", "second")),
        ]

    asyncio.run(run())

"""A built-in domain registry on a real database, a clock the test moves, and the status
notifications it made; messages shaped as the runtime's Registry.js and CoreDiscovery.js send."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest_asyncio

from adapter.config import DomainRegistryConfig
from adapter.envelope import Message, parse
from adapter.identity.model import Identity
from adapter.services.base import Requester, ServiceReply
from adapter.services.registry_builtin import BuiltinRegistry, build_builtin_registry
from adapter.storage.database import Database

D = "example.com"
REGISTRY = f"domain://registry.{D}/"
RT1 = f"runtime://{D}/1"
RT2 = f"runtime://{D}/2"
ALICE = "user://google.com/alice@gmail.com"
BOB = f"user://{D}/bob"
DESCRIPTOR = f"hyperty-catalogue://catalogue.{D}/.well-known/hyperty/Connector"
COMM_SCHEMA = f"hyperty-catalogue://catalogue.{D}/.well-known/dataschema/Communication"
LIFETIME, MAX_LIFETIME, GRACE = 600, 1000, 300
SWEEP_INTERVAL = 0.05
T0 = datetime(2026, 11, 24, 10, 0, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def claim_of(runtime: str) -> str:
    """One credential per runtime here: its claim, what its entries are owned by, named after
    it (what presence follows)."""
    return f"claim-of-{runtime}"


@dataclass
class Harness:
    built: BuiltinRegistry
    clock: Clock
    notes: list[tuple[str, str]] = field(default_factory=list)
    ids: int = 0

    def message(self, kind: str, body: dict[str, Any], runtime: str = RT1) -> Message:
        self.ids += 1
        frame = {
            "id": self.ids,
            "type": kind,
            "from": f"{runtime}/registry/",
            "to": REGISTRY,
            "body": body,
        }
        return parse(json.dumps(frame))

    async def send(
        self,
        kind: str,
        body: dict[str, Any],
        runtime: str = RT1,
        identity: Identity | None = None,
    ) -> ServiceReply:
        message = self.message(kind, body, runtime)
        requester = Requester(1, runtime, identity, claim=claim_of(runtime))
        reply = await self.built.service.handle(message, requester)
        if reply.then is not None:
            await reply.then()  # as the node does, once the answer is on its way
        return reply

    async def register_hyperty(
        self,
        url: str,
        user: str,
        *,
        runtime: str = RT1,
        resources: tuple[str, ...] = ("chat",),
        schemes: tuple[str, ...] = ("comm",),
        identity: Identity | None = None,
        **extra: Any,
    ) -> ServiceReply:
        # Registry.js registerHyperty: the runtime field names the registering runtime.
        value = {
            "user": user,
            "descriptor": DESCRIPTOR,
            "url": url,
            "expires": 120,
            "resources": list(resources),
            "dataSchemes": list(schemes),
            "runtime": runtime,
            "status": "live",
            **extra,
        }
        return await self.send("create", {"value": value, "policy": "policy"}, runtime, identity)

    async def register_object(
        self,
        url: str,
        name: str,
        reporter: str,
        *,
        runtime: str = RT1,
        resources: tuple[str, ...] = ("chat",),
        schemes: tuple[str, ...] = ("comm",),
    ) -> ServiceReply:
        value = {
            "name": name,
            "schema": COMM_SCHEMA,
            "url": url,
            "reporter": reporter,
            "expires": 120,
            "resources": list(resources),
            "dataSchemes": list(schemes),
            "runtime": runtime,
            "status": "live",
        }
        return await self.send("create", {"value": value, "policy": "policy"}, runtime)

    async def read(self, resource: str, **criteria: Any) -> ServiceReply:
        body: dict[str, Any] = {"resource": resource}
        if criteria:
            body["criteria"] = criteria
        return await self.send("read", body)

    def take_notes(self) -> list[tuple[str, str]]:
        notes, self.notes = self.notes, []
        return notes


def registry_config(rest_api: str = "read-only") -> DomainRegistryConfig:
    return DomainRegistryConfig.model_validate(
        {
            "builtin": {
                "lifetime_seconds": LIFETIME,
                "max_lifetime_seconds": MAX_LIFETIME,
                "disconnected_grace_seconds": GRACE,
                # Only runs once a test starts it.
                "sweep_interval_seconds": SWEEP_INTERVAL,
                "presence_delay_seconds": 0,
                "rest_api": rest_api,
            }
        }
    )


@pytest_asyncio.fixture(loop_scope="session")
async def registry(database_url: str) -> AsyncIterator[Harness]:
    db = Database(database_url)
    clock = Clock()
    harness: Harness

    async def on_status_change(url: str, status: str) -> None:
        harness.notes.append((url, status))

    built = build_builtin_registry(registry_config(), db, on_status_change, clock=clock)
    assert built is not None
    harness = Harness(built, clock)
    yield harness
    await built.stop()
    await db.dispose()

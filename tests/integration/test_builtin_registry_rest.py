"""The built-in registry's REST API over HTTP (dev-registry-domain's paths under /registry/), on
SQLite and PostgreSQL: the same data as through reTHINK messages, read-only unless configured
otherwise, and the relay pointed at it answering exactly as the built-in service does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from adapter.services.base import Requester, ServiceReply
from adapter.services.registry import DomainRegistryConnector
from adapter.services.registry_rest import RegistryRestApi

from .registry_support import ALICE, BOB, DESCRIPTOR, RT1, RT2, D, Harness, claim_of

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

H1, H2 = f"hyperty://{D}/h-1", f"hyperty://{D}/h-2"
CHAT = f"comm://{D}/chat-1"
# The read-write API sits under its own prefix so one server carries both modes.
RW = "/rw/registry"


def enc(text: str) -> str:
    return quote(text, safe="")


@pytest_asyncio.fixture(loop_scope="session")
async def http(registry: Harness) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    assert registry.built.rest_api is not None  # read-only by the harness's configuration
    registry.built.rest_api.add_routes(app)
    RegistryRestApi(registry.built.backend, writable=True, prefix=RW).add_routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client


async def _get(client: TestClient[Any, Any], path: str) -> tuple[int, Any]:
    async with client.get(path) as response:
        return response.status, await response.json()


async def test_the_rest_api_answers_the_same_data(
    registry: Harness, http: TestClient[Any, Any]
) -> None:
    await registry.register_hyperty(H1, ALICE, resources=("chat", "video"))
    await registry.register_hyperty(H2, ALICE, schemes=("comm", "connection"))
    await registry.register_object(CHAT, "chat room", H1)

    status, by_user = await _get(http, f"/registry/hyperty/user/{enc(ALICE)}")
    assert status == 200 and by_user == (await registry.read(ALICE)).value
    assert set(by_user) == {H1, H2} and by_user[H1]["descriptor"] == DESCRIPTOR

    status, filtered = await _get(
        http, f"/registry/hyperty/user/{enc(ALICE)}/hyperty?resources=chat&dataSchemes=connection"
    )
    assert status == 200 and set(filtered) == {H2}
    email = "/registry/hyperty/email/alice%40gmail.com"
    status, by_email = await _get(http, f"{email}/hyperty?resources=video,chat")
    assert status == 200 and set(by_email) == {H1}
    status, one = await _get(http, f"/registry/hyperty/url/{enc(H1)}")
    assert status == 200 and one == (await registry.read(H1)).value
    async with http.head(f"/registry/hyperty/url/{enc(H1)}") as response:
        assert response.status == 200

    # A name with a space travels as '+' (the reference decodes like Java's URLDecoder).
    status, by_name = await _get(http, "/registry/hyperty/dataobject/name/chat+room")
    assert status == 200 and set(by_name) == {CHAT}
    status, by_reporter = await _get(
        http, f"/registry/hyperty/dataobject/reporter/{enc(H1)}/do?dataSchemes=comm"
    )
    assert status == 200 and by_reporter == (await registry.read("/comm", reporter=H1)).value

    # The reference's answers for what is not there or not a search.
    for path in (
        f"/registry/hyperty/user/{enc(BOB)}",
        f"/registry/hyperty/user/{enc(ALICE)}/hyperty?resources=audio",
        f"/registry/hyperty/user/{enc(ALICE)}/hyperty",
        f"/registry/hyperty/user/{enc(ALICE)}/hyperty?colour=blue",
        "/registry/hyperty/nothing/here",
        "/registry/",
    ):
        assert await _get(http, path) == (404, {"message": "Not Found"}), path

    await registry.built.presence.runtime_away(claim_of(RT1))
    status, gone = await _get(http, f"/registry/hyperty/user/{enc(ALICE)}")
    assert status == 408 and {h["status"] for h in gone.values()} == {"disconnected"}


async def test_read_only_refuses_writes(registry: Harness, http: TestClient[Any, Any]) -> None:
    await registry.register_hyperty(H1, ALICE)
    body = {"status": "disconnected"}
    async with http.put(f"/registry/hyperty/url/{enc(H1)}", json=body) as response:
        assert response.status == 403
        assert await response.json() == {"message": "the registry's REST API is read-only"}
    async with http.delete(f"/registry/hyperty/user/{enc(ALICE)}/{enc(H1)}") as response:
        assert response.status == 403
    async with http.post(f"/registry/hyperty/url/{enc(H1)}", json=body) as response:
        assert response.status == 405 and response.headers["Allow"] == "GET, PUT, DELETE"
    assert (await registry.read(H1)).value["status"] == "live"  # untouched


async def test_read_write_registers_and_checks_input(
    registry: Harness, http: TestClient[Any, Any]
) -> None:
    hyperty = {
        "descriptor": DESCRIPTOR,
        "resources": ["chat"],
        "dataSchemes": ["comm"],
        "status": "live",
        "runtime": RT2,
        "expires": 300,
    }
    async with http.put(f"{RW}/hyperty/user/{enc(BOB)}/{enc(H2)}", json=hyperty) as response:
        assert response.status == 200
        assert await response.json() == {"message": "Hyperty created"}
    assert (await registry.read(BOB)).value[H2]["runtime"] == RT2
    assert registry.take_notes() == [(H2, "live")]
    # Registered over HTTP, the entry follows the runtime it names.
    await registry.built.presence.runtime_away(RT2)
    assert registry.take_notes() == [(H2, "disconnected")]

    async with http.put(f"{RW}/hyperty/url/{enc(H2)}", json={}) as response:
        assert await response.json() == {"statusChanged": "true", "message": "Keep alive"}
    async with http.put(f"{RW}/hyperty/url/{enc(H2)}", data=b"{not json") as response:
        assert response.status == 400
        assert await response.json() == {"message": "the request body is not valid JSON"}
    bob_h1 = f"{RW}/hyperty/user/{enc(BOB)}/{enc(H1)}"
    async with http.put(bob_h1, json={"status": "live"}) as response:
        assert response.status == 400
        assert (await response.json())["message"].startswith("missing fields: descriptor")
    async with http.put(f"{RW}/hyperty/url/{enc(H2)}", data=b"x" * (65 * 1024)) as response:
        assert response.status == 413
    async with http.delete(f"{RW}/hyperty/user/{enc(BOB)}/{enc(H2)}") as response:
        assert await response.json() == {"message": "Hyperty deleted"}
    assert (await registry.read(H2)).code == 408


async def test_the_relay_pointed_at_the_rest_api_answers_as_the_builtin_service(
    registry: Harness, http: TestClient[Any, Any]
) -> None:
    """The same reads through DomainRegistryConnector -> HTTP -> REST API and through the
    in-process service get the same replies: both paths reach the same resources."""
    requester = Requester(1, RT1, claim=claim_of(RT1))
    async with aiohttp.ClientSession() as session:
        relay = DomainRegistryConnector(str(http.make_url(RW)), session)

        async def both(kind: str, body: dict[str, Any]) -> ServiceReply:
            """Reads through both paths, compared. A write is made once, in process: through
            the REST API it would be the operator's, and the runtime's claim would not own
            the entry (docs/registry-connector.md, "Who may change an entry")."""
            message = registry.message(kind, body)
            direct = await registry.built.service.handle(message, requester)
            if kind == "read":
                assert await relay.handle(message, requester) == direct, body
            return direct

        hyperty = {
            "user": ALICE,
            "url": H1,
            "descriptor": DESCRIPTOR,
            "expires": 120,
            "resources": ["chat", "video"],
            "dataSchemes": ["comm"],
            "runtime": RT1,
            "status": "live",
        }
        assert (await both("create", {"value": hyperty})).code == 200
        chat = {
            "url": CHAT,
            "name": "chat room",
            "schema": "hyperty-catalogue://example.com/.well-known/dataschema/Communication",
            "reporter": H1,
            "resources": ["chat"],
            "dataSchemes": ["comm"],
            "runtime": RT1,
            "status": "live",
        }
        assert (await both("create", {"value": chat})).code == 200
        missing = await both("create", {"value": {**hyperty, "resources": None}})
        assert (missing.code, missing.desc) == (400, "missing fields: resources")
        assert (await both("update", {"resource": H1})).code == 200

        reads = [
            {"resource": ALICE},
            {"resource": ALICE, "criteria": {"resources": ["video"], "dataSchemes": ["comm"]}},
            {"resource": ALICE, "criteria": {"resources": ["audio"]}},
            {"resource": "/hyperty/idp-identifier/alice@gmail.com"},
            {"resource": H1},
            {"resource": f"hyperty://{D}/nobody"},
            {"resource": CHAT},
            {"resource": "chat room"},
            {"resource": "/comm", "criteria": {"reporter": H1, "dataSchemes": ["comm"]}},
        ]
        for body in reads:
            await both("read", body)
        await registry.built.presence.runtime_away(claim_of(RT1))
        assert (await both("read", {"resource": ALICE})).code == 408
        assert (await both("read", {"resource": H1})).code == 408

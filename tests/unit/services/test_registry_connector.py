"""Registry connectors against fake registries served by aiohttp on 127.0.0.1.

The fake domain registry keeps hyperties and data objects in memory and answers the way
dev-registry-domain's HypertyController does: it cuts the raw path at '/', decodes each segment
like Java's URLDecoder ('+' is a space), answers {"message": …} on writes and errors, 404 for
unknown entries, 408 when every entry found is disconnected. The fake global registry answers
with its {Code, Description, Value} envelope. Every request is recorded as sent (method, raw
path and query, body bytes, content type) so each mapping is asserted exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, unquote_plus

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from adapter.envelope import Message, parse
from adapter.services import registry as registry_module
from adapter.services.base import Requester, ServiceReply
from adapter.services.registry import (
    DOMAIN_NOT_CONFIGURED,
    DomainRegistryConnector,
    GlobalRegistryConnector,
    domain_registry_address,
    is_service_address,
)

REGISTRY = "domain://registry.example.com/"
GLOBAL = "global://registry/"
REQUESTER = Requester(session_id=1, runtime_url="runtime://example.com/1")
ALICE = "user://example.com/alice"
H1 = "hyperty://example.com/h-1"
CHAT = "comm://example.com/chat-1"
JWT = "eyJhbGciOiJFUzI1NiJ9.eyJkYXRhIjoiZXlKbmRXbGtJam9pWVdKaklu"  # shape only: header.payload


def message(kind: str, body: dict[str, Any] | None, to: str = REGISTRY, id_: Any = 7) -> Message:
    frame: dict[str, Any] = {
        "id": id_,
        "type": kind,
        "from": "hyperty-runtime://example.com/1/registry",
        "to": to,
    }
    if body is not None:
        frame["body"] = body
    return parse(json.dumps(frame))


@dataclass
class Seen:
    method: str
    raw_path: str  # path and query exactly as received
    body: bytes
    content_type: str | None

    def json(self) -> Any:
        return json.loads(self.body)


# --- fake registries ------------------------------------------------------------------------


@dataclass
class FakeServer:
    seen: list[Seen] = field(default_factory=list)
    # Scripted answers, consumed before the registry logic: (status, raw body).
    forced: list[tuple[int, bytes]] = field(default_factory=list)
    delay: float = 0.0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(
            Seen(request.method, request.raw_path, body, request.headers.get("Content-Type"))
        )
        if self.delay:
            # Interruptible, so teardown does not wait out a slow answer.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), self.delay)
        if self.forced:
            status, payload = self.forced.pop(0)
            return web.Response(status=status, body=payload, content_type="application/json")
        path, _, query = request.raw_path.partition("?")
        segments = [unquote_plus(part) for part in path.split("/")[1:]]
        status, answer = self.route(request.method, segments, parse_qs(query), body)
        return web.json_response(answer, status=status)

    def route(
        self, method: str, segments: list[str], query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any]:
        raise NotImplementedError


NOT_FOUND = (404, {"message": "Not Found"})


@dataclass
class FakeDomainRegistry(FakeServer):
    hyperties: dict[str, dict[str, Any]] = field(default_factory=dict)
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)

    def route(
        self, method: str, segments: list[str], query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any]:
        match method, segments:
            case "PUT", ["hyperty", "user", user, url]:
                self.hyperties[url] = {"status": "live", **json.loads(body), "user": user}
                return 200, {"message": "Hyperty created"}
            case "GET", ["hyperty", "user", user]:
                return self._hyperties(
                    {u: h for u, h in self.hyperties.items() if h["user"] == user}
                )
            case "GET", ["hyperty", "user", user, "hyperty"]:
                found = {u: h for u, h in self.hyperties.items() if h["user"] == user}
                return self._hyperties(_filtered(found, query))
            case "GET", ["hyperty", "url", url]:
                return self._hyperty(url)
            case "PUT", ["hyperty", "url", url]:
                if url not in self.hyperties:
                    return NOT_FOUND
                self.hyperties[url].update(json.loads(body))
                return 200, {"message": "Keep alive" if body == b"{}" else "Hyperty updated"}
            case "DELETE", ["hyperty", "user", user, url]:
                if self.hyperties.get(url, {}).get("user") != user:
                    return NOT_FOUND
                del self.hyperties[url]
                return 200, {"message": "Hyperty deleted"}
            case "PUT", ["hyperty", "dataobject", url]:
                self.objects[url] = {**json.loads(body), "url": url}
                return 200, {"message": "Data object created"}
            case "PUT", ["dataobject", "url", url]:
                if url not in self.objects:
                    return NOT_FOUND
                self.objects[url].update(json.loads(body))
                return 200, {"message": "data object updated"}
            case "GET", ["hyperty", "dataobject", ("url" | "name" | "reporter") as kind, key, *do]:
                found = {u: o for u, o in self.objects.items() if o.get(kind) == key}
                found = _filtered(found, query) if do == ["do"] else found
                return (200, found) if found else NOT_FOUND
            case "DELETE", ["hyperty", "dataobject", "url", url]:
                return (
                    (200, {"message": "Data object deleted"})
                    if self.objects.pop(url, None)
                    else NOT_FOUND
                )
        return NOT_FOUND

    def _hyperty(self, url: str) -> tuple[int, Any]:
        entry = self.hyperties.get(url)
        if entry is None:
            return NOT_FOUND
        return (408 if entry["status"] == "disconnected" else 200), entry

    def _hyperties(self, found: dict[str, Any]) -> tuple[int, Any]:
        if not found:
            return NOT_FOUND
        dead = all(h["status"] == "disconnected" for h in found.values())
        return (408 if dead else 200), found


def _filtered(found: dict[str, Any], query: dict[str, list[str]]) -> dict[str, Any]:
    wanted = {name: set(values[0].split(",")) for name, values in query.items()}
    return {
        url: entry
        for url, entry in found.items()
        if all(want <= set(entry.get(name, [])) for name, want in wanted.items())
    }


@dataclass
class FakeGlobalRegistry(FakeServer):
    records: dict[str, str] = field(default_factory=dict)

    def route(
        self, method: str, segments: list[str], query: dict[str, list[str]], body: bytes
    ) -> tuple[int, Any]:
        match method, segments:
            case "GET", ["guid", guid] if guid in self.records:
                return 200, {"Code": 200, "Description": "OK", "Value": self.records[guid]}
            case "GET", ["guid", _]:
                return 404, {
                    "Code": 404,
                    "Description": "Not found",
                    "Explanation": "GUID not found",
                    "Value": "",
                }
            case "PUT", ["guid", guid]:
                self.records[guid] = body.decode()
                return 200, {"Code": 200, "Description": "OK", "Value": ""}
        return 405, {"Code": 405, "Description": "Method not allowed", "Value": ""}


async def _serve(fake: FakeServer) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        fake.release.set()
        await runner.cleanup()


@pytest_asyncio.fixture(loop_scope="session")
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest_asyncio.fixture(loop_scope="session")
async def domain() -> AsyncIterator[tuple[FakeDomainRegistry, str]]:
    fake = FakeDomainRegistry()
    async for url in _serve(fake):
        yield fake, url


@pytest_asyncio.fixture(loop_scope="session")
async def global_registry() -> AsyncIterator[tuple[FakeGlobalRegistry, str]]:
    fake = FakeGlobalRegistry()
    async for url in _serve(fake):
        yield fake, url


Ask = Callable[..., Awaitable[ServiceReply]]


@pytest.fixture
def ask(domain: tuple[FakeDomainRegistry, str], session: aiohttp.ClientSession) -> Ask:
    connector = DomainRegistryConnector(domain[1], session, 2.0)

    async def send(kind: str, body: dict[str, Any] | None) -> ServiceReply:
        return await connector.handle(message(kind, body), REQUESTER)

    return send


def enc(text: str) -> str:
    """What the connector must put in a path segment (encodeURIComponent-compatible)."""
    return quote(text, safe="")


HYPERTY_VALUE = {
    "user": ALICE,
    "url": H1,
    "descriptor": "hyperty-catalogue://catalogue.example.com/.well-known/hyperty/Chat",
    "expires": 3600,
    "resources": ["chat", "voice"],
    "dataSchemes": ["comm"],
    "runtime": "runtime://example.com/1",
    "status": "live",
    "startingTime": "2017-01-01T00:00:00Z",  # not a registry field: must not be forwarded
}


async def register_alice(ask: Ask) -> None:
    reply = await ask("create", {"value": HYPERTY_VALUE, "policy": "policy"})
    assert reply == ServiceReply(200)


# --- create ---------------------------------------------------------------------------------


async def test_create_hyperty_puts_under_user_and_url(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await register_alice(ask)
    (seen,) = fake.seen
    assert seen.method == "PUT"
    assert (
        seen.raw_path
        == "/hyperty/user/user%3A%2F%2Fexample.com%2Falice/hyperty%3A%2F%2Fexample.com%2Fh-1"
    )
    assert seen.content_type == "application/json"
    assert seen.json() == {
        "descriptor": HYPERTY_VALUE["descriptor"],
        "expires": 3600,
        "resources": ["chat", "voice"],
        "dataSchemes": ["comm"],
        "status": "live",
        "runtime": "runtime://example.com/1",
    }
    assert fake.hyperties[H1]["user"] == ALICE


async def test_create_data_object_puts_under_its_url(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    value = {
        "url": CHAT,
        "name": "my chat",
        "schema": "hyperty-catalogue://catalogue.example.com/.well-known/dataschema/Communication",
        "reporter": H1,
        "resources": ["chat"],
        "dataSchemes": ["comm"],
        "expires": 3600,
        "authorise": ["user://x/y"],  # runtime-only field
    }
    reply = await ask("create", {"value": value})
    assert reply == ServiceReply(200)
    (seen,) = fake.seen
    assert (seen.method, seen.raw_path) == (
        "PUT",
        "/hyperty/dataobject/comm%3A%2F%2Fexample.com%2Fchat-1",
    )
    assert seen.json() == {k: v for k, v in value.items() if k != "authorise"}


# --- read -----------------------------------------------------------------------------------


async def test_read_by_user_returns_registry_json_as_value(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await register_alice(ask)
    reply = await ask("read", {"resource": ALICE, "attribute": "attribute"})
    assert fake.seen[-1].method == "GET"
    assert fake.seen[-1].raw_path == f"/hyperty/user/{enc(ALICE)}"
    assert reply.code == 200
    assert set(reply.value) == {H1}
    assert reply.value[H1]["resources"] == ["chat", "voice"]
    assert reply.desc is None


async def test_read_by_user_with_criteria_uses_filtered_search(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await register_alice(ask)
    scheme_url = "http://example.com/Schema"
    reply = await ask(
        "read",
        {"resource": ALICE, "criteria": {"resources": ["chat", "voice"], "dataSchemes": ["comm"]}},
    )
    assert fake.seen[-1].raw_path == (
        f"/hyperty/user/{enc(ALICE)}/hyperty?resources=chat,voice&dataSchemes=comm"
    )
    assert reply.code == 200 and set(reply.value) == {H1}
    # Values are encoded one by one; the comma between them stays a separator.
    await ask("read", {"resource": ALICE, "criteria": {"dataSchemes": [scheme_url, "a,b"]}})
    assert fake.seen[-1].raw_path == (
        f"/hyperty/user/{enc(ALICE)}/hyperty?dataSchemes=http%3A%2F%2Fexample.com%2FSchema,a%2Cb"
    )
    # Criteria without filters (CoreDiscovery adds only a domain) is a plain lookup.
    await ask("read", {"resource": ALICE, "criteria": {"domain": "example.com"}})
    assert fake.seen[-1].raw_path == f"/hyperty/user/{enc(ALICE)}"


async def test_read_hyperty_by_url_and_path_forms(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await register_alice(ask)
    cases = {
        H1: f"/hyperty/url/{enc(H1)}",
        f"/hyperty/url/{H1}": f"/hyperty/url/{enc(H1)}",
        f"/hyperty/user/{ALICE}": f"/hyperty/user/{enc(ALICE)}",
        "/hyperty/idp-identifier/alice+x@example.com": "/hyperty/email/alice%2Bx%40example.com",
        "user-guid://abc": "/hyperty/guid/user-guid%3A%2F%2Fabc",
    }
    for resource, path in cases.items():
        await ask("read", {"resource": resource})
        assert fake.seen[-1].raw_path == path, resource
    reply = await ask("read", {"resource": H1})
    assert reply.code == 200 and reply.value["user"] == ALICE


async def test_read_data_objects_by_url_name_and_reporter(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    conn = "connection://example.com/c-9"
    for url in (CHAT, conn):
        value = {"url": url, "name": "room", "reporter": H1, "resources": ["chat"]}
        assert await ask("create", {"value": value}) == ServiceReply(200)
    # Any scheme is read by URL (not only comm://).
    reply = await ask("read", {"resource": conn})
    assert fake.seen[-1].raw_path == f"/hyperty/dataobject/url/{enc(conn)}"
    assert reply.code == 200 and set(reply.value) == {conn}
    reply = await ask("read", {"resource": "room", "criteria": {"resources": ["chat"]}})
    assert fake.seen[-1].raw_path == "/hyperty/dataobject/name/room/do?resources=chat"
    assert set(reply.value) == {CHAT, conn}
    # CoreDiscovery.discoverDataObjectsPerReporter: resource "/comm", reporter in criteria.
    reply = await ask("read", {"resource": "/comm", "criteria": {"reporter": H1}})
    assert fake.seen[-1].raw_path == f"/hyperty/dataobject/reporter/{enc(H1)}"
    assert reply.code == 200 and len(reply.value) == 2
    await ask("read", {"resource": "/dataObject/name/room"})
    assert fake.seen[-1].raw_path == "/hyperty/dataobject/name/room"


async def test_read_not_found_passes_404_without_value(ask: Ask) -> None:
    reply = await ask("read", {"resource": "user://example.com/nobody"})
    # No value: the runtime takes any body.value as a hit (CoreDiscovery, Registry.checkP2P).
    assert reply == ServiceReply(404, desc="Not Found")


async def test_read_all_disconnected_is_408_with_value(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await register_alice(ask)
    fake.hyperties[H1]["status"] = "disconnected"
    reply = await ask("read", {"resource": ALICE})
    assert reply.code == 408
    assert reply.desc == "Temporarily Unavailable"
    assert set(reply.value) == {H1}


async def test_segments_round_trip_through_a_java_style_decoder(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    user = "user://example.com/al ice+bob/ünï?#&%"
    value = {**HYPERTY_VALUE, "user": user}
    assert await ask("create", {"value": value}) == ServiceReply(200)
    assert fake.hyperties[H1]["user"] == user
    reply = await ask("read", {"resource": user})
    assert reply.code == 200 and set(reply.value) == {H1}


# --- update and delete ------------------------------------------------------------------------


async def test_update_hyperty_forms(ask: Ask, domain: tuple[FakeDomainRegistry, str]) -> None:
    fake, _ = domain
    await register_alice(ask)
    path = f"/hyperty/url/{enc(H1)}"
    # Keep-alive (specs): no value -> the registry's '{}' keep-alive body.
    assert await ask("update", {"resource": H1}) == ServiceReply(200)
    assert (fake.seen[-1].method, fake.seen[-1].raw_path, fake.seen[-1].body) == (
        "PUT",
        path,
        b"{}",
    )
    # Registry.js re-registration: user is not an updatable field.
    await ask("update", {"resource": H1, "value": {"status": "live", "user": ALICE}})
    assert fake.seen[-1].json() == {"status": "live"}
    # Specs phase 2: attribute + scalar value.
    await ask("update", {"resource": H1, "attribute": "status", "value": "disconnected"})
    assert fake.seen[-1].json() == {"status": "disconnected"}
    assert fake.hyperties[H1]["status"] == "disconnected"
    # Conformance test keep-alive: a dummy value for an unknown attribute is a keep-alive.
    await ask("update", {"resource": H1, "attribute": "attribute", "value": "dummy"})
    assert fake.seen[-1].body == b"{}"


async def test_update_unknown_hyperty_is_404(ask: Ask) -> None:
    # Registry.js falls back to create on this 404.
    reply = await ask(
        "update", {"resource": "hyperty://example.com/gone", "value": {"status": "live"}}
    )
    assert reply == ServiceReply(404, desc="Not Found")


async def test_update_data_object_uses_dataobject_route(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await ask("create", {"value": {"url": CHAT, "name": "room", "reporter": H1}})
    reply = await ask("update", {"resource": CHAT, "value": {"status": "live", "subscribers": []}})
    assert reply == ServiceReply(200)
    assert (fake.seen[-1].method, fake.seen[-1].raw_path) == ("PUT", f"/dataobject/url/{enc(CHAT)}")
    assert fake.seen[-1].json() == {"status": "live"}


async def test_delete_hyperty_and_data_object(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    await register_alice(ask)
    await ask("create", {"value": {"url": CHAT, "name": "room", "reporter": H1}})
    assert await ask("delete", {"value": {"user": ALICE, "url": H1}}) == ServiceReply(200)
    assert (fake.seen[-1].method, fake.seen[-1].raw_path) == (
        "DELETE",
        f"/hyperty/user/{enc(ALICE)}/{enc(H1)}",
    )
    assert H1 not in fake.hyperties
    # Registry.js deleteDataObjectInstance sends {value: {name}}.
    assert await ask("delete", {"value": {"name": CHAT}}) == ServiceReply(200)
    assert (fake.seen[-1].method, fake.seen[-1].raw_path) == (
        "DELETE",
        f"/hyperty/dataobject/url/{enc(CHAT)}",
    )
    assert await ask("delete", {"value": {"user": ALICE, "url": H1}}) == ServiceReply(
        404, desc="Not Found"
    )


# --- malformed, unsupported, not configured -------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "named"),
    [
        ("create", None, "body.value"),
        ("create", {"value": "x"}, "body.value"),
        ("create", {"value": {"user": ALICE}}, "body.value.url"),
        ("create", {"value": {"url": H1}}, "body.value.user"),
        ("create", {"value": {"url": H1, "user": 5}}, "body.value.user"),
        ("read", {}, "body.resource"),
        ("read", {"resource": ""}, "body.resource"),
        ("read", {"resource": ALICE, "criteria": ["chat"]}, "body.criteria"),
        ("read", {"resource": ALICE, "criteria": {"resources": ["a", 1]}}, "resources"),
        ("read", {"resource": "/comm"}, "body.criteria.reporter"),
        ("read", {"resource": f"/dataObject/user/{ALICE}"}, "by 'user'"),
        ("update", {"value": {"status": "live"}}, "body.resource"),
        ("delete", {}, "body.value.url"),
        ("delete", {"value": {"url": H1}}, "body.value.user"),
    ],
)
async def test_malformed_request_is_400_naming_the_field(
    ask: Ask, domain: tuple[FakeDomainRegistry, str], kind: str, body: Any, named: str
) -> None:
    fake, _ = domain
    reply = await ask(kind, body)
    assert reply.code == 400
    assert reply.desc is not None and named in reply.desc
    assert fake.seen == []


async def test_unsupported_type_is_405(ask: Ask, domain: tuple[FakeDomainRegistry, str]) -> None:
    reply = await ask("subscribe", {"resource": ALICE})
    assert reply.code == 405
    assert reply.desc is not None and "subscribe" in reply.desc
    assert domain[0].seen == []


async def test_not_configured_is_503(session: aiohttp.ClientSession) -> None:
    connector = DomainRegistryConnector(None, session, 1.0)
    reply = await connector.handle(message("read", {"resource": ALICE}), REQUESTER)
    assert reply == ServiceReply(503, desc=DOMAIN_NOT_CONFIGURED)
    assert reply.desc == "domain registry not configured"
    assert not connector.configured
    assert DomainRegistryConnector("http://127.0.0.1:1", session).configured


# --- the registry failing --------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_unreachable_registry_is_504(session: aiohttp.ClientSession) -> None:
    connector = DomainRegistryConnector(f"http://127.0.0.1:{closed_port()}", session, 2.0)
    reply = await connector.handle(message("read", {"resource": ALICE}), REQUESTER)
    assert reply.code == 504
    assert reply.value is None
    assert reply.desc is not None and reply.desc.startswith("domain registry unreachable")


async def test_slow_registry_times_out_with_504(
    domain: tuple[FakeDomainRegistry, str], session: aiohttp.ClientSession
) -> None:
    fake, url = domain
    fake.delay = 3600.0  # answers only when the test ends: the connector's own timeout must end it
    connector = DomainRegistryConnector(url, session, 0.2)
    reply = await connector.handle(message("read", {"resource": ALICE}), REQUESTER)
    assert reply.code == 504
    assert reply.desc is not None and "no answer within 0.2 s" in reply.desc
    assert len(fake.seen) == 1


async def test_registry_error_status_and_body_pass_through(
    ask: Ask, domain: tuple[FakeDomainRegistry, str]
) -> None:
    fake, _ = domain
    fake.forced = [(500, b'{"message": "Cassandra down"}'), (503, b"<html>busy</html>")]
    assert await ask("read", {"resource": ALICE}) == ServiceReply(500, desc="Cassandra down")
    assert await ask("create", {"value": HYPERTY_VALUE}) == ServiceReply(
        503, desc="the domain registry answered HTTP 503"
    )


async def test_malformed_or_oversized_answer_is_502(
    domain: tuple[FakeDomainRegistry, str], session: aiohttp.ClientSession
) -> None:
    fake, url = domain
    fake.forced = [(200, b"{not json"), (200, b'{"a": "' + b"x" * 2000 + b'"}')]
    connector = DomainRegistryConnector(url, session, 2.0, max_answer_bytes=1000)
    reply = await connector.handle(message("read", {"resource": ALICE}), REQUESTER)
    assert reply == ServiceReply(502, desc="the domain registry answered with malformed JSON")
    reply = await connector.handle(message("read", {"resource": ALICE}), REQUESTER)
    assert reply.code == 502
    assert reply.desc is not None and "larger than 1000 bytes" in reply.desc


async def test_handle_never_raises(
    ask: Ask, monkeypatch: pytest.MonkeyPatch, domain: tuple[FakeDomainRegistry, str]
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(registry_module, "perform", broken)
    assert await ask("read", {"resource": ALICE}) == ServiceReply(
        500, desc="domain registry connector failed"
    )


# --- global registry ---------------------------------------------------------------------------


@pytest.fixture
def ask_global(
    global_registry: tuple[FakeGlobalRegistry, str], session: aiohttp.ClientSession
) -> Ask:
    connector = GlobalRegistryConnector(global_registry[1], session, 2.0)

    async def send(kind: str, body: dict[str, Any] | None, to: str = GLOBAL) -> ServiceReply:
        return await connector.handle(message(kind, body, to=to), REQUESTER)

    return send


async def test_global_create_puts_raw_jwt_then_read_gets_it(
    ask_global: Ask, global_registry: tuple[FakeGlobalRegistry, str]
) -> None:
    fake, _ = global_registry
    guid = "puZE5qCSGqcjg5mViBM3CdQHKIcHpRoyF3OGLTaYzGs"
    # GraphConnector.sendGlobalRegistryRecord form.
    reply = await ask_global("create", {"guid": guid, "jwt": JWT})
    expected = {"Code": 200, "Description": "OK", "Value": ""}
    # The record is both the value and, for the runtime's GraphConnector, top-level body fields.
    assert reply == ServiceReply(200, value=expected, extra=expected)
    seen = fake.seen[-1]
    assert (seen.method, seen.raw_path, seen.body) == ("PUT", f"/guid/{guid}", JWT.encode())
    assert seen.content_type is not None and seen.content_type.startswith("text/plain")
    # GraphConnector.useGUID form, to the slash-less address.
    reply = await ask_global("read", {"guid": guid}, "global://registry")
    assert fake.seen[-1].method == "GET" and fake.seen[-1].raw_path == f"/guid/{guid}"
    expected = {"Code": 200, "Description": "OK", "Value": JWT}
    # The record is both the value and, for the runtime's GraphConnector, top-level body fields.
    assert reply == ServiceReply(200, value=expected, extra=expected)


async def test_global_spec_form_and_update(
    ask_global: Ask, global_registry: tuple[FakeGlobalRegistry, str]
) -> None:
    fake, _ = global_registry
    # specs messages/global-registry-messages.md: {resource: guid, value: jwt}.
    assert (await ask_global("create", {"resource": "g/1+", "value": JWT})).code == 200
    assert fake.seen[-1].raw_path == "/guid/g%2F1%2B"
    assert fake.records["g/1+"] == JWT
    assert (await ask_global("update", {"resource": "g/1+", "value": JWT + "x"})).code == 200
    assert fake.records["g/1+"] == JWT + "x"
    assert (await ask_global("read", {"resource": "g/1+"})).value["Value"] == JWT + "x"


async def test_global_not_found_and_malformed(
    ask_global: Ask, global_registry: tuple[FakeGlobalRegistry, str]
) -> None:
    reply = await ask_global("read", {"guid": "unknown"})
    assert reply.code == 404
    assert reply.desc == "GUID not found"
    assert reply.value is not None and reply.value["Code"] == 404
    assert (await ask_global("read", {})).desc == "missing body.guid (or body.resource)"
    assert (await ask_global("create", {"guid": "g"})).desc == "missing body.jwt (or body.value)"
    assert (await ask_global("create", {"guid": "g", "jwt": {"a": 1}})).code == 400
    assert (await ask_global("delete", {"guid": "g"})).code == 405
    assert len(global_registry[0].seen) == 1


async def test_global_not_configured_and_unreachable(session: aiohttp.ClientSession) -> None:
    request = message("read", {"guid": "g"}, to=GLOBAL)
    reply = await GlobalRegistryConnector(None, session).handle(request, REQUESTER)
    assert reply == ServiceReply(503, desc="global registry not configured")
    down = GlobalRegistryConnector(f"http://127.0.0.1:{closed_port()}", session, 2.0)
    reply = await down.handle(request, REQUESTER)
    assert reply.code == 504
    assert reply.desc is not None and reply.desc.startswith("global registry unreachable")


# --- addresses ---------------------------------------------------------------------------


def test_service_address_matching() -> None:
    service = domain_registry_address("example.com")
    assert service == "domain://registry.example.com"
    assert is_service_address("domain://registry.example.com", service)
    assert is_service_address("domain://registry.example.com/", service)
    assert not is_service_address("domain://registry.example.com.evil/", service)
    assert not is_service_address("domain://registry.other.com/", service)
    assert is_service_address("global://registry/", "global://registry")
    assert is_service_address("global://registry", "global://registry")
    assert not is_service_address("global://registryx", "global://registry")

"""HomeserverClient against a scripted fake homeserver (one piece, in isolation)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from appservice.api import (
    HomeserverClient,
    HomeserverUnreachable,
    MatrixError,
    without_access_token,
)
from appservice.intent import AppserviceAPI


class FakeHomeserver:
    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, Any]]] = []
        self.requests: list[web.Request] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(request)
        await request.read()
        status, body = self.script.pop(0) if self.script else (200, {})
        return web.json_response(body, status=status)


@pytest_asyncio.fixture(loop_scope="session")
async def fake() -> AsyncIterator[tuple[FakeHomeserver, str]]:
    hs = FakeHomeserver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hs.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield hs, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def client_for(
    url: str, session: aiohttp.ClientSession, retries: int = 3
) -> HomeserverClient:
    return HomeserverClient(
        url, "the-as-token", session, max_retries=retries, backoff_base=0.001, backoff_max=0.01
    )


async def test_retries_429_and_5xx_then_succeeds(fake: tuple[FakeHomeserver, str]) -> None:
    hs, url = fake
    hs.script = [
        (429, {"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 5}),
        (502, {}),
        (200, {"event_id": "$e"}),
    ]
    async with aiohttp.ClientSession() as session:
        client = await client_for(url, session)
        result = await client.request(
            "PUT", "/x", endpoint="send", json_body={"a": 1}, user_id="@_rethink_a:hs"
        )
    assert result == {"event_id": "$e"}
    assert len(hs.requests) == 3
    last = hs.requests[-1]
    assert last.headers["Authorization"] == "Bearer the-as-token"
    assert last.query["user_id"] == "@_rethink_a:hs"


async def test_retries_are_bounded(fake: tuple[FakeHomeserver, str]) -> None:
    hs, url = fake
    hs.script = [(503, {"errcode": "M_UNKNOWN", "error": "busy"})] * 10
    async with aiohttp.ClientSession() as session:
        client = await client_for(url, session, retries=2)
        with pytest.raises(MatrixError) as info:
            await client.request("GET", "/y", endpoint="y")
    assert info.value.status == 503
    assert len(hs.requests) == 3


async def test_client_errors_are_not_retried(fake: tuple[FakeHomeserver, str]) -> None:
    hs, url = fake
    hs.script = [(403, {"errcode": "M_FORBIDDEN", "error": "no"})]
    async with aiohttp.ClientSession() as session:
        client = await client_for(url, session)
        with pytest.raises(MatrixError) as info:
            await client.request("GET", "/z", endpoint="z")
    assert (info.value.errcode, len(hs.requests)) == ("M_FORBIDDEN", 1)


async def test_unreachable_homeserver_raises_after_retries() -> None:
    async with aiohttp.ClientSession() as session:
        client = await client_for("http://127.0.0.1:9", session, retries=1)
        with pytest.raises(HomeserverUnreachable):
            await client.request("GET", "/", endpoint="root")


async def test_transaction_ids_are_unique_across_users_and_clients() -> None:
    async with aiohttp.ClientSession() as session:
        a = await client_for("http://h", session)
        b = await client_for("http://h", session)
        ids = {a.new_txn_id() for _ in range(1000)} | {b.new_txn_id() for _ in range(1000)}
    assert len(ids) == 2000


async def test_user_in_use_counts_as_registered(fake: tuple[FakeHomeserver, str]) -> None:
    hs, url = fake
    hs.script = [(400, {"errcode": "M_USER_IN_USE", "error": "taken"})]
    async with aiohttp.ClientSession() as session:
        api = AppserviceAPI(await client_for(url, session), "hs", "_bot")
        intent = api.intent("@_rethink_x:hs")
        await intent.ensure_registered()
        await intent.ensure_registered()  # cached: no second request
    assert len(hs.requests) == 1
    body = await hs.requests[0].json()
    assert body == {
        "type": "m.login.application_service",
        "username": "_rethink_x",
        "inhibit_login": True,
    }


def test_access_token_is_kept_out_of_urls() -> None:
    assert without_access_token("/a/b?access_token=&limit=5") == "/a/b?limit=5"
    assert without_access_token("/a/b?access_token=x") == "/a/b"
    assert without_access_token("/a/b") == "/a/b"

"""A stand-in appservice: accepts what a homeserver pushes and keeps the events for assertions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

Event = dict[str, Any]


class AppserviceListener:
    def __init__(self, hs_token: str) -> None:
        self.hs_token = hs_token
        self.events: list[Event] = []
        self.transactions: set[str] = set()
        self._arrived = asyncio.Condition()

    async def _transaction(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.hs_token}":
            return web.json_response({"errcode": "M_FORBIDDEN"}, status=403)
        body = await request.json()
        txn = request.match_info["txn"]
        async with self._arrived:
            # A retried transaction is acknowledged again, its events kept once.
            if txn not in self.transactions:
                self.transactions.add(txn)
                self.events.extend(body.get("events", []))
            self._arrived.notify_all()
        return web.json_response({})

    async def _ping(self, _request: web.Request) -> web.Response:
        return web.json_response({})

    async def wait_for(self, match: Callable[[Event], bool], timeout: float = 30.0) -> Event:
        """The first event pushed so far or within ``timeout`` seconds that ``match`` accepts."""
        deadline = time.monotonic() + timeout
        async with self._arrived:
            while True:
                found = next((e for e in self.events if match(e)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    kinds = [(e.get("type"), e.get("sender")) for e in self.events]
                    raise AssertionError(f"no matching event within {timeout}s; got {kinds}")
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except TimeoutError:
                    continue


async def ping_from_homeserver(homeserver_url: str, as_token: str, appservice_id: str) -> None:
    """Ask the homeserver to ping the appservice (MSC2659). A successful ping also makes Synapse
    retry at once the transactions it holds back for an appservice it found down earlier (for
    example while no one listened between two tests), instead of after its back-off (up to
    512 s)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{homeserver_url}/_matrix/client/v1/appservice/{appservice_id}/ping",
            json={},
            headers={"Authorization": f"Bearer {as_token}"},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()


@asynccontextmanager
async def appservice_listener(
    port: int, hs_token: str, *, homeserver_url: str, as_token: str, appservice_id: str
) -> AsyncIterator[AppserviceListener]:
    """Listen on ``port`` as the appservice and ping the homeserver once listening."""
    listener = AppserviceListener(hs_token)
    app = web.Application()
    app.router.add_put("/_matrix/app/v1/transactions/{txn}", listener._transaction)
    app.router.add_post("/_matrix/app/v1/ping", listener._ping)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        await ping_from_homeserver(homeserver_url, as_token, appservice_id)
        yield listener
    finally:
        await runner.cleanup()

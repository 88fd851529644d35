"""The application service API the homeserver calls (Matrix AS API v1), served with aiohttp.

Where a Matrix event enters the node: ``PUT /_matrix/app/v1/transactions/{txnId}``. The server
checks the homeserver's token, makes transactions idempotent, hands each batch of events to the
node's ``TransactionHandler`` and always answers quickly. It never answers 5xx because of what one
event contains: the homeserver would retry the same transaction forever and stop delivering.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from .metrics import AppserviceMetrics

log = logging.getLogger(__name__)

PREFIX = "/_matrix/app/v1"
UNSTABLE_EPHEMERAL = "de.sorunome.msc2409.ephemeral"


class TransactionHandler(Protocol):
    async def handle_events(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        """Process the events of one transaction. Must not raise for one bad event."""

    async def handle_ephemeral(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        """Take a transaction's ephemeral events (receipts, typing): taken again if the
        transaction comes again, never a reason to fail it."""


class TransactionStore(Protocol):
    """Transactions already handled, by ``transaction_key`` (not by the bare id)."""

    async def is_processed(self, key: str) -> bool: ...

    async def mark_processed(self, key: str, event_count: int) -> None: ...


class NamespaceQueries(Protocol):
    async def user_exists(self, user_id: str) -> bool:
        """Whether the appservice owns (and has now created) this user."""

    async def alias_exists(self, alias: str) -> bool:
        """Whether the appservice owns (and has now created) a room with this alias."""


def matrix_error(status: int, errcode: str, error: str) -> web.Response:
    return web.json_response({"errcode": errcode, "error": error}, status=status)


class AppserviceServer:
    def __init__(
        self,
        hs_token: str,
        handler: TransactionHandler,
        store: TransactionStore,
        queries: NamespaceQueries,
        metrics: AppserviceMetrics | None = None,
    ) -> None:
        self._hs_token = hs_token.encode()
        self._handler = handler
        self._store = store
        self._queries = queries
        self._metrics = metrics
        # A retry can arrive while the first attempt is still being processed (the homeserver
        # timed out waiting); it must wait for that attempt instead of processing the events twice.
        self._in_flight: dict[str, asyncio.Future[None]] = {}

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(self._errors_middleware)
        app.router.add_put(PREFIX + "/transactions/{txn_id}", self._authed(self.on_transaction))
        app.router.add_get(PREFIX + "/users/{user_id}", self._authed(self.on_user_query))
        app.router.add_get(PREFIX + "/rooms/{alias}", self._authed(self.on_room_query))
        app.router.add_post(PREFIX + "/ping", self._authed(self.on_ping))

    # -- authentication ---------------------------------------------------------------------

    def _authed(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            token = _bearer(request.headers.get("Authorization"))
            if token is None:
                # Homeservers before Matrix v1.4 sent the token as a query parameter.
                token = request.query.get("access_token")
            if token is None:
                return matrix_error(401, "M_UNAUTHORIZED", "missing homeserver token")
            if not hmac.compare_digest(token.encode(), self._hs_token):
                return matrix_error(403, "M_FORBIDDEN", "invalid homeserver token")
            return await handler(request)

        return wrapper

    @web.middleware
    async def _errors_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            if request.path.startswith("/_matrix/"):
                return matrix_error(404, "M_UNRECOGNIZED", "unrecognized request")
            raise
        except web.HTTPMethodNotAllowed:
            if request.path.startswith("/_matrix/"):
                return matrix_error(405, "M_UNRECOGNIZED", "unrecognized request method")
            raise
        except web.HTTPRequestEntityTooLarge as exc:
            return matrix_error(413, "M_TOO_LARGE", exc.text or "request body too large")

    # -- endpoints --------------------------------------------------------------------------

    async def on_transaction(self, request: web.Request) -> web.Response:
        txn_id = request.match_info["txn_id"]
        body = await request.read()
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            self._count("transactions", "bad_json")
            return matrix_error(400, "M_NOT_JSON", "transaction body is not JSON")
        if not isinstance(parsed, dict):
            self._count("transactions", "bad_json")
            return matrix_error(400, "M_BAD_JSON", "transaction body must be a JSON object")
        events = parsed.get("events", [])
        # MSC2409's unstable name, still sent beside the stable one by older homeservers.
        ephemeral = parsed.get("ephemeral", parsed.get(UNSTABLE_EPHEMERAL, []))
        if not isinstance(events, list) or not isinstance(ephemeral, list):
            self._count("transactions", "bad_json")
            return matrix_error(400, "M_BAD_JSON", "'events' and 'ephemeral' must be lists")
        if ephemeral:
            await self._handler.handle_ephemeral(
                txn_id, [e for e in ephemeral if isinstance(e, dict)]
            )
            if not events:
                # Nothing to store: ephemeral events are taken again if the transaction comes
                # again, and a row per receipt would cost a write each.
                self._count("transactions", "ephemeral")
                return web.json_response({})

        key = transaction_key(txn_id, events)
        while (running := self._in_flight.get(key)) is not None:
            await asyncio.shield(running)

        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = done
        try:
            if await self._store.is_processed(key):
                self._count("transactions", "duplicate")
                return web.json_response({})
            started = time.monotonic()
            valid = [e for e in events if isinstance(e, dict)]
            if len(valid) != len(events):
                self._count_events("malformed", len(events) - len(valid))
                log.warning(
                    "transaction %s: %d non-object events skipped", txn_id, len(events) - len(valid)
                )
            await self._handler.handle_events(txn_id, valid)
            await self._store.mark_processed(key, len(events))
            self._count("transactions", "processed")
            if self._metrics is not None:
                self._metrics.transaction_seconds.observe(time.monotonic() - started)
            return web.json_response({})
        finally:
            done.set_result(None)
            del self._in_flight[key]

    async def on_user_query(self, request: web.Request) -> web.Response:
        if await self._queries.user_exists(request.match_info["user_id"]):
            return web.json_response({})
        return matrix_error(404, "M_NOT_FOUND", "no such user in this appservice")

    async def on_room_query(self, request: web.Request) -> web.Response:
        if await self._queries.alias_exists(request.match_info["alias"]):
            return web.json_response({})
        return matrix_error(404, "M_NOT_FOUND", "no such room alias in this appservice")

    async def on_ping(self, request: web.Request) -> web.Response:
        # The body carries the homeserver's transaction_id; nothing to do but answer.
        return web.json_response({})

    def _count(self, _metric: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.transactions.labels(outcome).inc()

    def _count_events(self, outcome: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.transaction_events.labels(outcome).inc(n)


def transaction_key(txn_id: str, events: list[Any]) -> str:
    """What makes a transaction the same one again: its id *and* its events.

    A transaction id alone is not unique for ever: Synapse on SQLite numbers appservice
    transactions from the highest one still pending, so after a restart of Synapse it hands out
    ids it used before. A retry carries the same events, a reused id does not."""
    digest = hashlib.sha256()
    for event in events:
        event_id = event.get("event_id") if isinstance(event, dict) else None
        digest.update(str(event_id).encode())
        digest.update(b"\n")
    return f"{txn_id}/{digest.hexdigest()[:32]}"


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token.strip()

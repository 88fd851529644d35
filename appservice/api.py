"""HTTP client for the homeserver's client-server API, authenticated as the application service.

One shared aiohttp session serves every virtual user: acting as a user is a query parameter
(``?user_id=``, masquerading), not a connection or a login. Requests are retried, boundedly, on
429 (honouring ``retry_after_ms``), on 5xx and on connection failures.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import orjson

from .metrics import AppserviceMetrics

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})


class MatrixError(Exception):
    """The homeserver answered with an error (after any retries)."""

    def __init__(self, status: int, errcode: str, message: str, endpoint: str) -> None:
        super().__init__(f"{endpoint}: HTTP {status} {errcode}: {message}")
        self.status = status
        self.errcode = errcode
        self.message = message
        self.endpoint = endpoint


class HomeserverUnreachable(Exception):
    """The homeserver could not be reached (after any retries)."""


def without_access_token(path: str) -> str:
    """Drop the ``access_token`` query parameter matrix-nio's request builders add: the token
    travels in the Authorization header instead, where it stays out of access logs."""
    parts = urlsplit(path)
    if "access_token" not in parts.query:
        return path
    query = [
        (k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "access_token"
    ]
    return urlunsplit(parts._replace(query=urlencode(query)))


class HomeserverClient:
    def __init__(
        self,
        base_url: str,
        as_token: str,
        session: aiohttp.ClientSession,
        *,
        metrics: AppserviceMetrics | None = None,
        max_retries: int = 5,
        request_timeout: float = 30.0,
        backoff_base: float = 0.1,
        backoff_max: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {as_token}"}
        self._session = session
        self._metrics = metrics
        self._max_retries = max_retries
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        # Transaction ids must never repeat for a user, across virtual users and across restarts
        # of the node: a per-process random prefix plus a counter guarantees both.
        self._txn_prefix = secrets.token_hex(6)
        self._txn_counter = itertools.count(1)

    def new_txn_id(self) -> str:
        return f"{self._txn_prefix}.{next(self._txn_counter)}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        endpoint: str,
        json_body: Any = None,
        data: bytes | str | None = None,
        content_type: str | None = None,
        user_id: str | None = None,
        query: Mapping[str, str] | None = None,
        retry: bool = True,
    ) -> Any:
        """Send a request and return the parsed JSON answer (or raise MatrixError)."""
        body = await self._send(
            method, path, endpoint, json_body, data, content_type, user_id, query, retry
        )
        return orjson.loads(body) if body else {}

    async def request_bytes(
        self,
        method: str,
        path: str,
        *,
        endpoint: str,
        user_id: str | None = None,
        query: Mapping[str, str] | None = None,
    ) -> bytes:
        return await self._send(method, path, endpoint, None, None, None, user_id, query, True)

    async def _send(
        self,
        method: str,
        path: str,
        endpoint: str,
        json_body: Any,
        data: bytes | str | None,
        content_type: str | None,
        user_id: str | None,
        query: Mapping[str, str] | None,
        retry: bool,
    ) -> bytes:
        params: dict[str, str] = dict(query or {})
        if user_id is not None:
            params["user_id"] = user_id
        headers = dict(self._headers)
        if json_body is not None:
            data = orjson.dumps(json_body)
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        url = self.base_url + without_access_token(path)

        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                async with self._session.request(
                    method, url, params=params, data=data, headers=headers, timeout=self._timeout
                ) as resp:
                    body = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._observe(endpoint, "error", started)
                if not retry or attempt > self._max_retries:
                    raise HomeserverUnreachable(f"{endpoint}: {type(exc).__name__}: {exc}") from exc
                self._count_retry(endpoint, "connection")
                await asyncio.sleep(self._backoff(attempt))
                continue

            self._observe(endpoint, str(status), started)
            if status < 400:
                return body
            errcode, message, retry_after_ms = _parse_error(body)
            if retry and status in RETRYABLE_STATUS and attempt <= self._max_retries:
                self._count_retry(endpoint, str(status))
                delay = self._backoff(attempt)
                if retry_after_ms is not None:
                    delay = min(max(retry_after_ms / 1000, 0.0), self._backoff_max)
                await asyncio.sleep(delay)
                continue
            raise MatrixError(status, errcode, message, endpoint)

    def _backoff(self, attempt: int) -> float:
        ceiling = min(self._backoff_max, self._backoff_base * (2 ** (attempt - 1)))
        return random.uniform(ceiling / 2, ceiling)  # jitter keeps retries of many users apart

    def _observe(self, endpoint: str, status: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.hs_requests.labels(endpoint, status).observe(time.monotonic() - started)

    def _count_retry(self, endpoint: str, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.hs_retries.labels(endpoint, reason).inc()


def _parse_error(body: bytes) -> tuple[str, str, int | None]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "M_UNKNOWN", body[:200].decode("utf-8", "replace"), None
    if not isinstance(parsed, dict):
        return "M_UNKNOWN", str(parsed)[:200], None
    retry_after = parsed.get("retry_after_ms")
    return (
        str(parsed.get("errcode", "M_UNKNOWN")),
        str(parsed.get("error", "")),
        retry_after if isinstance(retry_after, int) else None,
    )

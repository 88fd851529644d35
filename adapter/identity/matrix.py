"""Matrix accounts as runtime credentials: a stub presents a user's access token, the domain's
homeserver says whose it is (``GET /_matrix/client/v3/account/whoami``).

A token the homeserver refuses (wrong, logged out, its user deactivated) is an
``IdentityRejected``; a homeserver that cannot answer is an ``IdentityUnavailable``. Answers are
cached by a hash of the token for a few seconds, so a reconnecting stub or a burst of sessions
costs the homeserver one request; refusals only for a second, so a token that just became valid
(a fresh login racing the connect) is not refused for long.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Final

import aiohttp

from .model import Identity, IdentityRejected, IdentityUnavailable

WHOAMI_PATH: Final = "/_matrix/client/v3/account/whoami"
DEFAULT_CACHE_SECONDS: Final = 30.0
# Refusals are remembered this long at most: enough to absorb a client retrying in a tight loop.
FAILURE_CACHE_SECONDS: Final = 1.0
DEFAULT_CACHE_ENTRIES: Final = 10_000
MAX_TOKEN_BYTES: Final = 4096


class MatrixTokenVerifier:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        homeserver_url: str,
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._url = homeserver_url.rstrip("/") + WHOAMI_PATH
        self._cache_seconds = cache_seconds
        self._cache_entries = cache_entries
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._clock = clock
        # token digest -> (valid until, identity or the refusal)
        self._cache: OrderedDict[bytes, tuple[float, Identity | IdentityRejected]] = OrderedDict()

    async def verify(self, access_token: str) -> Identity:
        """The identity the token belongs to. Raises IdentityRejected or IdentityUnavailable."""
        if not isinstance(access_token, str) or not access_token.strip():
            raise IdentityRejected("no access token")
        if len(access_token.encode()) > MAX_TOKEN_BYTES or not access_token.isprintable():
            raise IdentityRejected("malformed access token")
        key = hashlib.sha256(access_token.encode()).digest()
        cached = self._cache.get(key)
        if cached is not None:
            until, outcome = cached
            if self._clock() < until:
                if isinstance(outcome, IdentityRejected):
                    raise IdentityRejected(outcome.reason)
                return outcome
            del self._cache[key]
        try:
            identity = await self._whoami(access_token)
        except IdentityRejected as exc:
            self._remember(key, FAILURE_CACHE_SECONDS, exc)
            raise
        self._remember(key, self._cache_seconds, identity)
        return identity

    def forget(self, access_token: str) -> None:
        """Drop a cached answer (e.g. the runtime told the node it logged out)."""
        self._cache.pop(hashlib.sha256(access_token.encode()).digest(), None)

    def _remember(self, key: bytes, seconds: float, outcome: Identity | IdentityRejected) -> None:
        if seconds <= 0:
            return
        self._cache[key] = (self._clock() + seconds, outcome)
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)

    async def _whoami(self, access_token: str) -> Identity:
        headers = {"Authorization": f"Bearer {access_token}"}
        try:
            async with self._http.get(self._url, headers=headers, timeout=self._timeout) as resp:
                status = resp.status
                try:
                    body: Any = await resp.json(content_type=None)
                except (ValueError, aiohttp.ClientPayloadError):
                    body = None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise IdentityUnavailable(f"the homeserver did not answer: {exc!r}") from None
        if status == 200:
            return _identity(body)
        errcode = body.get("errcode") if isinstance(body, dict) else None
        if status in (401, 403) or errcode in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN"):
            message = body.get("error") if isinstance(body, dict) else None
            detail = f"{errcode}: {message}" if errcode else f"HTTP {status}"
            if isinstance(body, dict) and body.get("soft_logout"):
                detail += " (soft logout: log in again)"
            raise IdentityRejected(f"the homeserver refused the access token ({detail})")
        raise IdentityUnavailable(f"the homeserver answered whoami with HTTP {status}")


def _identity(body: Any) -> Identity:
    user_id = body.get("user_id") if isinstance(body, dict) else None
    if not isinstance(user_id, str) or not user_id.startswith("@") or ":" not in user_id:
        raise IdentityUnavailable("the homeserver's whoami answer names no user")
    if body.get("is_guest") is True:
        raise IdentityRejected("guest accounts cannot authenticate a runtime")
    return Identity(
        user_id=user_id,
        idp_domain=user_id.split(":", 1)[1],
        method="matrix",
        authenticated=True,
        username=user_id,
        claims=MappingProxyType(dict(body)),
    )

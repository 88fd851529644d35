"""The registry's REST API over HTTP: dev-registry-domain's paths under a prefix, answered by a
``RegistryBackend`` (the built-in registry).

The request is turned into the same ``RestCall`` the relay builds, so HTTP clients and runtimes
see the same resources. Paths are cut at '/' on the raw (still encoded) path and each piece is
decoded the way the reference's URLDecoder does ('+' is a space): a user URL travels as one
piece, ``user%3A%2F%2Fexample.com%2Falice``. Filter values are split at literal commas, then
decoded.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import unquote_plus

from aiohttp import web

from .registry_backend import RegistryBackend
from .registry_http import JSON_CONTENT_TYPE, RestCall

REST_PREFIX: Final = "/registry"
# A registration is a few hundred bytes; anything near this is not one.
MAX_BODY_BYTES: Final = 64 * 1024
READ_METHODS: Final = frozenset({"GET", "HEAD"})
WRITE_METHODS: Final = frozenset({"PUT", "DELETE"})


class RegistryRestApi:
    def __init__(
        self,
        backend: RegistryBackend,
        *,
        writable: bool = False,
        prefix: str = REST_PREFIX,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._backend = backend
        self._writable = writable
        self._prefix = prefix.rstrip("/")
        self._max_body_bytes = max_body_bytes

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", self._prefix + "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        method = request.method
        if method not in READ_METHODS | WRITE_METHODS:
            return _error(405, f"method {method} not allowed", allow="GET, PUT, DELETE")
        if method in WRITE_METHODS and not self._writable:
            # Writes come from runtimes, through the MN; over HTTP the registry is for reading
            # (the reference's deployment guide leaves reads open and guards writes).
            return _error(403, "the registry's REST API is read-only")
        raw_path, _, raw_query = request.raw_path.partition("?")
        segments = tuple(unquote_plus(piece) for piece in raw_path.split("/")[1:])
        # Strip the prefix's own pieces: they are not part of the registry's path.
        segments = segments[len(self._prefix.split("/")) - 1 :]
        body: bytes | None = None
        if method == "PUT":
            if request.content_length is not None and request.content_length > self._max_body_bytes:
                return _error(413, f"request body larger than {self._max_body_bytes} bytes")
            body = await _read_bounded(request, self._max_body_bytes)
            if body is None:
                return _error(413, f"request body larger than {self._max_body_bytes} bytes")
        call = RestCall(
            "GET" if method == "HEAD" else method,
            segments,
            _query(raw_query),
            body,
            request.headers.get("Content-Type") if body else None,
        )
        answer = await self._backend.call(call)
        return web.Response(status=answer.status, body=answer.body, content_type=JSON_CONTENT_TYPE)


def _query(raw_query: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    found: dict[str, tuple[str, ...]] = {}
    for pair in raw_query.split("&"):
        if not pair:
            continue
        name, _, value = pair.partition("=")
        # The first value of a repeated name counts, as in the reference (Spark's queryParams).
        found.setdefault(unquote_plus(name), tuple(unquote_plus(item) for item in value.split(",")))
    return tuple(found.items())


async def _read_bounded(request: web.Request, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(16 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str, allow: str | None = None) -> web.Response:
    headers = {"Allow": allow} if allow else None
    return web.json_response({"message": message}, status=status, headers=headers)

"""One REST call to a registry and its answer, with every network failure turned into a value.

The registry connectors are relays: a reTHINK message becomes one HTTP request, the HTTP answer
becomes the reTHINK response. This module is the HTTP half, shared by the domain and the global
registry connectors; what to call is decided in ``registry_domain`` / ``registry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import aiohttp
import orjson
import yarl

JSON_CONTENT_TYPE: Final = "application/json"
TEXT_CONTENT_TYPE: Final = "text/plain; charset=utf-8"
# An answer larger than this is refused rather than buffered: a registry lookup answers with a
# handful of entries, and the reply still has to fit the MN's message path.
DEFAULT_MAX_ANSWER_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RestCall:
    """What to send: raw (unencoded) path segments, query filters, an optional body."""

    method: str
    segments: tuple[str, ...]
    # Each filter is a name and its values; the registry reads them comma-separated.
    query: tuple[tuple[str, tuple[str, ...]], ...] = ()
    body: bytes | None = None
    content_type: str | None = None

    def url(self, base_url: str) -> yarl.URL:
        return yarl.URL(base_url.rstrip("/") + self.path_qs(), encoded=True)

    def path_qs(self) -> str:
        # Every segment is percent-encoded whole, '/' and ':' included: the registries cut the
        # path at '/' and decode each piece, so `user://a/b` must travel as one segment.
        path = "/" + "/".join(_encode(segment) for segment in self.segments)
        if not self.query:
            return path
        return (
            path
            + "?"
            + "&".join(
                f"{name}={','.join(_encode(value) for value in values)}"
                for name, values in self.query
            )
        )


def json_body(value: Any) -> tuple[bytes, str]:
    return orjson.dumps(value), JSON_CONTENT_TYPE


def _encode(text: str) -> str:
    # safe="" also escapes '+' (%2B), which the Java registries' URLDecoder would read as a space.
    return quote(text, safe="")


@dataclass(frozen=True, slots=True)
class RestAnswer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The parsed body, or ``INVALID_JSON``."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return INVALID_JSON


class _Invalid:
    def __repr__(self) -> str:
        return "INVALID_JSON"


INVALID_JSON: Final = _Invalid()


class RegistryFailure(Exception):
    """No usable HTTP answer. ``code`` is what to answer the runtime: 504 when the registry
    cannot be reached or does not answer in time, 502 when its answer is unusable."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


async def perform(
    session: aiohttp.ClientSession,
    base_url: str,
    call: RestCall,
    timeout_seconds: float,
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> RestAnswer:
    """Send ``call``; raise RegistryFailure when no usable answer can be had."""
    headers = {"Accept": JSON_CONTENT_TYPE}
    if call.content_type is not None:
        headers["Content-Type"] = call.content_type
    try:
        async with session.request(
            call.method,
            call.url(base_url),
            data=call.body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_seconds),
            # A redirect would re-encode the path and could leave the registry's host.
            allow_redirects=False,
        ) as response:
            body = await _read_bounded(response, max_answer_bytes)
            return RestAnswer(response.status, body)
    except TimeoutError:
        raise RegistryFailure(504, f"no answer within {timeout_seconds:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise RegistryFailure(504, _describe(exc)) from None


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise RegistryFailure(502, f"answer larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

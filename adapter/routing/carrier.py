"""How a batch of reTHINK messages (or journal entries) becomes one Matrix event, and back.

A batch that fits in one event travels inline: each message as its exact text, in a JSON string,
so any JSON survives untouched. A larger batch goes to the media repository and the event points
at it; there the messages are length-framed raw bytes (no escaping to pay for, nothing to parse to
find them), each with the `to` addresses the node already read from it. See
docs/matrix-mapping.md.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

BATCH_EVENT = "eu.rethink-project.mn.batch"
JOURNAL_EVENT = "eu.rethink-project.mn.journal"
FORMAT_VERSION = 1
FRAMES = "rethink-frames-1"  # media encoding of message batches
JSON = "json"  # media encoding of journal batches: a JSON array

# A PDU must stay under 65,536 bytes; the homeserver adds the envelope (ids, hashes, signature,
# auth and prev events: ~1.5 kB). Content up to this size always fits.
INLINE_LIMIT = 60_000

T_contra = TypeVar("T_contra", contravariant=True)


class CarrierError(Exception):
    """Event content that is not a batch this node can read."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One routed message waiting in an outbox: its exact text and the addresses it goes to."""

    text: str
    to: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Encoded:
    """What to send: inline content, or media bytes and the content that points at them."""

    inline: bytes | None
    blob: bytes | None
    _prefix: bytes
    _encoding: str

    def media_content(self, uri: str) -> bytes:
        assert self.blob is not None
        ref = {
            "uri": uri,
            "size": len(self.blob),
            "crc32": zlib.crc32(self.blob),
            "encoding": self._encoding,
        }
        return self._prefix + b',"media":' + orjson.dumps(ref) + b"}"


def _prefix(header: dict[str, Any], count: int) -> bytes:
    fields = {"v": FORMAT_VERSION, **header, "count": count}
    return orjson.dumps(fields)[:-1]  # open: the items or the media reference follow


def _inline(prefix: bytes, field: str, items: Sequence[bytes]) -> bytes:
    return b"".join((prefix, b',"', field.encode(), b'":[', b",".join(items), b"]}"))


class Encoder(Protocol[T_contra]):
    event_type: str

    def size(self, item: T_contra) -> int:
        """Bytes the item adds to a batch (for batch and queue limits)."""

    def encode(self, header: dict[str, Any], items: Sequence[T_contra]) -> Encoded: ...


class MessageEncoder:
    """Outbox batches: message texts inline as JSON strings, or framed in media."""

    event_type = BATCH_EVENT

    def size(self, item: Outgoing) -> int:
        return len(item.text)

    def encode(self, header: dict[str, Any], items: Sequence[Outgoing]) -> Encoded:
        prefix = _prefix(header, len(items))
        # Escaping can only grow a text, so a batch whose raw size is already too big goes to
        # media without paying for the escaping.
        if sum(len(i.text) for i in items) + len(prefix) < INLINE_LIMIT:
            inline = _inline(prefix, "messages", [orjson.dumps(i.text) for i in items])
            if len(inline) <= INLINE_LIMIT:
                return Encoded(inline, None, prefix, FRAMES)
        return Encoded(None, frame(items), prefix, FRAMES)


class JournalEncoder:
    """Journal batches: entries are JSON objects, inline or as a JSON array in media."""

    event_type = JOURNAL_EVENT

    def size(self, item: bytes) -> int:
        return len(item)

    def encode(self, header: dict[str, Any], items: Sequence[bytes]) -> Encoded:
        prefix = _prefix(header, len(items))
        inline = _inline(prefix, "entries", items)
        if len(inline) <= INLINE_LIMIT:
            return Encoded(inline, None, prefix, JSON)
        return Encoded(None, b"[" + b",".join(items) + b"]", prefix, JSON)


def frame(items: Sequence[Outgoing]) -> bytes:
    """``<len(to)> <len(text)>\\n<to as a JSON array><text>`` per message, UTF-8."""
    parts: list[bytes] = []
    for item in items:
        to = orjson.dumps(item.to)
        text = item.text.encode()
        parts.append(b"%d %d\n" % (len(to), len(text)))
        parts.append(to)
        parts.append(text)
    return b"".join(parts)


def unframe(blob: bytes) -> list[tuple[str, tuple[str, ...]]]:
    messages: list[tuple[str, tuple[str, ...]]] = []
    pos, end = 0, len(blob)
    try:
        while pos < end:
            line_end = blob.index(b"\n", pos)
            to_len, text_len = (int(n) for n in blob[pos:line_end].split(b" ", 1))
            start = line_end + 1
            text_end = start + to_len + text_len
            if to_len < 0 or text_len < 0 or text_end > end:
                raise ValueError("a frame runs past the end of the media")
            to = tuple(orjson.loads(blob[start : start + to_len]))
            messages.append((blob[start + to_len : text_end].decode(), to))
            pos = text_end
    except (ValueError, TypeError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise CarrierError(f"media frames are damaged: {exc}") from None
    return messages


MediaFetcher = Callable[[str], Awaitable[bytes]]


async def _media(content: dict[str, Any], field: str, fetch: MediaFetcher) -> tuple[str, bytes]:
    media = content.get("media")
    if not isinstance(media, dict) or not isinstance(media.get("uri"), str):
        raise CarrierError(f"neither '{field}' nor a media reference")
    blob = await fetch(media["uri"])
    if media.get("size") is not None and media.get("size") != len(blob):
        raise CarrierError(f"media size {len(blob)} differs from the announced {media['size']}")
    if media.get("crc32") is not None and zlib.crc32(blob) != media.get("crc32"):
        raise CarrierError("media content does not match its crc32")
    return str(media.get("encoding", JSON)), blob


def _check(content: Any) -> dict[str, Any]:
    if not isinstance(content, dict) or content.get("v") != FORMAT_VERSION:
        raise CarrierError("not a version-1 batch")
    return content


async def decode_messages(
    content: Any, fetch: MediaFetcher
) -> list[tuple[Any, tuple[str, ...] | None]]:
    """(text, to) per message of a batch event; ``to`` is None where the node has to read it
    from the text (inline batches). Raises CarrierError for content that is not ours or is
    damaged; lets a failure of ``fetch`` (the homeserver) through."""
    body = _check(content)
    inline = body.get("messages")
    if isinstance(inline, list):
        return [(text, None) for text in inline]
    encoding, blob = await _media(body, "messages", fetch)
    if encoding == FRAMES:
        return [(text, to) for text, to in unframe(blob)]
    return [(text, None) for text in _json_array(blob)]


async def decode_entries(content: Any, fetch: MediaFetcher) -> list[Any]:
    """The entries of a journal event."""
    body = _check(content)
    inline = body.get("entries")
    if isinstance(inline, list):
        return inline
    _encoding, blob = await _media(body, "entries", fetch)
    return _json_array(blob)


def _json_array(blob: bytes) -> list[Any]:
    try:
        items = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise CarrierError(f"media is not a JSON array: {exc}") from None
    if not isinstance(items, list):
        raise CarrierError("media is not a JSON array")
    return items


def media_kind(content: Any) -> str:
    return "media" if isinstance(content, dict) and "media" in content else "inline"

"""How reTHINK messages (or journal entries) become Matrix events, and back.

A lane event carries a batch of messages of any number of runtimes. Each message travels as its
exact text in a JSON string (any JSON survives untouched) together with what the node read from
it when it arrived: its destinations, the sender it came from (an index into the event's sender
table, which names the runtime and its Matrix user) and the sender's number for it. A batch that
does not fit in one event goes to the media repository, length-framed, and the event points at
it. docs/matrix-mapping.md has the formats and the reasons.

Events written before lanes (format 1: one runtime's messages, in its own outbox room) are still
read, for the export.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from .envelope import addresses

BATCH_EVENT = "eu.rethink-project.mn.batch"
JOURNAL_EVENT = "eu.rethink-project.mn.journal"
LANE_FORMAT = 2
LEGACY_FORMAT = 1  # per-runtime outbox rooms: {"runtime", "seq", "messages": [texts]}
JOURNAL_FORMAT = 1
FRAMES = "rethink-frames-2"  # media encoding of lane batches
LEGACY_FRAMES = "rethink-frames-1"
JSON = "json"  # media encoding of journal batches: a JSON array

# Matrix's canonical JSON holds integers only within ±(2^53 - 1): the homeserver refuses an
# event with a larger one. Every number the node writes into an event (sequence numbers, event
# numbers) is kept within 1 … this, and so is every number it reads back.
MAX_NUMBER = 2**53 - 1

# A PDU must stay under 65,536 bytes; the homeserver adds the envelope (ids, hashes, signature,
# auth and prev events: ~1.5 kB). Content up to this size always fits.
INLINE_LIMIT = 60_000
# What an inline lane event holds besides its messages and sender table, at most (the fields),
# and each message besides its text and destinations (its sender index, number, brackets).
INLINE_FIELDS = 200
MESSAGE_FIELDS = 40
# A batch too big for inline JSON is first tried packed (its media frames, deflated, in base64)
# when its frames are at most this big: beyond, it would not fit once packed either.
PACK_LIMIT = 4 * INLINE_LIMIT
# The most a packed batch may unpack to (no writer packs more): a peer's event of a few kB
# cannot make this node allocate, or spend its event loop inflating, more than that.
UNPACKED_LIMIT = PACK_LIMIT
# A batch sized for one packed event aims this far under the limit: its size is estimated from
# how much the stream's previous batch deflated, and an estimate that misses sends it as media.
PACKED_TARGET = INLINE_LIMIT * 9 // 10
# An inline batch at least this big is tried packed as well, and goes packed when that is at
# most this share of its inline size.
PACK_ABOVE = INLINE_LIMIT // 2
PACKED_WORTH_IT = 0.8
# However well a batch deflated, the next is sized as if it deflated no better than this (a
# repetitive batch must not make the next, different one far too big for an event).
MIN_PACKED_PER_BYTE = 0.25
# A message's frame header ("<sender> <oseq> <len(to)> <len(text)>\n") is at most this long.
FRAME_HEADER = 40

T_contra = TypeVar("T_contra", contravariant=True)


class CarrierError(Exception):
    """Event content that is not a batch this node can read."""


@dataclass(frozen=True, slots=True)
class Sender:
    """Who a carried message came from: its origin (the numbering its sequence belongs to),
    the runtime, the Matrix user the runtime is, and the identity it proved when it connected
    (None for an anonymous runtime)."""

    origin: str
    runtime: str
    user: str
    identity: str | None = None

    def entry(self) -> list[str]:
        fields = [self.origin, self.runtime, self.user]
        return fields if self.identity is None else [*fields, self.identity]

    def size(self) -> int:
        """About the bytes its entry takes in a sender table (for estimates: the fields are
        checked addresses and ids, with nothing to escape as a rule)."""
        fields = len(self.origin) + len(self.runtime) + len(self.user) + len(self.identity or "")
        return fields + 16


@dataclass(frozen=True, slots=True)
class Routed:
    """One routed message as it travels: exact text, destinations, sender and its number."""

    text: str
    to: tuple[str, ...]
    sender: Sender
    oseq: int


@dataclass(frozen=True, slots=True)
class Encoded:
    """What to send: inline content, or media bytes and the content that points at them."""

    inline: bytes | None
    blob: bytes | None
    _prefix: bytes
    _encoding: str
    packed: bool = False  # inline, as deflated media frames

    @property
    def kind(self) -> str:
        """How the batch travels: inline, packed or media (a metric label)."""
        return "media" if self.inline is None else "packed" if self.packed else "inline"

    def media_content(self, uri: str) -> bytes:
        assert self.blob is not None
        ref = {
            "uri": uri,
            "size": len(self.blob),
            "crc32": zlib.crc32(self.blob),
            "encoding": self._encoding,
        }
        return self._prefix + b',"media":' + orjson.dumps(ref) + b"}"


def _open(fields: dict[str, Any]) -> bytes:
    return orjson.dumps(fields)[:-1]  # open: the items or the media reference follow


def _inline(prefix: bytes, field: str, items: Sequence[bytes]) -> bytes:
    return b"".join((prefix, b',"', field.encode(), b'":[', b",".join(items), b"]}"))


class Encoder(Protocol[T_contra]):
    event_type: str

    def size(self, item: T_contra) -> int:
        """Bytes the item adds to a batch (for batch and queue limits)."""

    def encode(self, header: dict[str, Any], items: Sequence[T_contra]) -> Encoded: ...


class HasRouted(Protocol):
    @property
    def routed(self) -> Routed: ...


class LaneEncoder:
    """Lane batches: messages inline as JSON strings with their sender and destinations, or
    framed, deflated into the event (packed) or in media."""

    event_type = BATCH_EVENT

    def __init__(self) -> None:
        # Bytes of packed content per byte of frames in the last batch this encoder packed:
        # how well its traffic deflates (base64 takes back a third of what deflate saves). 1.0
        # until then: random text (the least deflate can do) packs to about its own size.
        self.packed_per_frame_byte = 1.0

    def size(self, item: HasRouted) -> int:
        return len(item.routed.text)

    def fit(self, items: Sequence[HasRouted]) -> int:
        """How many of ``items``, from the first, travel in one event: inline (an estimate from
        above: quotes and backslashes count twice; ``encode`` checks the real size) or packed,
        whichever takes more (estimated from how the last packed batch deflated)."""
        inline_budget = INLINE_LIMIT - INLINE_FIELDS
        packed_budget = (PACKED_TARGET - INLINE_FIELDS) / self.packed_per_frame_byte
        seen: set[Sender] = set()
        inline = frames = 0
        inline_taken: int | None = None
        for taken, item in enumerate(items):
            routed = item.routed
            sender = routed.sender
            if sender not in seen:
                seen.add(sender)
                entry = sender.size()
                inline += entry
                frames += entry
            text = routed.text
            length = len(text) if text.isascii() else len(text.encode())
            to = sum(len(to) + 3 for to in routed.to)
            inline += length + text.count('"') + text.count("\\") + MESSAGE_FIELDS + to
            frames += length + to + FRAME_HEADER
            if inline_taken is None and inline > inline_budget:
                inline_taken = taken
            if inline_taken is not None and (frames > packed_budget or frames > PACK_LIMIT):
                return max(inline_taken, taken)
        return len(items)

    def encode(self, header: dict[str, Any], items: Sequence[HasRouted]) -> Encoded:
        index: dict[Sender, int] = {}
        senders: list[list[str]] = []
        for item in items:
            sender = item.routed.sender
            if sender not in index:
                index[sender] = len(senders)
                senders.append(sender.entry())
        fields = {"v": LANE_FORMAT, **header, "count": len(items)}
        sender_table = orjson.dumps(senders)
        prefix = _open(fields)
        inline_prefix = b"".join((_open(fields), b',"senders":', sender_table))
        # Escaping can only grow a text, so a batch whose raw size is already too big skips it.
        inline: bytes | None = None
        if sum(len(i.routed.text) for i in items) + len(inline_prefix) < INLINE_LIMIT:
            inline = _inline(
                inline_prefix,
                "messages",
                [
                    orjson.dumps((index[r.sender], r.oseq, r.to, r.text))
                    for r in (i.routed for i in items)
                ],
            )
            if len(inline) > INLINE_LIMIT:
                inline = None
            elif len(inline) < PACK_ABOVE:
                return Encoded(inline, None, inline_prefix, FRAMES)
        # In media the sender table travels in the blob too: a batch of hundreds of runtimes'
        # messages would not fit an event beside it.
        blob = b"%d\n%s%s" % (
            len(sender_table),
            sender_table,
            frame([(index[i.routed.sender], i.routed) for i in items]),
        )
        if len(blob) <= PACK_LIMIT:
            # Deflated, most batches of a few hundred messages still fit an event: that spares
            # the upload and, across domains, the far homeserver's fetch of the media from
            # this one (a request over federation per event). A large batch that fits inline
            # is packed too when that makes its event clearly smaller (every reader pays an
            # inflate for it), and tells ``fit`` how well this traffic deflates.
            packed = base64.b64encode(zlib.compress(blob, 1))
            self.packed_per_frame_byte = max(len(packed) / len(blob), MIN_PACKED_PER_BYTE)
            content = b"".join((prefix, b',"packed":"', packed, b'"}'))
            if len(content) <= INLINE_LIMIT and (
                inline is None or len(content) < len(inline) * PACKED_WORTH_IT
            ):
                return Encoded(content, None, prefix, FRAMES, packed=True)
        if inline is not None:
            return Encoded(inline, None, inline_prefix, FRAMES)
        return Encoded(None, blob, prefix, FRAMES)


class JournalEncoder:
    """Journal batches: entries are JSON objects, inline or as a JSON array in media."""

    event_type = JOURNAL_EVENT

    def size(self, item: bytes) -> int:
        return len(item)

    def encode(self, header: dict[str, Any], items: Sequence[bytes]) -> Encoded:
        prefix = _open({"v": JOURNAL_FORMAT, **header, "count": len(items)})
        inline = _inline(prefix, "entries", items)
        if len(inline) <= INLINE_LIMIT:
            return Encoded(inline, None, prefix, JSON)
        return Encoded(None, b"[" + b",".join(items) + b"]", prefix, JSON)


def frame(items: Sequence[tuple[int, Routed]]) -> bytes:
    """``<sender> <oseq> <len(to)> <len(text)>\\n<to as a JSON array><text>`` per message."""
    parts: list[bytes] = []
    for sender, routed in items:
        to = orjson.dumps(routed.to)
        text = routed.text.encode()
        parts.append(b"%d %d %d %d\n" % (sender, routed.oseq, len(to), len(text)))
        parts.append(to)
        parts.append(text)
    return b"".join(parts)


def _unframe(blob: bytes, fields: int) -> list[tuple[list[int], bytes, str]]:
    """(leading numbers, `to` JSON, text) per frame; ``fields`` numbers per header line, the
    last two being the lengths of `to` and of the text."""
    found: list[tuple[list[int], bytes, str]] = []
    pos, end = 0, len(blob)
    try:
        while pos < end:
            line_end = blob.index(b"\n", pos)
            numbers = [int(n) for n in blob[pos:line_end].split(b" ")]
            if len(numbers) != fields:
                raise ValueError("a frame header has the wrong number of fields")
            *lead, to_len, text_len = numbers
            start = line_end + 1
            text_end = start + to_len + text_len
            if to_len < 0 or text_len < 0 or text_end > end:
                raise ValueError("a frame runs past the end of the media")
            to = blob[start : start + to_len]
            found.append((lead, to, blob[start + to_len : text_end].decode()))
            pos = text_end
    except (ValueError, UnicodeDecodeError) as exc:
        raise CarrierError(f"media frames are damaged: {exc}") from None
    return found


MediaFetcher = Callable[[str], Awaitable[bytes]]


async def _media(content: dict[str, Any], fetch: MediaFetcher) -> tuple[str, bytes]:
    media = content.get("media")
    if not isinstance(media, dict) or not isinstance(media.get("uri"), str):
        raise CarrierError("neither inline items nor a media reference")
    blob = await fetch(media["uri"])
    if media.get("size") is not None and media.get("size") != len(blob):
        raise CarrierError(f"media size {len(blob)} differs from the announced {media['size']}")
    if media.get("crc32") is not None and zlib.crc32(blob) != media.get("crc32"):
        raise CarrierError("media content does not match its crc32")
    return str(media.get("encoding", JSON)), blob


def _to(raw: Any) -> tuple[str, ...]:
    try:
        parsed = orjson.loads(raw) if isinstance(raw, bytes) else raw
    except orjson.JSONDecodeError as exc:
        raise CarrierError(f"destinations are not JSON: {exc}") from None
    if not isinstance(parsed, list):
        raise CarrierError("destinations must be a list")
    return addresses(parsed)


# What a sender entry may hold: an origin is a session key and a stub instance (or the node's
# own), the rest are addresses and Matrix ids.
_ORIGIN = re.compile(r"[A-Za-z0-9._-]{1,64}")
# In a domain's own lanes only: what a peer domain's runtime sent, which the federation process
# relays to the domain's lanes numbered in the peer's namespace (federation/peer_traffic.py
# ``peer_origin``; at most 128 characters, as the sender marks keep them).
_RELAYED_ORIGIN = re.compile(r"[A-Za-z0-9._-]{1,64}|peer:[A-Za-z0-9.:_-]{1,123}")
MAX_SENDER_FIELD = 1024


def _senders(raw: Any, relayed: bool) -> list[Sender]:
    if not isinstance(raw, list):
        raise CarrierError("a lane batch without its sender table")
    senders = []
    for entry in raw:
        if not (
            isinstance(entry, list)
            and len(entry) in (3, 4)
            and all(isinstance(e, str) and len(e) <= MAX_SENDER_FIELD for e in entry)
            and (_RELAYED_ORIGIN if relayed else _ORIGIN).fullmatch(entry[0])
        ):
            raise CarrierError(
                "a sender entry must be [origin, runtime, user(, identity)]: an origin of 1-64 "
                "characters A-Z a-z 0-9 . _ -, fields of at most 1024 characters"
            )
        senders.append(Sender(*entry))
    return senders


def _oseq(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_NUMBER:
        raise CarrierError(f"a message's sequence number must be an integer 1 … {MAX_NUMBER}")
    return value


def _sender(senders: list[Sender], index: Any) -> Sender:
    if not isinstance(index, int) or not 0 <= index < len(senders):
        raise CarrierError(f"sender index {index!r} is not in the sender table")
    return senders[index]


async def decode_batch(content: Any, fetch: MediaFetcher, relayed: bool = False) -> list[Routed]:
    """The messages of a lane batch event, in order. Raises CarrierError for content that is not
    ours or is damaged; lets a failure of ``fetch`` (the homeserver) through. ``relayed``: the
    event is one of this domain's lanes, which may carry peers' messages relayed to it (never
    for a peer's event: a peer numbers only its own runtimes' messages)."""
    if not isinstance(content, dict) or content.get("v") != LANE_FORMAT:
        raise CarrierError("not a lane batch (format 2)")
    inline = content.get("messages")
    found: list[Routed] = []
    if isinstance(inline, list):
        senders = _senders(content.get("senders"), relayed)
        for item in inline:
            if not (isinstance(item, list) and len(item) == 4 and isinstance(item[3], str)):
                raise CarrierError("a message must be [sender, oseq, to, text]")
            sender, oseq, to, text = item
            found.append(Routed(text, _to(to), _sender(senders, sender), _oseq(oseq)))
        return found
    packed = content.get("packed")
    if isinstance(packed, str):
        blob = _unpack(packed)
    else:
        encoding, blob = await _media(content, fetch)
        if encoding != FRAMES:
            raise CarrierError(f"unknown media encoding {encoding!r}")
    senders, frames = _sender_table(blob, relayed)
    for (sender, oseq), to, text in _unframe(frames, 4):
        found.append(Routed(text, _to(to), _sender(senders, sender), _oseq(oseq)))
    return found


# A lane event names at most this many rooms that must be read before it (the lanes of the
# processes its writer took sessions from since its last event).
MAX_AFTER = 64


def read_after(content: Any) -> dict[str, int]:
    """A lane event's ``after``: the rooms whose events, up to these numbers, a reader must
    have handled before this event (``{}`` when absent; entries that are not a room id and a
    number 1 … MAX_NUMBER are ignored)."""
    after = content.get("after") if isinstance(content, dict) else None
    if not isinstance(after, dict):
        return {}
    found: dict[str, int] = {}
    for room, n in list(after.items())[:MAX_AFTER]:
        if (
            isinstance(room, str)
            and room.startswith("!")
            and len(room) <= MAX_SENDER_FIELD
            and isinstance(n, int)
            and not isinstance(n, bool)
            and 0 < n <= MAX_NUMBER
        ):
            found[room] = n
    return found


def _unpack(packed: str) -> bytes:
    """A packed batch's media frames; at most ``UNPACKED_LIMIT`` bytes of them (a peer could
    otherwise send a few kB that unpack to gigabytes)."""
    try:
        inflater = zlib.decompressobj()
        blob = inflater.decompress(base64.b64decode(packed, validate=True), UNPACKED_LIMIT)
    except (binascii.Error, ValueError, zlib.error) as exc:
        raise CarrierError(f"packed batch is damaged: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise CarrierError("packed batch is truncated or unpacks beyond the limit")
    return blob


def _sender_table(blob: bytes, relayed: bool) -> tuple[list[Sender], bytes]:
    """A lane batch's media: ``<length>\\n<sender table JSON>`` then the frames."""
    try:
        line_end = blob.index(b"\n")
        length = int(blob[:line_end])
        start = line_end + 1
        table = orjson.loads(blob[start : start + length])
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise CarrierError(f"media without a readable sender table: {exc}") from None
    return _senders(table, relayed), blob[start + length :]


async def decode_legacy_batch(content: Any, fetch: MediaFetcher) -> list[Any]:
    """The messages of a format-1 event (one runtime's outbox room): texts, as carried (an
    item that is not a string is passed on for the caller to count)."""
    if not isinstance(content, dict) or content.get("v") != LEGACY_FORMAT:
        raise CarrierError("not a format-1 batch")
    inline = content.get("messages")
    if isinstance(inline, list):
        return inline
    encoding, blob = await _media(content, fetch)
    if encoding == LEGACY_FRAMES:
        return [text for _lead, _to_raw, text in _unframe(blob, 2)]
    return _json_array(blob)


def batch_format(content: Any) -> int | None:
    version = content.get("v") if isinstance(content, dict) else None
    return version if isinstance(version, int) else None


async def decode_entries(content: Any, fetch: MediaFetcher) -> list[Any]:
    """The entries of a journal event."""
    if not isinstance(content, dict) or content.get("v") != JOURNAL_FORMAT:
        raise CarrierError("not a version-1 journal batch")
    inline = content.get("entries")
    if isinstance(inline, list):
        return inline
    _encoding, blob = await _media(content, fetch)
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
    if isinstance(content, dict) and "media" in content:
        return "media"
    return "packed" if isinstance(content, dict) and "packed" in content else "inline"

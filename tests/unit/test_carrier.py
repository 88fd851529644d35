"""The batch encodings: inline when it fits an event, framed media otherwise, exact both ways."""

from __future__ import annotations

import json

import orjson
import pytest

from adapter.routing import carrier
from adapter.routing.carrier import CarrierError, MessageEncoder, Outgoing


def message(i: int, size: int = 10) -> Outgoing:
    text = json.dumps(
        {
            "id": i,
            "type": "update",
            "from": "a",
            "to": ["b", "c"],
            "body": {"s": 'é"\\\n' + "x" * size},
        }
    )
    return Outgoing(text, ("b", "c"))


async def no_media(uri: str) -> bytes:
    raise AssertionError(f"unexpected media fetch {uri}")


async def test_small_batches_travel_inline_with_exact_texts() -> None:
    items = [message(i) for i in range(5)]
    encoded = MessageEncoder().encode({"runtime": "runtime://x/1", "seq": 3}, items)
    assert encoded.inline is not None and encoded.blob is None
    content = orjson.loads(encoded.inline)
    assert content["count"] == 5 and content["seq"] == 3 and content["v"] == 1
    decoded = await carrier.decode_messages(content, no_media)
    assert [text for text, _ in decoded] == [i.text for i in items]


async def test_large_batches_go_to_media_framed_with_their_destinations() -> None:
    items = [message(i, size=2000) for i in range(40)]  # ~80 kB: more than one event holds
    encoded = MessageEncoder().encode({"runtime": "r", "seq": 1}, items)
    assert encoded.inline is None and encoded.blob is not None
    content = orjson.loads(encoded.media_content("mxc://hs/abc"))
    assert content["media"]["uri"] == "mxc://hs/abc"
    assert content["media"]["encoding"] == carrier.FRAMES

    async def fetch(uri: str) -> bytes:
        assert uri == "mxc://hs/abc" and encoded.blob is not None
        return encoded.blob

    decoded = await carrier.decode_messages(content, fetch)
    assert decoded == [(i.text, i.to) for i in items]


async def test_damaged_media_is_refused() -> None:
    items = [message(i, size=4000) for i in range(20)]
    encoded = MessageEncoder().encode({}, items)
    assert encoded.blob is not None
    content = orjson.loads(encoded.media_content("mxc://hs/x"))
    blob = encoded.blob

    async def truncated(_uri: str) -> bytes:
        return blob[:-10]

    async def flipped(_uri: str) -> bytes:
        return blob[:100] + b"?" + blob[101:]

    with pytest.raises(CarrierError, match="size"):
        await carrier.decode_messages(content, truncated)
    with pytest.raises(CarrierError, match="crc32"):
        await carrier.decode_messages(content, flipped)


def test_unframe_rejects_garbage() -> None:
    for blob in (b"nonsense", b"3 4\n[]", b"-1 2\nab", b"2 99\n[]abc"):
        with pytest.raises(CarrierError):
            carrier.unframe(blob)


async def test_foreign_content_is_not_ours() -> None:
    for content in (None, [], {"v": 2, "messages": []}, {"v": 1}, {"v": 1, "media": "x"}):
        with pytest.raises(CarrierError):
            await carrier.decode_messages(content, no_media)


async def test_journal_batches_inline_and_media() -> None:
    encoder = carrier.JournalEncoder()
    entries = [orjson.dumps({"kind": "service", "n": i}) for i in range(3)]
    inline = encoder.encode({}, entries)
    assert inline.inline is not None
    assert await carrier.decode_entries(orjson.loads(inline.inline), no_media) == [
        {"kind": "service", "n": i} for i in range(3)
    ]
    big = [orjson.dumps({"kind": "service", "pad": "y" * 5000, "n": i}) for i in range(20)]
    media = encoder.encode({}, big)
    assert media.blob is not None

    async def fetch(_uri: str) -> bytes:
        assert media.blob is not None
        return media.blob

    got = await carrier.decode_entries(orjson.loads(media.media_content("mxc://hs/j")), fetch)
    assert [e["n"] for e in got] == list(range(20))

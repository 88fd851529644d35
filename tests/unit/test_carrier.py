"""The batch encodings: inline when it fits an event, framed media otherwise, exact both ways,
with each message's sender and number."""

from __future__ import annotations

import base64
import json
import random
import zlib

import orjson
import pytest

from adapter import carrier
from adapter.carrier import CarrierError, LaneEncoder, Routed, Sender
from adapter.routing.lanes import Outgoing

ALICE = Sender("k1.stubA", "runtime://x/alice", "@_rethink_a:hs")
BOB = Sender("k2.n", "runtime://x/bob", "@_rethink_b:hs")


def message(i: int, size: int = 10, sender: Sender = ALICE, noise: bool = False) -> Outgoing:
    """A message with ``size`` characters of filler: repeated, or random (``noise``: what
    deflate cannot shrink much)."""
    filler = (
        base64.b64encode(random.Random(i).randbytes(size)).decode()[:size] if noise else "x" * size
    )
    text = json.dumps(
        {
            "id": i,
            "type": "update",
            "from": "a",
            "to": ["b", "c"],
            "body": {"s": 'é"\\\n' + filler, "f": 1.5e300, "big": 2**70},
        }
    )
    return Outgoing(Routed(text, ("b", "c"), sender, i + 1), 1)


async def no_media(uri: str) -> bytes:
    raise AssertionError(f"unexpected media fetch {uri}")


async def test_small_batches_travel_inline_with_exact_texts_and_senders() -> None:
    items = [message(i, sender=ALICE if i % 2 else BOB) for i in range(5)]
    encoded = LaneEncoder().encode({"lane": 1, "n": 3}, items)
    assert encoded.inline is not None and encoded.blob is None
    content = orjson.loads(encoded.inline)
    assert content["count"] == 5 and content["n"] == 3 and content["v"] == 2
    # Each sender once, in order of first appearance: the event's audit trail.
    assert content["senders"] == [
        [BOB.origin, BOB.runtime, BOB.user],
        [ALICE.origin, ALICE.runtime, ALICE.user],
    ]
    decoded = await carrier.decode_batch(content, no_media)
    assert decoded == [i.routed for i in items]


async def test_large_batches_go_to_media_framed_with_their_destinations() -> None:
    items = [message(i, size=2000, sender=ALICE if i < 20 else BOB, noise=True) for i in range(40)]
    encoded = LaneEncoder().encode({"n": 1}, items)
    assert encoded.inline is None and encoded.blob is not None
    content = orjson.loads(encoded.media_content("mxc://hs/abc"))
    assert content["media"]["uri"] == "mxc://hs/abc"
    assert content["media"]["encoding"] == carrier.FRAMES

    async def fetch(uri: str) -> bytes:
        assert uri == "mxc://hs/abc" and encoded.blob is not None
        return encoded.blob

    assert await carrier.decode_batch(content, fetch) == [i.routed for i in items]


async def test_large_batches_that_deflate_enough_travel_packed_in_the_event() -> None:
    items = [message(i, size=2000, sender=ALICE if i < 20 else BOB) for i in range(40)]
    encoded = LaneEncoder().encode({"n": 1}, items)
    assert encoded.inline is not None and encoded.packed and encoded.kind == "packed"
    assert len(encoded.inline) <= carrier.INLINE_LIMIT
    content = orjson.loads(encoded.inline)
    assert "messages" not in content and "media" not in content
    assert carrier.media_kind(content) == "packed"
    assert await carrier.decode_batch(content, no_media) == [i.routed for i in items]


async def test_the_largest_batch_a_writer_packs_is_one_a_reader_unpacks() -> None:
    items = [message(i, size=2000) for i in range(200)]
    frames = sum(len(i.routed.text) for i in items)
    assert frames > carrier.PACK_LIMIT  # too much to pack: media
    assert LaneEncoder().encode({}, items).kind == "media"
    fits = items[: len(items) * carrier.PACK_LIMIT // frames - 2]
    encoded = LaneEncoder().encode({}, fits)
    assert encoded.kind == "packed" and encoded.inline is not None
    assert await carrier.decode_batch(orjson.loads(encoded.inline), no_media) == [
        i.routed for i in fits
    ]


def packed(blob: bytes) -> dict[str, object]:
    return {"v": 2, "count": 1, "packed": base64.b64encode(zlib.compress(blob)).decode()}


@pytest.mark.parametrize(
    "content",
    [
        # A few kB that would unpack to more than the limit.
        packed(b"2\n[]" + b" " * (carrier.UNPACKED_LIMIT + 1)),
        {"v": 2, "count": 1, "packed": "not base64!"},
        {"v": 2, "count": 1, "packed": base64.b64encode(zlib.compress(b"2\n[]")[:-3]).decode()},
        packed(b"2\n[]5 1 5 7\n"),  # a frame that runs past the end
    ],
)
async def test_a_damaged_or_oversized_packed_batch_is_refused(content: object) -> None:
    with pytest.raises(CarrierError):
        await carrier.decode_batch(content, no_media)


async def test_damaged_media_is_refused() -> None:
    items = [message(i, size=4000, noise=True) for i in range(20)]
    encoded = LaneEncoder().encode({}, items)
    assert encoded.blob is not None
    content = orjson.loads(encoded.media_content("mxc://hs/x"))
    blob = encoded.blob

    async def truncated(_uri: str) -> bytes:
        return blob[:-10]

    async def flipped(_uri: str) -> bytes:
        return blob[:100] + bytes([blob[100] ^ 1]) + blob[101:]

    with pytest.raises(CarrierError, match="size"):
        await carrier.decode_batch(content, truncated)
    with pytest.raises(CarrierError, match="crc32"):
        await carrier.decode_batch(content, flipped)


@pytest.mark.parametrize(
    "content",
    [
        None,
        {"v": 1, "messages": ["x"]},
        {"v": 2, "messages": [[0, 1, ["b"], "x"]]},  # no sender table
        {"v": 2, "senders": [["o", "r", "u"]], "messages": [[1, 1, ["b"], "x"]]},  # bad index
        {"v": 2, "senders": [["o", "r", "u"]], "messages": [[0, "1", ["b"], "x"]]},
        {"v": 2, "senders": [["o", "r", "u"]], "messages": [[0, 1, "b", "x"]]},
        {"v": 2, "senders": [["o", "r"]], "messages": []},
        {"v": 2, "senders": [], "media": {"uri": 5}},
    ],
)
async def test_content_that_is_not_a_lane_batch_is_refused(content: object) -> None:
    with pytest.raises(CarrierError):
        await carrier.decode_batch(content, no_media)


async def test_events_of_the_outbox_format_are_still_read() -> None:
    legacy = {
        "v": 1,
        "runtime": "runtime://x/1",
        "seq": 1,
        "count": 2,
        "messages": ['{"a":1}', "[]"],
    }
    assert await carrier.decode_legacy_batch(legacy, no_media) == ['{"a":1}', "[]"]
    frames = b'5 7\n["b"]{"a":1}'
    media = {"v": 1, "count": 1, "media": {"uri": "mxc://h/m", "encoding": "rethink-frames-1"}}

    async def fetch(_uri: str) -> bytes:
        return frames

    assert await carrier.decode_legacy_batch(media, fetch) == ['{"a":1}']


async def test_journal_batches_round_trip() -> None:
    entries = [orjson.dumps({"kind": "service", "n": i}) for i in range(3)]
    encoded = carrier.JournalEncoder().encode({}, entries)
    assert encoded.inline is not None
    decoded = await carrier.decode_entries(orjson.loads(encoded.inline), no_media)
    assert decoded == [{"kind": "service", "n": i} for i in range(3)]


async def test_a_batch_of_many_runtimes_keeps_its_sender_table_out_of_the_event() -> None:
    """Hundreds of runtimes' messages in one event: the sender table goes to media with the
    messages, or the event would outgrow what the homeserver accepts."""
    crowd = [
        Sender(f"{i:016x}.stubX", f"runtime://x/{i:04d}", f"@_rethink_{i:032x}:hs")
        for i in range(700)
    ]
    items = [message(i, size=60, sender=crowd[i], noise=True) for i in range(700)]
    encoded = LaneEncoder().encode({"n": 9}, items)
    assert encoded.blob is not None
    content = orjson.loads(encoded.media_content("mxc://hs/m"))
    assert len(encoded.media_content("mxc://hs/m")) < 1000 and "senders" not in content

    async def fetch(_uri: str) -> bytes:
        assert encoded.blob is not None
        return encoded.blob

    decoded = await carrier.decode_batch(content, fetch)
    assert decoded == [i.routed for i in items]


def crowd(noise: bool) -> list[Outgoing]:
    """A crowd's messages, each from its own runtime."""
    senders = [
        Sender(f"{i:016x}.stubX", f"runtime://x/{i:04d}", f"@_rethink_{i:032x}:hs")
        for i in range(1000)
    ]
    return [message(i, size=300, sender=senders[i], noise=noise) for i in range(1000)]


def test_fit_fills_one_event_packed_when_that_holds_more_than_inline() -> None:
    """Random payloads (what deflate shrinks least): ``fit`` stops where one event is full,
    inline or packed, and once a batch was packed it sizes the next by how that one deflated."""
    items = crowd(noise=True)
    encoder = LaneEncoder()
    first = encoder.fit(items)
    assert 0 < first < len(items)
    assert encoder.encode({"n": 1}, items[:first]).kind != "media"
    fits = encoder.fit(items[first:])
    batch = items[first : first + fits]
    assert encoder.encode({"n": 2}, batch).kind == "packed"
    # More than one inline event holds, and not far from full: a fifth more would be media.
    assert sum(len(orjson.dumps(i.routed.text)) for i in batch) > carrier.INLINE_LIMIT
    more = items[first : first + fits + fits // 5]
    assert LaneEncoder().encode({"n": 2}, more).kind == "media"


def test_traffic_that_deflates_well_goes_more_to_an_event() -> None:
    noise, repetitive = LaneEncoder(), LaneEncoder()
    for encoder, items in ((noise, crowd(noise=True)), (repetitive, crowd(noise=False))):
        encoder.encode({"n": 1}, items[: encoder.fit(items)])
    n_noise, n_repetitive = noise.fit(crowd(noise=True)), repetitive.fit(crowd(noise=False))
    assert n_repetitive > 2 * n_noise
    assert repetitive.encode({"n": 2}, crowd(noise=False)[:n_repetitive]).kind == "packed"


def test_a_batch_that_deflates_little_stays_inline() -> None:
    """Packing is for a clear gain: a batch whose text is mostly random stays readable JSON."""
    texts = [base64.b64encode(random.Random(i).randbytes(3000)).decode() for i in range(12)]
    items = [Outgoing(Routed(t, ("b",), ALICE, i + 1), 1) for i, t in enumerate(texts)]
    encoder = LaneEncoder()
    encoded = encoder.encode({"n": 1}, items)
    assert encoded.kind == "inline" and encoder.packed_per_frame_byte > 0.9


def test_the_rooms_a_lane_event_names_to_read_first_are_checked() -> None:
    good = {"!a:hs": 3, "!b:hs": carrier.MAX_NUMBER}
    assert carrier.read_after({"v": 2, "after": good}) == good
    hostile = {
        "!ok:hs": 1,
        "not-a-room": 5,
        "!zero:hs": 0,
        "!neg:hs": -1,
        "!big:hs": carrier.MAX_NUMBER + 1,
        "!float:hs": 2.0,
        "!bool:hs": True,
        "!str:hs": "4",
        "!" + "x" * 2000: 4,
    }
    assert carrier.read_after({"after": hostile}) == {"!ok:hs": 1}
    for content in (None, [], {"after": None}, {"after": [["!a:hs", 1]]}, {"after": "!a:hs"}):
        assert carrier.read_after(content) == {}
    many = {f"!r{i}:hs": 1 for i in range(carrier.MAX_AFTER + 10)}
    assert len(carrier.read_after({"after": many})) == carrier.MAX_AFTER


async def test_a_peers_numbering_is_read_only_from_the_domains_own_lanes() -> None:
    """The federation process relays a peer's messages to the domain's lanes numbered in the
    peer's namespace; a peer's own event may not claim one."""
    relayed = Sender("peer:b.example:k9.stubB", "runtime://b.example/bob", "@_rethink_b:hs")
    item = message(1, sender=relayed)
    content = orjson.loads(LaneEncoder().encode({"lane": 0, "n": 1}, [item]).inline or b"")
    assert await carrier.decode_batch(content, no_media, relayed=True) == [item.routed]
    with pytest.raises(CarrierError, match="origin"):
        await carrier.decode_batch(content, no_media)
    for origin in ("peer:" + "x" * 124, "peer:", "peer:b/c:o", "xpeer:b:o"):
        content["senders"] = [[origin, "runtime://b/r", "@u:hs"]]
        with pytest.raises(CarrierError, match="origin"):
            await carrier.decode_batch(content, no_media, relayed=True)

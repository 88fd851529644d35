"""Turning the node's room events into export rows (docs/export-schema.md).

Pure functions: an event (and, for the media carrier, the bytes it points at) in, rows out. One
row per reTHINK message; journal receipts become `receipts` rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from .. import carrier
from ..envelope import addresses, body_bytes
from ..services.allocation import ENDPOINTS as ALLOCATION_ENDPOINTS
from ..services.allocation import flatten_addresses
from ..services.subscriptions import requested_resources

Row = dict[str, Any]


def utc_date(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


def split_address(address: str | None) -> tuple[str | None, str | None]:
    """(scheme, authority) of ``scheme://authority/path``."""
    if not address or "://" not in address:
        return None, None
    scheme, rest = address.split("://", 1)
    return scheme or None, rest.split("/", 1)[0] or None


# The integer columns' ranges (analytics/schema.py): a value beyond one would fail the whole
# file it is written in, so it is written as null instead.
INT32 = 2**31 - 1
INT64 = 2**63 - 1
# The last millisecond of year 9999: a later time has no date to partition by.
MAX_TS_MS = 253_402_300_799_999


def int_in(value: Any, bound: int = INT32) -> int | None:
    """``value`` when it is an integer the column holds (``bound``: INT32 or INT64), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and -bound - 1 <= value <= bound:
        return value
    return None


def message_fields(text: Any) -> tuple[Row, dict[str, Any] | None]:
    """The per-message columns, and the parsed message (None when it is not a JSON object).
    Never raises: a message the columns cannot be read from (whatever it holds, and whenever
    it was stored) gives the row of a message that is not an object, and the event's others
    are read as usual."""
    parsed: Any = None
    if isinstance(text, str):
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            parsed = None
    if not isinstance(parsed, dict):
        return _empty_message(), None
    try:
        return _fields(text, parsed), parsed
    except Exception:  # noqa: BLE001 - one message's row, not the file's
        return _empty_message(), None


def _fields(text: str, parsed: dict[str, Any]) -> Row:
    msg_id = parsed.get("id")
    msg_type = parsed.get("type")
    sender = parsed.get("from")
    targets = addresses(parsed.get("to"))
    body = parsed.get("body")
    from_scheme, from_domain = split_address(sender if isinstance(sender, str) else None)
    to_scheme, to_domain = split_address(targets[0] if targets else None)
    code = body.get("code") if isinstance(body, dict) else None
    return {
        "msg_id": None
        if msg_id is None
        else (msg_id if isinstance(msg_id, str) else orjson.dumps(msg_id).decode()),
        "type": msg_type.lower() if isinstance(msg_type, str) else None,
        "from": sender if isinstance(sender, str) else None,
        "to": " ".join(targets) if targets else None,
        "to_count": len(targets),
        "from_scheme": from_scheme,
        "from_domain": from_domain,
        "to_scheme": to_scheme,
        "to_domain": to_domain,
        "body_size": _body_size(text, body),
        "response_code": int_in(code) if str(msg_type).lower() == "response" else None,
    }


def _body_size(text: str, body: Any) -> int | None:
    """Bytes of the body as compact JSON; for a body deeper than orjson writes (one stored
    before the node bounded nesting where messages enter), as the sender wrote it."""
    if body is None:
        return 0
    try:
        size = len(orjson.dumps(body))
    except orjson.JSONEncodeError:
        size = body_bytes(text)
    return int_in(size)


def _empty_message() -> Row:
    return {
        "msg_id": None,
        "type": None,
        "from": None,
        "to": None,
        "to_count": 0,
        "from_scheme": None,
        "from_domain": None,
        "to_scheme": None,
        "to_domain": None,
        "body_size": 0,
        "response_code": None,
    }


def service_of(address: str | None) -> str:
    if not address:
        return "other"
    if address.startswith("domain://msg-node."):
        endpoint = address.rstrip("/").rsplit("/", 1)[-1]
        if endpoint in ALLOCATION_ENDPOINTS:
            return "allocation"
        if endpoint == "sm":
            return "subscription"
        return "other"
    if address.startswith("domain://registry."):
        return "registry"
    if address.startswith("global://registry"):
        return "global-registry"
    if address.startswith("domain://idm."):
        return "idm"
    return "other"


def addresses_affected(
    service: str, request: dict[str, Any] | None, response: dict[str, Any] | None
) -> tuple[int | None, int | None]:
    """(addresses the request names, addresses the answer confirms) for allocation and
    subscription exchanges: allocated/deleted/subscribed/unsubscribed counts."""
    if request is None or service not in ("allocation", "subscription"):
        return None, None
    kind = str(request.get("type", "")).lower()
    body = request.get("body") if isinstance(request.get("body"), dict) else {}
    assert isinstance(body, dict)
    answer_body = (
        response.get("body") if response and isinstance(response.get("body"), dict) else {}
    )
    assert isinstance(answer_body, dict)
    ok = answer_body.get("code") == 200
    asked: int | None = None
    confirmed: int | None = None
    if service == "allocation" and kind == "create":
        value = body.get("value") if isinstance(body.get("value"), dict) else {}
        number = value.get("number", 1) if isinstance(value, dict) else 1
        asked = int_in(number)
        allocated = answer_body.get("value", {})
        if ok and isinstance(allocated, dict) and isinstance(allocated.get("allocated"), list):
            confirmed = len(allocated["allocated"])
    elif service == "allocation" and kind == "delete":
        asked = len(flatten_addresses([body.get("resource"), body.get("childrenResources")]))
        confirmed = asked if ok else 0
    elif service == "subscription" and kind in ("subscribe", "unsubscribe"):
        found = requested_resources(kind, body)
        asked = len(found) if isinstance(found, list) else 0
        confirmed = asked if ok else 0
    return asked, confirmed


MediaFetcher = Callable[[str], Awaitable[bytes]]


async def rows_for_event(event: dict[str, Any], fetch: MediaFetcher) -> tuple[list[Row], list[Row]]:
    """(message rows, receipt rows) of one event. Raises carrier.CarrierError when the event
    is not a readable batch or journal event."""
    event_type = event.get("type")
    content = event.get("content")
    origin = int_in(event.get("origin_server_ts"), INT64)
    if origin is None or not 0 <= origin <= MAX_TS_MS:
        raise carrier.CarrierError("event without origin_server_ts")
    base: Row = {
        "event_id": event.get("event_id"),
        "room_id": event.get("room_id"),
        "event_type": event_type,
        "sender": event.get("sender"),
        "origin_server_ts": origin,
        "carrier": carrier.media_kind(content),
        "service": None,
        "addresses": None,
        "identity": None,
        "date": utc_date(origin),
    }
    if event_type == carrier.BATCH_EVENT:
        items = await _routed(content, fetch)
        rows = []
        for index, (text, runtime, identity) in enumerate(items):
            fields, _ = message_fields(text)
            rows.append(
                {
                    **base,
                    **fields,
                    "runtime": runtime,
                    "identity": identity,
                    "ts": origin,
                    "messages_in_event": len(items),
                    "index_in_event": index,
                    "kind": "routed",
                }
            )
        return rows, []
    if event_type == carrier.JOURNAL_EVENT:
        entries = await carrier.decode_entries(content, fetch)
        return _journal_rows(base, entries)
    raise carrier.CarrierError(f"not a node event type: {event_type!r}")


async def _routed(content: Any, fetch: MediaFetcher) -> list[tuple[Any, str | None, str | None]]:
    """(text, sending runtime, its proven identity) per message of a batch event: a lane batch
    names each message's runtime; an older outbox batch was one runtime's."""
    if carrier.batch_format(content) == carrier.LEGACY_FORMAT:
        runtime = content.get("runtime") if isinstance(content, dict) else None
        texts = await carrier.decode_legacy_batch(content, fetch)
        return [(text, runtime if isinstance(runtime, str) else None, None) for text in texts]
    return [
        (r.text, r.sender.runtime, r.sender.identity)
        for r in await carrier.decode_batch(content, fetch, relayed=True)
    ]


def _entry_ts(entry: dict[str, Any], fallback: int) -> int:
    ts = int_in(entry.get("ts"), INT64)
    return ts if ts is not None and 0 <= ts <= MAX_TS_MS else fallback


def _journal_rows(base: Row, entries: list[Any]) -> tuple[list[Row], list[Row]]:
    pairs: list[tuple[str, Any, dict[str, Any]]] = []  # (kind, text, entry)
    receipts: list[Row] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        kind = entry.get("kind")
        if kind == "receipt":
            ts = _entry_ts(entry, base["origin_server_ts"])
            delivered = entry.get("delivered")
            for index, count in enumerate(delivered if isinstance(delivered, list) else []):
                if int_in(count) is not None:
                    receipts.append(
                        {
                            "event_id": entry.get("event_id"),
                            "index_in_event": index,
                            "delivered": count,
                            "ts": ts,
                            "date": utc_date(ts),
                        }
                    )
        elif kind in ("service", "rejected"):
            if entry.get("request") is not None:
                pairs.append((f"{kind}_request", entry.get("request"), entry))
            pairs.append((f"{kind}_response", entry.get("response"), entry))
    rows = []
    total = len(pairs)
    for index, (kind, text, entry) in enumerate(pairs):
        fields, _ = message_fields(text)
        _, request = message_fields(entry.get("request"))
        _, answer = message_fields(entry.get("response"))
        service = (
            service_of(
                request.get("to")
                if request and isinstance(request.get("to"), str)
                else fields["to"]
            )
            if kind.startswith("service")
            else None
        )
        try:
            asked, confirmed = addresses_affected(service or "", request, answer)
        except Exception:  # noqa: BLE001 - the entry's row goes without its address count
            asked, confirmed = None, None
        ts = _entry_ts(entry, base["origin_server_ts"])
        rows.append(
            {
                **base,
                **fields,
                "runtime": entry.get("runtime"),
                "ts": ts,
                "messages_in_event": total,
                "index_in_event": index,
                "kind": kind,
                "service": service,
                "addresses": asked if kind.endswith("request") else _affected(entry, confirmed),
            }
        )
    return rows, receipts


def _affected(entry: dict[str, Any], computed: int | None) -> int | None:
    """What the node recorded it changed; older journal entries lack it, so fall back to what
    the request and answer say."""
    affected = int_in(entry.get("affected"))
    return affected if affected is not None else int_in(computed)

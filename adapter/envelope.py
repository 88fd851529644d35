"""The reTHINK message envelope: parsing a frame, reading its addresses, building answers.

The one place a message's header is read: the ingress decides with it, and the export reads its
columns with it.

A message keeps the exact text it arrived as (`raw`): that text, not a re-serialisation, is what
travels through Matrix and reaches the destination, so any JSON a runtime sends (floats, integers
beyond 2^53, unicode escapes, key order) arrives byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .addresses import invisible_character, spelling_problem

# Types the MN itself understands; any other type is routed untouched (the MN is content-agnostic).
KNOWN_TYPES = frozenset(
    {
        "create",
        "read",
        "update",
        "delete",
        "subscribe",
        "unsubscribe",
        "response",
        "forward",
        "execute",
    }
)
# Bounds of a message (docs/stub-protocol.md, "Bounds"), checked once where it enters (a stub's
# frame, a peer domain's message) and set by the weakest consumer on any path it takes.
MAX_ADDRESS_BYTES = 1024
MAX_ID_BYTES = 1024
MAX_TYPE_LENGTH = 64
MAX_DESTINATIONS = 256
# An integer id is echoed in every answer and compared with the answer a runtime sends back: a
# JavaScript runtime holds integers exactly only within ±(2^53 - 1), as Matrix's canonical JSON
# does. A fraction (1.5) is no id a runtime's bus makes, and compares unreliably once rounded.
MAX_ID_NUMBER = 2**53 - 1
# Nesting levels of a whole message (its object is level 1). The weakest consumer is orjson's
# writer, which refuses more than 254 levels: the export and the dashboard write a message's
# parts again, and the node's own records (a registry entry, an answer) wrap what a runtime sent
# in a few levels of their own. Half of it leaves that room many times over; reTHINK's data
# objects nest a handful of levels.
MAX_NESTING = 128


class InvalidMessage(Exception):
    """A frame that is not a usable reTHINK message; ``code`` is the HTTP-style answer code."""

    def __init__(self, code: int, reason: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        # What could be read of the header, to address an error answer when possible.
        self.partial = partial


@dataclass(slots=True)
class Message:
    raw: str
    # As the runtime wrote it: the one parse reads a string, or an integer within the id's
    # bound, exactly (check_header refuses any other).
    id: str | int
    type: str  # lowercased
    from_: str
    to: tuple[str, ...]
    body: dict[str, Any]

    @property
    def to_first(self) -> str:
        return self.to[0]


# The most levels orjson writes: it refuses a 255th.
WRITER_DEPTH = 254


def nesting_exceeds(value: Any, limit: int = MAX_NESTING, raw: str | None = None) -> bool:
    """Whether ``value`` (a parsed JSON value) nests deeper than ``limit`` levels. ``raw``, its
    text, lets most messages skip the check: fewer brackets than levels cannot nest too deep.

    The weakest writer checks it, in C: inside ``WRITER_DEPTH - limit`` levels of its own, the
    value is writable exactly when it nests at most ``limit`` levels. (A walk in Python took
    38 ms of the event loop for a 0.8 MB message of 120,000 small objects; this takes a few.)"""
    if raw is not None and raw.count("[") + raw.count("{") <= limit:
        return False
    if not isinstance(value, dict | list):
        return False
    wrapped: Any = value
    for _ in range(WRITER_DEPTH - limit):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        # What orjson parsed it writes again, but for its depth.
        return "Recursion" in str(exc)
    return False


def parse(raw: str, parsed: Any = None) -> Message:
    """Parse and check one frame. Raises InvalidMessage with the code to answer with."""
    if parsed is None:
        parsed = loads(raw)
    if not isinstance(parsed, dict):
        raise InvalidMessage(400, f"a message must be a JSON object, not {_json_kind(parsed)}")
    return check_header(raw, parsed)


def loads(raw: str | bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(400, f"malformed JSON: {exc}") from None


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


# A NUL character: JSON carries it only escaped, and an escaped backslash before "u0000" is
# no NUL. No field that the node keeps in PostgreSQL (an address, a key) can hold one.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def holds_nul(raw: str) -> bool:
    return "\\u0000" in raw and _NUL.search(raw) is not None


def check_header(raw: str, obj: dict[str, Any]) -> Message:
    if holds_nul(raw):
        raise InvalidMessage(400, "a message must not hold a NUL character (\\u0000)", obj)
    msg_id = obj.get("id")
    msg_type = obj.get("type")
    sender = obj.get("from")
    to = obj.get("to")
    body = obj.get("body", {})
    if not isinstance(sender, str) or not sender or len(sender.encode()) > MAX_ADDRESS_BYTES:
        raise InvalidMessage(400, _field_problem("from", sender, "a non-empty address"), obj)
    problem = spelling_problem(sender)
    if problem is not None:
        raise InvalidMessage(400, f"'from': {problem}", obj)
    if isinstance(msg_id, bool) or not isinstance(msg_id, str | int):
        raise InvalidMessage(400, _field_problem("id", msg_id, _ID_EXPECTED), obj)
    if isinstance(msg_id, int) and not -MAX_ID_NUMBER <= msg_id <= MAX_ID_NUMBER:
        raise InvalidMessage(400, f"'id' must be {_ID_EXPECTED}", obj)
    if isinstance(msg_id, str) and len(msg_id.encode()) > MAX_ID_BYTES:
        raise InvalidMessage(400, f"'id' is longer than {MAX_ID_BYTES} bytes", obj)
    if not isinstance(msg_type, str) or not msg_type or len(msg_type) > MAX_TYPE_LENGTH:
        raise InvalidMessage(
            400,
            _field_problem("type", msg_type, f"a string of 1 … {MAX_TYPE_LENGTH} characters"),
            obj,
        )
    if invisible_character(msg_type) is not None:
        raise InvalidMessage(400, "'type' must not hold invisible or control characters", obj)
    targets = addresses(to)
    if not targets or (isinstance(to, list) and len(targets) != len(to)):
        raise InvalidMessage(
            400, _field_problem("to", to, "an address or a non-empty list of addresses"), obj
        )
    if len(targets) > MAX_DESTINATIONS:
        raise InvalidMessage(400, f"'to' names more than {MAX_DESTINATIONS} addresses", obj)
    if any(not t or len(t.encode()) > MAX_ADDRESS_BYTES for t in targets):
        raise InvalidMessage(400, "'to' holds an empty or over-long address", obj)
    for target in targets:
        problem = spelling_problem(target)
        if problem is not None:
            raise InvalidMessage(400, f"'to': {problem}", obj)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise InvalidMessage(400, _field_problem("body", body, "an object"), obj)
    if nesting_exceeds(obj, MAX_NESTING, raw):
        raise InvalidMessage(400, f"a message must not nest deeper than {MAX_NESTING} levels", obj)
    return Message(raw, msg_id, msg_type.lower(), sender, targets, body)


_ID_EXPECTED = f"a string or an integer within ±{MAX_ID_NUMBER}"


def addresses(to: Any) -> tuple[str, ...]:
    """The addresses a `to` field names: one string, or the strings of a list."""
    if isinstance(to, str):
        return (to,)
    if isinstance(to, list):
        return tuple(t for t in to if isinstance(t, str))
    return ()


def reply_origin(partial: Mapping[str, Any]) -> str:
    """Where an answer to a (possibly broken) message comes from: its first destination."""
    targets = addresses(partial.get("to"))
    return targets[0] if targets and targets[0] else ""


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
    }.get(type(value), type(value).__name__)


def _field_problem(name: str, value: Any, expected: str) -> str:
    if value is None:
        return f"missing '{name}' (expected {expected})"
    return f"'{name}' must be {expected}, got {_json_kind(value)}"


def response(
    request_from: str,
    request_to: str,
    request_id: Any,
    code: int,
    *,
    value: Any = None,
    desc: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A reTHINK response: addressed back to the requester, echoing its id exactly."""
    body: dict[str, Any] = dict(extra) if extra else {}
    body["code"] = code
    if value is not None:
        body["value"] = value
    if desc is not None:
        body["desc"] = desc
    return dumps(
        {"id": request_id, "type": "response", "from": request_to, "to": request_from, "body": body}
    )


def answer(
    message: Message,
    code: int,
    *,
    value: Any = None,
    desc: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The answer to ``message``, from its first destination."""
    return response(
        message.from_,
        message.to_first,
        message.id,
        code,
        value=value,
        desc=desc,
        extra=extra,
    )


def with_body_fields(raw: str, fields: Mapping[str, Any]) -> str:
    """``raw`` with ``fields`` set in its body (added last, so they win over any the sender put
    there: JSON parsers keep the last of repeated keys). Everything else stays byte for byte:
    the text is not parsed and written again, the fields are spliced in. ``raw`` must be a
    JSON object (the ingress has parsed it)."""
    added = ",".join(f"{dumps(name)}:{dumps(value)}" for name, value in fields.items())
    body, end = _body_span(raw)
    if body is None:
        return f'{raw[:end]},"body":{{{added}}}{raw[end:]}'
    start, stop = body
    if raw[start] != "{":  # null (check_header reads it as an empty body)
        return f"{raw[:start]}{{{added}}}{raw[stop:]}"
    close = stop - 1
    inside = raw[start + 1 : close].strip()
    return f"{raw[:close]}{',' if inside else ''}{added}{raw[close:]}"


_WS = " \t\r\n"


def _skip(text: str, i: int) -> int:
    while text[i] in _WS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int:
    i += 1
    while True:
        c = text[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        else:
            i += 1


def _value_end(text: str, i: int) -> int:
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        depth = 0
        while True:
            c = text[i]
            if c == '"':
                i = _string_end(text, i)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
    while i < len(text) and text[i] not in ",}]" + _WS:
        i += 1
    return i


def body_bytes(raw: str) -> int:
    """Bytes of the text of the top-level ``body`` of ``raw`` (a JSON object), as written: read
    from the text, without parsing it (0 when there is none)."""
    body, _end = _body_span(raw)
    return 0 if body is None else len(raw[body[0] : body[1]].encode())


def _body_span(raw: str) -> tuple[tuple[int, int] | None, int]:
    """(start, end) of the top-level `body` value (the last one, as parsers read it), and the
    index of the object's closing brace."""
    i = _skip(raw, 0) + 1
    body: tuple[int, int] | None = None
    while True:
        i = _skip(raw, i)
        if raw[i] == "}":
            return body, i
        key_end = _string_end(raw, i)
        key = raw[i:key_end]
        i = _skip(raw, _skip(raw, key_end) + 1)  # past the colon
        end = _value_end(raw, i)
        if key == '"body"' or (key.startswith('"') and "\\" in key and orjson.loads(key) == "body"):
            body = (i, end)
        i = _skip(raw, end)
        if raw[i] == ",":
            i += 1


def control_error(code: int, reason: str, cmd: str = "error") -> str:
    """An answer to a frame that cannot be answered as a reTHINK message (no usable header)."""
    return dumps({"cmd": cmd, "response": code, "desc": reason})

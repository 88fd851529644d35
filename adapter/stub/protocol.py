"""The stub protocol's frames (docs/stub-protocol.md): handshakes, numbered messages, acks.

Every number and name a stub sends in a control frame is checked here, where it enters, against
the bounds docs/stub-protocol.md states ("Bounds"): what passes can be written into a Matrix
event and into the node's database as it is.
"""

from __future__ import annotations

import re
from typing import Any

from ..carrier import MAX_NUMBER
from ..envelope import dumps
from ..sessions.session import AckHello

ACK_VERSION = 1
_STUB_ID = re.compile(r"^[A-Za-z0-9_-]{8,32}$")
# Sequence and delivery numbers travel in lane events as JSON integers: at most MAX_NUMBER.
_DIGITS = re.compile(r"[0-9]{1,16}")


class BadHello(Exception):
    """An acknowledged-protocol offer the node cannot accept as it is."""


class BadFrame(Exception):
    """A control or numbered frame outside the protocol's bounds (answer 400)."""


def wire_number(value: Any) -> int | None:
    """``value`` as a sequence or delivery number (an integer in 0 … 2^53 - 1), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_NUMBER:
        return value
    return None


def parse_hello(offer: Any) -> AckHello | None:
    """The stub's offer to speak the acknowledged protocol (``data.ack`` of a v1 connect, or the
    v2 query's fields); None when it offers none or a version this node does not speak."""
    if offer is None:
        return None
    if not isinstance(offer, dict):
        raise BadHello("ack must be an object")
    if offer.get("v") != ACK_VERSION:
        return None
    stub = offer.get("stub")
    if not isinstance(stub, str) or not _STUB_ID.match(stub):
        raise BadHello("ack.stub must be 8-32 characters of A-Z a-z 0-9 _ -")
    received = wire_number(offer.get("received", 0))
    if received is None:
        raise BadHello(f"ack.received must be a delivery number (an integer 0 … {MAX_NUMBER})")
    return AckHello(stub, received)


def hello_from_query(query: Any) -> AckHello | None:
    if query.get("ack") != "1":
        return None
    received = query.get("received", "0")
    return parse_hello(
        {
            "v": ACK_VERSION,
            "stub": query.get("stub"),
            "received": int(received) if _DIGITS.fullmatch(received) else -1,
        }
    )


def split_numbered(frame: str) -> tuple[int, str] | None:
    """``[<seq>,<message>]`` → (seq, the message's exact text); None if the frame is not one.
    The message is taken as it was written, so it travels byte for byte. Raises BadFrame for
    a numbered frame whose number is out of bounds (1 … 2^53 - 1)."""
    comma = frame.find(",", 1, 24)
    if comma < 0 or not frame.endswith("]"):
        return None
    number = frame[1:comma].strip()
    if not number.isascii() or not number.isdigit():
        return None
    seq = int(number)
    if not 0 < seq <= MAX_NUMBER:
        raise BadFrame(f"a message's sequence number must be an integer 1 … {MAX_NUMBER}")
    return seq, frame[comma + 1 : -1]


def ack_frame(seq: int) -> str:
    return f'{{"cmd":"ack","seq":{seq}}}'


def connect_answer(
    runtime_url: str, resumed: bool, token: str, domain: str, acked: int | None
) -> str:
    data: dict[str, Any] = {
        "runtimeURL": runtime_url,
        "session": "resumed" if resumed else "new",
        "token": token,
        "domain": domain,
    }
    if acked is not None:
        data["ack"] = {"v": ACK_VERSION, "seq": acked}
    return dumps({"cmd": "connect", "response": 200, "data": data})

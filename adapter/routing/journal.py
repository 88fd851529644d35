"""The journal: what the node answered itself, recorded in the journal room.

MN-service requests are answered at once, without waiting for Matrix; the request, the answer and
the node's own error answers are appended here afterwards, batched like any other traffic, so the
homeserver's history still holds every request the node handled. Delivery receipts (how many
runtimes each routed message reached) go here too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from ..identity.model import Identity
from .stream import BatchStream

REQUEST_CUT = 4096
# A service request longer than this is kept as its header and its size: the journal holds
# what the node did, and one client sending megabyte requests (to a service that does not
# exist, say) would otherwise fill the journal room, and the homeserver's media store under it,
# at the rate it sends. A subscription to a thousand streams fits.
SERVICE_REQUEST_KEPT = 64 * 1024
HEADER_FIELDS = ("id", "type", "from", "to")


def kept_request(request: str) -> str:
    """What the journal keeps of a service request: all of it up to SERVICE_REQUEST_KEPT
    characters; past that, its header with the body replaced by ``{"cut": <characters>}``, a
    JSON object still (the export reads the service and the operation from it)."""
    if len(request) <= SERVICE_REQUEST_KEPT:
        return request
    try:
        parsed = orjson.loads(request)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return request[:REQUEST_CUT]
    header = {key: parsed[key] for key in HEADER_FIELDS if key in parsed}
    kept = orjson.dumps({**header, "body": {"cut": len(request)}}).decode()
    return kept if len(kept) <= SERVICE_REQUEST_KEPT else request[:REQUEST_CUT]


def _now_ms() -> int:
    return int(time.time() * 1000)


class Journal:
    def __init__(self, stream: BatchStream[bytes] | None) -> None:
        # None disables journalling (routing.journal: false).
        self._stream = stream

    def _push(self, entry: dict[str, Any]) -> None:
        if self._stream is not None:
            self._stream.push(orjson.dumps(entry))

    def service(
        self, runtime_url: str, request: str, response: str, affected: int | None = None
    ) -> None:
        entry: dict[str, Any] = {
            "kind": "service",
            "runtime": runtime_url,
            "ts": _now_ms(),
            "request": kept_request(request),
            "response": response,
        }
        if affected is not None:
            entry["affected"] = affected  # addresses the request changed (see ServiceReply)
        self._push(entry)

    def rejected(self, runtime_url: str, request: str | None, response: str) -> None:
        if request is not None and len(request) > REQUEST_CUT:
            request = request[:REQUEST_CUT]
        self._push(
            {
                "kind": "rejected",
                "runtime": runtime_url,
                "ts": _now_ms(),
                "request": request,
                "response": response,
            }
        )

    def session(self, runtime_url: str, event: str, identity: Identity | None) -> None:
        """A runtime connected (``event``: its session is new or resumed), and who it proved to
        be: the audit trail of who acted as which runtime."""
        self._push(
            {
                "kind": "session",
                "runtime": runtime_url,
                "ts": _now_ms(),
                "event": event,
                "identity": identity.user_id if identity is not None else None,
                "method": identity.method if identity is not None else "anonymous",
            }
        )

    def policy(self, action: str, rule_id: Any, rule: Any) -> None:
        """An operator changed the policy rules (through the policy API)."""
        self._push(
            {"kind": "policy", "ts": _now_ms(), "action": action, "rule_id": rule_id, "rule": rule}
        )

    def receipt(self, event_id: str, delivered: Sequence[int]) -> None:
        self._push(
            {"kind": "receipt", "ts": _now_ms(), "event_id": event_id, "delivered": list(delivered)}
        )

    async def room(self, timeout: float | None = None) -> bool:
        """Wait while the journal holds its most (the homeserver away or far behind), at most
        ``timeout`` seconds; whether there is room now. The stub endpoint waits here before it
        reads a runtime's next frame, so what took effect is always recorded (entries are
        never dropped) and the node's memory stays bounded (the senders wait instead)."""
        if self._stream is None or self._stream.has_room_for(1):
            return True
        return await self._stream.wait_for_room(1, timeout)

    @property
    def stream(self) -> BatchStream[bytes] | None:
        return self._stream

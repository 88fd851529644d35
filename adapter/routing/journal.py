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

from .stream import BatchStream

REQUEST_CUT = 4096


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
            "request": request,
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

    def receipt(self, event_id: str, delivered: Sequence[int]) -> None:
        self._push(
            {"kind": "receipt", "ts": _now_ms(), "event_id": event_id, "delivered": list(delivered)}
        )

    @property
    def stream(self) -> BatchStream[bytes] | None:
        return self._stream

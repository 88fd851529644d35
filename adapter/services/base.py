"""What every MN service shares: the reply it produces and the requester it serves."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..envelope import Message
from ..identity.model import Identity


@dataclass(frozen=True, slots=True)
class ServiceReply:
    """The answer an MN service gives; the node turns it into a reTHINK response."""

    code: int
    value: Any = None
    desc: str | None = None
    # Fields a back end puts at the top of the response body beside code/value/desc (the global
    # registry's `Code`/`Value`, which the runtime's GraphConnector reads there).
    extra: Mapping[str, Any] | None = None
    # For the journal, not the runtime: how many addresses the request allocated, removed,
    # subscribed or unsubscribed (a delete by allocation key names one key for a whole block).
    affected: int | None = None
    # What the request caused that others hear of (a registration's status publication): run
    # once the answer is on its way, so that the requester hears the answer first.
    then: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True)
class Requester:
    """The runtime session a request arrived from."""

    session_id: int
    runtime_url: str
    # What the runtime proved at its handshake; None when the node did not check.
    identity: Identity | None = None
    # The request's own name when its stub numbers its messages (``<origin>#<seq>``): the same
    # for the request sent again after a restart of the node, which may have run it already.
    request: str | None = None
    # The runtime credential's claim on its runtimeURL (what its registrations are owned by).
    claim: str | None = None


class MnService(Protocol):
    async def handle(self, message: Message, requester: Requester) -> ServiceReply: ...

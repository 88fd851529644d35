"""Address allocation: hyperty and data-object addresses for runtimes (phase 1 and phase 2).

`create` allocates `number` addresses (default 1) and answers `{allocated: [...]}`; the hyperty
endpoint always allocates `hyperty://`, the object endpoint the requested scheme, the phase-2
endpoint the requested scheme or `hyperty`. An `allocationKey` names the block, so a later
`delete` with `resource: <key>` removes it. `delete` also takes addresses in `resource` or
`childrenResources` (nested lists are flattened). Only the requester's own allocations are
removed: naming another runtime's address is refused (403), a delete naming nothing is a 400,
naming unknown things a 200. A session holds at most its quota of addresses (429 beyond).

A numbered request (the acknowledged protocol) may come again after the node was killed between
allocating and acknowledging it. Its addresses are therefore derived from the request's name
with a keyed hash (unguessable without the node's secret, as random ones): run again, the same
request names the same addresses, finds them already its session's, and gets the same answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..access import AccessMonitor, Principal, Refusal
from ..addresses import RESERVED_SCHEMES, scheme_of
from ..bounds import Bound, SessionShares
from ..envelope import MAX_ADDRESS_BYTES, Message
from ..routing_table import RoutingTable
from ..storage.clock import utcnow
from ..storage.database import unavailable as database_unavailable
from ..storage.routes import RouteStore
from .base import Requester, ServiceReply

HYPERTY_ENDPOINT = "hyperty-address-allocation"
OBJECT_ENDPOINT = "object-address-allocation"
PHASE2_ENDPOINT = "address-allocation"
ENDPOINTS = (HYPERTY_ENDPOINT, OBJECT_ENDPOINT, PHASE2_ENDPOINT)

_SCHEME = re.compile(r"^[a-z][a-z0-9+.\-]{0,31}$")
MAX_NESTING = 8


class AllocationService:
    def __init__(
        self,
        domain: str,
        table: RoutingTable,
        monitor: AccessMonitor,
        store: RouteStore,
        max_block: int = 1000,
        quota: int = 100_000,
        on_quota: Callable[[str], None] = lambda _name: None,
        released_kept_seconds: float = 25 * 3600,
        bound: Bound | None = None,
        client_of: Callable[[int], str] = lambda _session: "",
    ) -> None:
        self._domain = domain
        # Addresses per client and in total (beside the per-session quota): taken before the
        # durable write, in one step with the check; given back as addresses go (``let_go``).
        # What each session took, for which client: given back when its addresses go (what
        # a start reads back is counted under its session's client: ``restore``).
        self._shares = SessionShares(
            bound if bound is not None else Bound("addresses", 1 << 62, 1 << 62), client_of
        )
        # How long an address its runtime let go stays out of reach (as long as the registry
        # may still name it): nobody claims it in that time.
        self._released_kept = timedelta(seconds=released_kept_seconds)
        # Claims are rare (a runtime's first use of an address it made); one at a time keeps
        # two of them from taking the same address between the checks and the write.
        self._claiming = asyncio.Lock()
        self._table = table
        self._monitor = monitor
        self._store = store
        self._max_block = max_block
        self._quota = quota
        self._on_quota = on_quota
        # Keys the addresses of numbered requests; the node sets one kept in its database, so
        # that a request run again after a restart names the same addresses.
        self.secret = secrets.token_bytes(32)

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        endpoint = message.to_first.rsplit("/", 1)[-1]
        if message.type == "create":
            return await self._create(endpoint, message.body, requester)
        if message.type == "delete":
            return await self._delete(message.body, requester)
        return ServiceReply(405, desc=f"address allocation does not support '{message.type}'")

    async def claim(self, who: Principal, address: str) -> Refusal | None:
        """Allocate to ``who`` an address it made itself (access.py, "Claim"), unless it was
        allocated before and let go within the time the registry may name it, or ``who`` holds
        its quota of addresses already. None when it is ``who``'s now."""
        async with self._claiming:
            if self._table.allocated_to(who.session_id, address):
                return None
            if self._monitor.holder(address) is not None:
                return Refusal(403, f"'{address}' is in use by another runtime")
            held = self._table.holdings(who.session_id).addresses
            if held + 1 > self._quota:
                self._on_quota("addresses")
                return Refusal(
                    429, f"a runtime may hold at most {self._quota} addresses ({held} held)"
                )
            bounded = self._take(who.session_id, 1)
            if bounded is not None:
                return bounded
            try:
                if await self._store.released(address, utcnow() - self._released_kept):
                    self._give_back(who.session_id, 1)
                    return Refusal(
                        403,
                        f"'{address}' was let go by the runtime it was allocated to: it is not "
                        "taken up again while others may still know it",
                    )
                await self._store.add_allocations(
                    who.session_id, [address], scheme_of(address), None
                )
            except Exception as exc:
                self._give_back(who.session_id, 1)
                if database_unavailable(exc):
                    raise
                # Another process of the domain took it a moment ago (the unique address).
                return Refusal(403, f"'{address}' is in use by another runtime")
            self._table.add_allocations(who.session_id, [address], None)
            return None

    def _take(self, session_id: int, amount: int) -> Refusal | None:
        refused = self._shares.take(session_id, amount)
        return Refusal(refused.code, refused.reason) if refused is not None else None

    def _give_back(self, session_id: int, amount: int) -> None:
        self._shares.give(session_id, amount)

    def restore(self) -> None:
        """Count the addresses read back at a start under their sessions' clients."""
        for session_id in self._table.sessions():
            self._shares.force(session_id, self._table.holdings(session_id).addresses)

    def let_go(self, session_id: int, amount: int) -> None:
        """``amount`` of the session's addresses went (deleted, or its session ended)."""
        self._give_back(session_id, amount)

    def _scheme(self, endpoint: str, body: dict[str, Any]) -> str | ServiceReply:
        if endpoint == HYPERTY_ENDPOINT:
            return "hyperty"
        value = body.get("value")
        nested = value.get("scheme") if isinstance(value, dict) else None
        scheme = body.get("scheme", nested)
        if scheme is None:
            if endpoint == OBJECT_ENDPOINT:
                return ServiceReply(400, desc="object allocation needs body.scheme")
            return "hyperty"
        if not isinstance(scheme, str) or not _SCHEME.match(scheme):
            return ServiceReply(400, desc=f"body.scheme {scheme!r} is not a URL scheme")
        if scheme in RESERVED_SCHEMES:
            # Runtimes, stubs, users and the node's services are not data objects: an address
            # of theirs allocated to a runtime would speak for them.
            return ServiceReply(403, desc=f"{scheme}:// addresses are not allocated to runtimes")
        return scheme

    async def _create(self, endpoint: str, body: dict[str, Any], who: Requester) -> ServiceReply:
        scheme = self._scheme(endpoint, body)
        if isinstance(scheme, ServiceReply):
            return scheme
        value = body.get("value", {})
        if value is None:
            value = {}
        if not isinstance(value, dict):
            return ServiceReply(400, desc="body.value must be an object")
        number = value.get("number", 1)
        if isinstance(number, bool) or not isinstance(number, int):
            return ServiceReply(400, desc="body.value.number must be an integer")
        if not 1 <= number <= self._max_block:
            return ServiceReply(400, desc=f"body.value.number must be 1..{self._max_block}")
        key = value.get("allocationKey")
        if key is not None and (
            not isinstance(key, str) or not key or len(key.encode()) > MAX_ADDRESS_BYTES
        ):
            return ServiceReply(400, desc="body.value.allocationKey must be a non-empty string")
        addresses = [f"{scheme}://{self._domain}/{self._name(who, i)}" for i in range(number)]
        if who.request is not None and self._table.allocated_to(who.session_id, addresses[0]):
            # This very request ran before the node's restart: same answer, nothing more held.
            return ServiceReply(200, value={"allocated": addresses}, affected=0)
        held = self._table.holdings(who.session_id).addresses
        if held + number > self._quota:
            self._on_quota("addresses")
            return ServiceReply(
                429, desc=f"a runtime may hold at most {self._quota} addresses ({held} held)"
            )
        bounded = self._take(who.session_id, number)
        if bounded is not None:
            return ServiceReply(bounded.code, desc=bounded.reason)
        # Durable before the runtime hears of it.
        try:
            await self._store.add_allocations(who.session_id, addresses, scheme, key)
        except BaseException:
            self._give_back(who.session_id, number)
            raise
        self._table.add_allocations(who.session_id, addresses, key)
        return ServiceReply(200, value={"allocated": addresses}, affected=len(addresses))

    def _name(self, who: Requester, index: int) -> uuid.UUID:
        if who.request is None:
            return uuid.uuid4()
        digest = hmac.new(self.secret, f"{who.request}/{index}".encode(), hashlib.sha256)
        return uuid.UUID(bytes=digest.digest()[:16], version=4)

    async def _delete(self, body: dict[str, Any], who: Requester) -> ServiceReply:
        resource = body.get("resource")
        children = body.get("childrenResources")
        if not resource and not children:
            return ServiceReply(400, desc="delete needs body.resource or body.childrenResources")
        targets: set[str] = set()
        for item in flatten_addresses([resource, children]):
            block = self._table.block(who.session_id, item)
            if not block:
                refused = self._monitor.release_allocation(who, item)
                if refused is not None:
                    return ServiceReply(refused.code, desc=refused.reason)
            targets.update(block or (item,))
        removed = self._table.remove_allocations(who.session_id, targets)
        await self._store.remove_allocations(who.session_id, removed)
        return ServiceReply(200, affected=len(removed))


def flatten_addresses(value: Any, depth: int = 0) -> list[str]:
    """Strings found in arbitrarily nested lists (bounded: a hostile nesting is cut off)."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and depth < MAX_NESTING:
        return [s for item in value for s in flatten_addresses(item, depth + 1)]
    return []

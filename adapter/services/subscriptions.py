"""The subscription manager (`domain://msg-node.<domain>/sm`).

Three body forms occur and all are accepted:
- `{resources: [...], source}` (what current runtimes send);
- `{subscribe: [...]}` / `{unsubscribe: [...]}` (a single string too);
- `{resource, childrenResources}` (phase-1 spec): the object itself, its change stream
  `<object>/changes` and each `<object>/children/<name>` (a child given as a full URL is used as
  it is).

The subscriber is the requester. `body.source` may name one of the requester's own addresses
(a hyperty subscribing through its runtime); naming an address of another runtime is refused
(403): nobody subscribes or unsubscribes for someone else. Addresses match exactly. A session
holds at most its quota of subscriptions (429 beyond); one client, over all its sessions, and
the node in total hold at most their bounds (429 / 503 beyond, taken before the durable write in
one step with the check, given back as subscriptions end).

Who may subscribe to what is the reference monitor's rule (access.py, "Subscribe to"): data-object
streams, registration status, the runtime's own addresses (and its objects' request channels
`<object>/subscription`), and stubs' URLs; never another runtime's address. A request naming
anything else is refused 403 as a whole; the phase-1 form's object itself is included only when
the requester may subscribe to it. The message gate (routing/policy.py) then decides on each
address (the operator's rules see a `subscribe` from the requester to that address).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..access import AccessMonitor, Claim, Refusal, no_claims
from ..addresses import spelling_problem
from ..bounds import Bound, SessionShares
from ..envelope import MAX_ADDRESS_BYTES, Message
from ..routing_table import RoutingTable
from ..storage.routes import RouteStore
from .base import Requester, ServiceReply

MAX_RESOURCES = 1000


class SubscriptionService:
    def __init__(
        self,
        table: RoutingTable,
        monitor: AccessMonitor,
        store: RouteStore,
        quota: int = 100_000,
        on_quota: Callable[[str], None] = lambda _name: None,
        on_change: Callable[[str, list[str], str], Awaitable[str | None]] | None = None,
        policy: Callable[[Requester, str], str | None] | None = None,
        claim: Callable[[Requester, str], Awaitable[Refusal | None]] = no_claims,
        bound: Bound | None = None,
        client_of: Callable[[int], str] = lambda _session: "",
    ) -> None:
        # Subscriptions per client and in total; what a session took goes back as its
        # subscriptions end (the table tells, also when the session is released).
        self.shares = SessionShares(
            bound if bound is not None else Bound("subscriptions", 1 << 62, 1 << 62), client_of
        )
        table.on_subscriptions_removed = self.shares.give
        self._table = table
        self._monitor = monitor
        # Allocates a self-made address a runtime subscribes to (access.py, "Claim").
        self._claim = claim
        self._store = store
        self._quota = quota
        self._on_quota = on_quota
        # Told of every (un)subscription made, with the runtime that made it, e.g. so that other
        # domains' nodes are asked for what is published to their streams; a reason it gives
        # undoes a subscription (a peer refused it).
        self._on_change = on_change
        # The operator's rules on one subscription: a reason to refuse it, or None.
        self._policy = policy

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        if message.type not in ("subscribe", "unsubscribe"):
            return ServiceReply(
                405, desc=f"the subscription manager does not support '{message.type}'"
            )
        subscriber = requester.session_id
        addresses = requested_resources(
            message.type,
            message.body,
            lambda a: not isinstance(self._monitor.subscribe_to(requester, a), Refusal),
        )
        if isinstance(addresses, ServiceReply):
            return addresses
        source = message.body.get("source")
        if isinstance(source, str) and source:
            holder = self._monitor.holder(source)
            if holder is not None and holder != subscriber:
                return ServiceReply(403, desc=f"source {source!r} belongs to another runtime")
        if message.type == "subscribe":
            refusal = await self._refusal(requester, addresses)
            if refusal is not None:
                return ServiceReply(refusal.code, desc=refusal.reason)
            held = self._table.holdings(subscriber).subscriptions
            if held + len(addresses) > self._quota:
                self._on_quota("subscriptions")
                return ServiceReply(
                    429,
                    desc=f"a runtime may hold at most {self._quota} subscriptions ({held} held)",
                )
            fresh = sum(
                1
                for address in addresses
                if subscriber not in (self._table.subscribers(address) or ())
            )
            bounded = self.shares.take(subscriber, fresh)
            if bounded is not None:
                return ServiceReply(bounded.code, desc=bounded.reason)
            try:
                await self._store.subscribe(subscriber, addresses)
            except BaseException:
                self.shares.give(subscriber, fresh)
                raise
            # A request of the same session that ran meanwhile may have added some of them:
            # what was taken for those goes back.
            self.shares.give(subscriber, fresh - self._table.subscribe(subscriber, addresses))
        else:
            await self._store.unsubscribe(subscriber, addresses)
            self._table.unsubscribe(subscriber, addresses)
        if self._on_change is not None:
            changed = await self._on_change(message.type, addresses, requester.runtime_url)
            if changed is not None and message.type == "subscribe":
                await self._store.unsubscribe(subscriber, addresses)
                self._table.unsubscribe(subscriber, addresses)
                return ServiceReply(403, desc=changed)
        return ServiceReply(200, affected=len(addresses))

    def restore(self) -> None:
        """Count the subscriptions read back at a start under their sessions' clients."""
        for session_id in self._table.sessions():
            self.shares.force(session_id, self._table.holdings(session_id).subscriptions)

    async def _refusal(self, requester: Requester, addresses: list[str]) -> Refusal | None:
        """Why the requester may not subscribe to one of ``addresses``, with its code (403;
        a claimed address beyond a bound keeps the bound's 429 or 503)."""
        for address in addresses:
            verdict = self._monitor.subscribe_to(requester, address)
            if isinstance(verdict, Claim):
                verdict = await self._claim(requester, verdict.address)
            if verdict is not None:
                return verdict
            if self._policy is not None:
                denied = self._policy(requester, address)
                if denied is not None:
                    return Refusal(403, denied)
        return None


def requested_resources(
    kind: str, body: dict[str, Any], may_subscribe: Callable[[str], bool] = lambda _a: True
) -> list[str] | ServiceReply:
    """The addresses a (un)subscribe body names, or the 400 answer explaining why none.
    ``may_subscribe`` says whether the phase-1 form's object itself is included."""
    found: list[Any]
    if "resources" in body:
        found = _as_list(body["resources"])
    elif kind in body or "subscribe" in body:
        # Some runtimes send `subscribe` in an unsubscribe request; accept it.
        found = _as_list(body.get(kind, body.get("subscribe")))
    elif "resource" in body:
        resource = body["resource"]
        if not isinstance(resource, str) or not resource:
            return ServiceReply(400, desc="body.resource must be an address")
        found = [resource] if kind != "subscribe" or may_subscribe(resource) else []
        found.append(f"{resource}/changes")
        for child in _as_list(body.get("childrenResources") or []):
            if isinstance(child, str) and child:
                found.append(child if "://" in child else f"{resource}/children/{child}")
    else:
        return ServiceReply(400, desc=f"{kind} needs body.resources, body.{kind} or body.resource")
    if not found:
        return ServiceReply(400, desc=f"nothing to {kind}: the resource list is empty")
    if len(found) > MAX_RESOURCES:
        return ServiceReply(400, desc=f"at most {MAX_RESOURCES} resources per request")
    bad = [
        r for r in found if not isinstance(r, str) or not r or len(r.encode()) > MAX_ADDRESS_BYTES
    ]
    if bad:
        return ServiceReply(400, desc="every resource must be a non-empty address string")
    for resource in found:
        problem = spelling_problem(resource)
        if problem is not None:
            return ServiceReply(400, desc=problem)
    return list(dict.fromkeys(found))


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if value is None:
        return []
    return [value]

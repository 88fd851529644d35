"""A resource the node bounds per client and in total (sessions, addresses, sockets, bytes).

``take`` decides and takes in one step, with no await in between: two requests of the same
client racing each other cannot both pass a check made before either took anything. What is
taken is given back with ``give`` when the resource is let go. A refusal carries the code the
client is answered with: 429 when the client holds its share (it can let something go), 503
when the node as a whole is full (nothing the client does helps; it retries later). Every
refusal is counted (``rethink_mn_bound_refusals_total{resource, scope}``).

Client keys come from clients.py. The empty key is a holder the node knows no client of (a
session restored from the database after a restart): it counts towards the total only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

OnRefused = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class BoundRefused:
    code: int
    reason: str
    scope: str  # "client" or "total"


class Bound:
    def __init__(
        self,
        resource: str,
        per_client: int,
        total: int,
        on_refused: OnRefused = lambda _resource, _scope: None,
        unit: str = "",
    ) -> None:
        self.resource = resource
        self.per_client = per_client
        self.total = total
        self._unit = unit or resource
        self._on_refused = on_refused
        self._held: dict[str, int] = {}
        self._taken = 0

    @property
    def taken(self) -> int:
        return self._taken

    def held(self, client: str) -> int:
        return self._held.get(client, 0)

    def refusal(self, client: str, amount: int = 1) -> BoundRefused | None:
        """Why ``amount`` more for ``client`` would be refused; None if it fits."""
        if client and self._held.get(client, 0) + amount > self.per_client:
            return BoundRefused(
                429,
                f"one client may hold at most {self.per_client} {self._unit} "
                f"({self._held.get(client, 0)} held)",
                "client",
            )
        if self._taken + amount > self.total:
            return BoundRefused(
                503, f"the node holds its most {self._unit} ({self.total}); retry later", "total"
            )
        return None

    def take(self, client: str, amount: int = 1) -> BoundRefused | None:
        """Take ``amount`` for ``client`` unless that exceeds a bound (then counted, and
        nothing taken)."""
        refused = self.refusal(client, amount)
        if refused is not None:
            self._on_refused(self.resource, refused.scope)
            return refused
        self.force(client, amount)
        return None

    def force(self, client: str, amount: int = 1) -> None:
        """Count ``amount`` for ``client`` without a check: what the node already holds (read
        back at a start, handed over from another node process)."""
        if amount <= 0:
            return
        self._taken += amount
        if client:
            self._held[client] = self._held.get(client, 0) + amount

    def give(self, client: str, amount: int = 1) -> None:
        if amount <= 0:
            return
        self._taken = max(0, self._taken - amount)
        if client:
            left = self._held.get(client, 0) - amount
            if left > 0:
                self._held[client] = left
            else:
                self._held.pop(client, None)


class SessionShares:
    """What each session took of a ``Bound``, and under which client: what goes is given back
    to the client that took it, and never more than the session took (what the node read back
    at a start and was not counted gives nothing back). Subscriptions, registry entries and
    addresses are held by sessions but bounded per client."""

    def __init__(self, bound: Bound, client_of: Callable[[int], str]) -> None:
        self.bound = bound
        self._client_of = client_of
        self._taken: dict[int, tuple[str, int]] = {}

    def taken(self, session_id: int) -> int:
        taken = self._taken.get(session_id)
        return taken[1] if taken is not None else 0

    def take(self, session_id: int, amount: int = 1) -> BoundRefused | None:
        """Take ``amount`` for the session's client in one step with the check (nothing
        taken when refused; the refusal is counted)."""
        if amount <= 0:
            return None
        client = self._client_of(session_id)
        refused = self.bound.take(client, amount)
        if refused is None:
            self._note(session_id, client, amount)
        return refused

    def force(self, session_id: int, amount: int) -> None:
        """Count what the session holds already (read back at a start) without a check."""
        if amount <= 0:
            return
        client = self._client_of(session_id)
        self.bound.force(client, amount)
        self._note(session_id, client, amount)

    def give(self, session_id: int, amount: int = 1) -> None:
        taken = self._taken.get(session_id)
        if taken is None or amount <= 0:
            return
        client, held = taken
        amount = min(amount, held)
        self.bound.give(client, amount)
        if held > amount:
            self._taken[session_id] = (client, held - amount)
        else:
            del self._taken[session_id]

    def give_all(self, session_id: int) -> None:
        """The session is gone: everything it took goes back."""
        self.give(session_id, self.taken(session_id))

    def _note(self, session_id: int, client: str, amount: int) -> None:
        earlier = self._taken.get(session_id)
        self._taken[session_id] = (client, amount + (earlier[1] if earlier else 0))

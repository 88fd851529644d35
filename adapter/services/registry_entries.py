"""How many entries of the built-in registry each client holds, bounded per client and in total.

An entry is owned by the credential's claim of the runtime that registered it and outlives its
session (until it expires and its grace period ends). A creation takes a place for the
requester's client before the write, in one step with the check (429 beyond the client's share,
503 beyond the node's, counted), and gives it back if the write created nothing (it replaced an
entry of the same runtime, or was refused). Entries leave in the database (the expiry sweep,
a newer registration taking a removed one's place, a verified user's registration evicting
unverified ones): after every sweep, and at a start, the counts are read back from the database
(``recount``), so what went is given back within one sweep interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..bounds import Bound, BoundRefused


class RegistryEntries:
    def __init__(
        self,
        bound: Bound,
        clients_of_claims: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.bound = bound
        # The clients of the claims of the sessions this process holds (consulted for owners
        # it has not seen create anything: entries read back at a start).
        self._clients_of_claims = clients_of_claims
        # Per owner (a claim): its client and how many entries it holds.
        self._owners: dict[str, tuple[str, int]] = {}

    def held(self, claim: str) -> int:
        owner = self._owners.get(claim)
        return owner[1] if owner is not None else 0

    def _client(self, claim: str, client: str) -> str:
        owner = self._owners.get(claim)
        # Its entries stay with the client that made them.
        return owner[0] if owner is not None and owner[0] else client

    def refusal(self, claim: str, client: str) -> BoundRefused | None:
        """Why one more entry of ``claim`` would be refused (nothing taken or counted)."""
        return self.bound.refusal(self._client(claim, client))

    def take(self, claim: str, client: str) -> BoundRefused | None:
        """A place for one more entry of ``claim`` (a runtime of ``client``), or the refusal
        (counted)."""
        owner = self._owners.get(claim)
        client = self._client(claim, client)
        refused = self.bound.take(client)
        if refused is None:
            self._owners[claim] = (client, (owner[1] if owner is not None else 0) + 1)
        return refused

    def give(self, claim: str) -> None:
        """The place taken for ``claim`` was not used (the write created nothing)."""
        owner = self._owners.get(claim)
        if owner is None:
            return
        client, held = owner
        self.bound.give(client)
        if held > 1:
            self._owners[claim] = (client, held - 1)
        else:
            del self._owners[claim]

    def recount(self, counts: Mapping[str, int]) -> None:
        """What each owner holds as the database has it now (no await since it was read)."""
        unknown = [claim for claim in counts if claim not in self._owners]
        found = self._clients_of_claims() if unknown else {}
        for client, held in self._owners.values():
            self.bound.give(client, held)
        owners: dict[str, tuple[str, int]] = {}
        for claim, held in counts.items():
            known = self._owners.get(claim)
            client = known[0] if known is not None else found.get(claim, "")
            self.bound.force(client, held)
            owners[claim] = (client, held)
        self._owners = owners

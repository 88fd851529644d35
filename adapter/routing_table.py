"""Who receives a message: the in-memory routing table.

Built from the database at start and kept in step by the services that change it (allocation,
subscription manager, sessions), so deciding a destination never waits for the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .envelope import is_stream_address

REGISTRATION_SUFFIX = "/registration"


@dataclass(frozen=True, slots=True)
class Destinations:
    sessions: frozenset[int]
    # Whether anything at all is known about the addresses (an allocated object with no
    # subscribers is known: a publication to it reaches nobody without being an error).
    known: bool
    # The sessions among them the message is addressed to directly (not as subscribers).
    owners: frozenset[int] = frozenset()
    # Other reTHINK domains subscribed to one of the addresses (their nodes fan it out).
    domains: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Holdings:
    addresses: int
    subscriptions: int
    learned: int


class RoutingTable:
    def __init__(self) -> None:
        self._owner: dict[str, int] = {}  # allocated address -> session
        self._keys: dict[tuple[int, str], set[str]] = {}  # (session, allocationKey) -> block
        self._key_of: dict[str, tuple[int, str]] = {}  # address -> its block, when keyed
        self._subscribers: dict[str, set[int]] = {}  # address -> subscribed sessions
        self._learned: dict[str, int] = {}  # `from` seen on a session's connection -> session
        self._runtimes: dict[str, int] = {}  # runtimeURL -> session
        # stream address -> other domain -> its runtimes subscribed to it
        self._remote: dict[str, dict[str, set[str]]] = {}
        self._by_session: dict[int, _SessionEntries] = {}

    # -- reading ------------------------------------------------------------------------------

    def owner(self, address: str) -> int | None:
        """The session an address belongs to: allocated, learned, a runtime URL, or — for a child
        path such as ``<object>/subscription`` — the nearest allocated or runtime parent."""
        exact = self._owner.get(address)
        if exact is None:
            exact = self._learned.get(address)
        if exact is None:
            exact = self._runtimes.get(address)
        if exact is not None:
            return exact
        return self._parent_owner(address)

    def _parent_owner(self, address: str) -> int | None:
        scheme_end = address.find("://")
        floor = scheme_end + 3 if scheme_end >= 0 else 0
        cut = address.rfind("/")
        while cut > floor:
            parent = address[:cut]
            found = self._owner.get(parent)
            if found is None:
                found = self._runtimes.get(parent)
            if found is not None:
                return found
            cut = address.rfind("/", 0, cut)
        return None

    def destinations(self, addresses: Iterable[str], sender: int | None) -> Destinations:
        """Every session a message to ``addresses`` goes to.

        The holder of an address (allocated, learned, its runtime, or the nearest held parent)
        gets it. Subscribers get it when the address is a data-object stream or a registration
        status (``is_stream_address``), or when nobody holds it: a runtime never receives what
        is sent to another runtime's own address, whenever it subscribed to it (DESIGN §10).
        The sender gets its own message back only if it subscribed to the address or holds it
        exactly. A registration's status (``<url>/registration``) reaches its subscribers only.
        Other domains get only streams."""
        found: set[int] = set()
        owners: set[int] = set()
        domains: set[str] = set()
        known = False
        for address in addresses:
            subscribers = self._subscribers.get(address)
            exact = self._owner.get(address)
            if exact is None:
                exact = self._learned.get(address)
            holder = exact
            if holder is None:
                holder = self._runtimes.get(address)
                if holder is None:
                    holder = self._parent_owner(address)
            if subscribers:
                known = True
                if holder is None or is_stream_address(address):
                    found.update(subscribers)
            if self._remote:
                remote = self._remote.get(address)
                if remote and is_stream_address(address):
                    domains.update(remote)  # a domain is listed while any runtime holds it
                    known = True
            if exact is not None:
                owners.add(exact)
                known = True
            elif holder is not None:
                known = True
                # A registration's status goes to its subscribers only (reTHINK's runtimes
                # subscribe to it; a publication the holder did not ask for would arrive in
                # place of an answer it waits for).
                if (holder != sender or (subscribers and sender in subscribers)) and not (
                    address.endswith(REGISTRATION_SUFFIX)
                ):
                    owners.add(holder)
        found.update(owners)
        return Destinations(frozenset(found), known, frozenset(owners), frozenset(domains))

    def allocated_owner(self, address: str) -> int | None:
        """The session an address is allocated to (itself or a parent), ignoring learned routes:
        what the policy engine checks a sender against."""
        exact = self._owner.get(address)
        if exact is None:
            exact = self._runtimes.get(address)
        return exact if exact is not None else self._parent_owner(address)

    def allocated_to(self, session_id: int, address: str) -> bool:
        return self._owner.get(address) == session_id

    def block(self, session_id: int, key: str) -> set[str]:
        return set(self._keys.get((session_id, key), ()))

    def subscriptions_of(self, session_id: int) -> set[str]:
        entry = self._by_session.get(session_id)
        return set(entry.subscriptions) if entry else set()

    def subscriber_count(self, address: str) -> int:
        return len(self._subscribers.get(address, ()))

    def sessions(self) -> list[int]:
        """Every session with something in the table."""
        return list(self._by_session)

    def holdings(self, session_id: int) -> Holdings:
        """How much of the table a session holds (what its quotas limit)."""
        entry = self._by_session.get(session_id)
        if entry is None:
            return Holdings(0, 0, 0)
        return Holdings(len(entry.allocations), len(entry.subscriptions), len(entry.learned))

    def belongs_to(self, session_id: int, address: str) -> bool:
        """Whether ``address`` is the session's: allocated to it (itself or a parent), or
        learned from its connection."""
        if self._learned.get(address) == session_id:
            return True
        return self.allocated_owner(address) == session_id

    # -- changing -----------------------------------------------------------------------------

    def add_runtime(self, session_id: int, runtime_url: str) -> None:
        self._runtimes[runtime_url] = session_id
        self._entry(session_id).runtime_url = runtime_url

    def add_allocations(self, session_id: int, addresses: Iterable[str], key: str | None) -> None:
        entry = self._entry(session_id)
        for address in addresses:
            self._owner[address] = session_id
            entry.allocations.add(address)
            if key is not None:
                self._keys.setdefault((session_id, key), set()).add(address)
                self._key_of[address] = (session_id, key)
                entry.keys.add(key)

    def remove_allocations(self, session_id: int, addresses: Iterable[str]) -> list[str]:
        """Remove the given addresses where they belong to this session; returns those removed."""
        entry = self._by_session.get(session_id)
        removed = []
        for address in addresses:
            if self._owner.get(address) == session_id:
                del self._owner[address]
                removed.append(address)
                if entry is not None:
                    entry.allocations.discard(address)
        for address in removed:
            block_key = self._key_of.pop(address, None)
            if block_key is None:
                continue
            block = self._keys.get(block_key)
            if block is not None:
                block.discard(address)
                if not block:
                    del self._keys[block_key]
                    if entry is not None:
                        entry.keys.discard(block_key[1])
        return removed

    def subscribe(self, session_id: int, addresses: Iterable[str]) -> None:
        entry = self._entry(session_id)
        for address in addresses:
            self._subscribers.setdefault(address, set()).add(session_id)
            entry.subscriptions.add(address)

    def unsubscribe(self, session_id: int, addresses: Iterable[str]) -> None:
        entry = self._by_session.get(session_id)
        for address in addresses:
            subscribers = self._subscribers.get(address)
            if subscribers is not None:
                subscribers.discard(session_id)
                if not subscribers:
                    del self._subscribers[address]
            if entry is not None:
                entry.subscriptions.discard(address)

    def subscribe_domain(self, domain: str, runtime: str, addresses: Iterable[str]) -> None:
        """A runtime of another domain subscribed, through its node, to ``addresses``."""
        for address in addresses:
            self._remote.setdefault(address, {}).setdefault(domain, set()).add(runtime)

    def unsubscribe_domain(
        self, domain: str, runtime: str, addresses: Iterable[str] | None = None
    ) -> None:
        """The runtime's subscriptions to ``addresses`` end (all of them when None)."""
        targets = list(self._remote) if addresses is None else addresses
        for address in targets:
            remote = self._remote.get(address)
            runtimes = remote.get(domain) if remote is not None else None
            if remote is None or runtimes is None:
                continue
            runtimes.discard(runtime)
            if not runtimes:
                del remote[domain]
            if not remote:
                del self._remote[address]

    def has_subscribers(self, address: str) -> bool:
        """Whether any local session subscribes to ``address``."""
        return bool(self._subscribers.get(address))

    def learn(self, session_id: int, address: str) -> bool:
        """Remember that ``address`` speaks through this session. Returns True when that is new
        (the caller persists it). An address allocated to, or learned by, a session is never
        learned by another: it stays the first one's until that session is released."""
        if address in self._owner or address in self._learned:
            return False
        self._learned[address] = session_id
        self._entry(session_id).learned.add(address)
        return True

    def unlearn(self, session_id: int, address: str) -> None:
        if self._learned.get(address) == session_id:
            del self._learned[address]
            self._entry(session_id).learned.discard(address)

    def remove_session(self, session_id: int) -> None:
        entry = self._by_session.pop(session_id, None)
        if entry is None:
            return
        for address in entry.allocations:
            if self._owner.get(address) == session_id:
                del self._owner[address]
                self._key_of.pop(address, None)
        for key in entry.keys:
            self._keys.pop((session_id, key), None)
        for address in entry.subscriptions:
            subscribers = self._subscribers.get(address)
            if subscribers is not None:
                subscribers.discard(session_id)
                if not subscribers:
                    del self._subscribers[address]
        for address in entry.learned:
            if self._learned.get(address) == session_id:
                del self._learned[address]
        if entry.runtime_url is not None and self._runtimes.get(entry.runtime_url) == session_id:
            del self._runtimes[entry.runtime_url]

    def _entry(self, session_id: int) -> _SessionEntries:
        entry = self._by_session.get(session_id)
        if entry is None:
            entry = self._by_session[session_id] = _SessionEntries()
        return entry


class _SessionEntries:
    """What one session contributed to the table, so releasing it is exact."""

    __slots__ = ("allocations", "keys", "learned", "runtime_url", "subscriptions")

    def __init__(self) -> None:
        self.allocations: set[str] = set()
        self.keys: set[str] = set()
        self.subscriptions: set[str] = set()
        self.learned: set[str] = set()
        self.runtime_url: str | None = None

"""The table of holders: who holds, subscribes to and learned each address, in memory.

Built from the database at start and kept in step by the services that change it (allocation,
subscription manager, sessions), so deciding a destination never waits for the database. It
holds facts only: the rules on them (who may speak from, receive at or subscribe to an address)
are the reference monitor's (access.py).

It lives beside ``routing/``, not in it, on purpose: the reference monitor (access.py) and the
services read it, and they sit below ``adapter.routing`` in the package layers (pyproject's
[tool.importlinter]), so inside that package it would be out of their reach.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass


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
        # The same, by who asked: (domain, runtime) -> its addresses, so a request that names a
        # runtime costs what that runtime holds, never a walk of every domain's subscriptions;
        # and per domain, how many it holds (what its quota limits).
        self._remote_of: dict[tuple[str, str], set[str]] = {}
        self._remote_count: dict[str, int] = {}
        self._by_session: dict[int, _SessionEntries] = {}
        # Told how many of a session's allocated addresses went (the node's address bound
        # gives them back: services/allocation.py).
        self.on_allocations_removed: Callable[[int, int], None] = lambda _session, _n: None
        # Told how many of a session's subscriptions went (the node's subscription bound
        # gives them back: services/subscriptions.py).
        self.on_subscriptions_removed: Callable[[int, int], None] = lambda _session, _n: None
        # Told how many of a session's learned routes went (the learned-route bound gives them
        # back: routing/ingress.py).
        self.on_learned_removed: Callable[[int, int], None] = lambda _session, _n: None

    # -- reading ------------------------------------------------------------------------------

    def exact_holder(self, address: str) -> int | None:
        """The session holding exactly ``address`` as an allocation or a learned route."""
        found = self._owner.get(address)
        return found if found is not None else self._learned.get(address)

    def runtime_holder(self, address: str) -> int | None:
        """The session whose runtimeURL ``address`` is, or that holds its nearest allocated or
        runtime parent."""
        found = self._runtimes.get(address)
        return found if found is not None else self.parent_holder(address)

    def allocated_holder(self, address: str) -> int | None:
        """The session ``address`` (or its nearest held parent) was allocated to, or whose
        runtimeURL it is (or is under); learned routes do not count."""
        found = self._owner.get(address)
        if found is None:
            found = self._runtimes.get(address)
        return found if found is not None else self.parent_holder(address)

    def learned_holder(self, address: str) -> int | None:
        return self._learned.get(address)

    def parent_holder(self, address: str) -> int | None:
        """The session holding the nearest allocated or runtime parent of ``address``."""
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

    def subscribers(self, address: str) -> set[int] | None:
        return self._subscribers.get(address)

    def remote_domains(self, address: str) -> Iterable[str]:
        """The other domains whose runtimes subscribed to ``address``."""
        remote = self._remote.get(address) if self._remote else None
        return remote.keys() if remote else ()

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
        if removed:
            self.on_allocations_removed(session_id, len(removed))
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

    def subscribe(self, session_id: int, addresses: Iterable[str]) -> int:
        """The session subscribes to ``addresses``; returns how many it did not hold yet."""
        entry = self._entry(session_id)
        before = len(entry.subscriptions)
        for address in addresses:
            self._subscribers.setdefault(address, set()).add(session_id)
            entry.subscriptions.add(address)
        return len(entry.subscriptions) - before

    def unsubscribe(self, session_id: int, addresses: Iterable[str]) -> None:
        entry = self._by_session.get(session_id)
        removed = 0
        for address in addresses:
            subscribers = self._subscribers.get(address)
            if subscribers is not None:
                subscribers.discard(session_id)
                if not subscribers:
                    del self._subscribers[address]
            if entry is not None and address in entry.subscriptions:
                entry.subscriptions.discard(address)
                removed += 1
        if removed:
            self.on_subscriptions_removed(session_id, removed)

    def subscribe_domain(self, domain: str, runtime: str, addresses: Iterable[str]) -> list[str]:
        """A runtime of another domain subscribed, through its node, to ``addresses``. Returns
        those it did not hold already (what its domain's count grew by)."""
        held = self._remote_of.setdefault((domain, runtime), set())
        added = []
        for address in addresses:
            if address in held:
                continue
            held.add(address)
            self._remote.setdefault(address, {}).setdefault(domain, set()).add(runtime)
            added.append(address)
        if added:
            self._remote_count[domain] = self._remote_count.get(domain, 0) + len(added)
        elif not held:
            del self._remote_of[(domain, runtime)]
        return added

    def unsubscribe_domain(
        self, domain: str, runtime: str, addresses: Iterable[str] | None = None
    ) -> None:
        """The runtime's subscriptions to ``addresses`` end (all of them when None). Costs what
        the request names (or the runtime holds), whatever the size of the table."""
        held = self._remote_of.get((domain, runtime))
        if held is None:
            return
        targets = list(held) if addresses is None else addresses
        removed = 0
        for address in targets:
            if address not in held:
                continue
            held.discard(address)
            removed += 1
            remote = self._remote.get(address)
            runtimes = remote.get(domain) if remote is not None else None
            if remote is None or runtimes is None:
                continue
            runtimes.discard(runtime)
            if not runtimes:
                del remote[domain]
            if not remote:
                del self._remote[address]
        if not held:
            del self._remote_of[(domain, runtime)]
        if removed:
            left = self._remote_count.get(domain, 0) - removed
            if left > 0:
                self._remote_count[domain] = left
            else:
                self._remote_count.pop(domain, None)

    def remote_held(self, domain: str) -> int:
        """How many subscriptions the runtimes of ``domain`` hold here, all together."""
        return self._remote_count.get(domain, 0)

    def remote_holds(self, domain: str, runtime: str, address: str) -> bool:
        held = self._remote_of.get((domain, runtime))
        return held is not None and address in held

    def has_subscribers(self, address: str) -> bool:
        """Whether any local session subscribes to ``address``."""
        return bool(self._subscribers.get(address))

    def learn(self, session_id: int, address: str) -> bool:
        """Remember that ``address`` speaks through this session (the monitor allowed it).
        Returns True when that is new (the caller persists it). An address held by a session is
        never learned by another: it stays the first one's until that session is released."""
        if address in self._owner or address in self._learned or address in self._runtimes:
            return False
        self._learned[address] = session_id
        self._entry(session_id).learned.add(address)
        return True

    def unlearn(self, session_id: int, address: str) -> None:
        if self._learned.get(address) == session_id:
            del self._learned[address]
            self._entry(session_id).learned.discard(address)
            self.on_learned_removed(session_id, 1)

    def remove_session(self, session_id: int) -> None:
        entry = self._by_session.pop(session_id, None)
        if entry is None:
            return
        owned = 0
        for address in entry.allocations:
            if self._owner.get(address) == session_id:
                del self._owner[address]
                self._key_of.pop(address, None)
                owned += 1
        if owned:
            self.on_allocations_removed(session_id, owned)
        for key in entry.keys:
            self._keys.pop((session_id, key), None)
        for address in entry.subscriptions:
            subscribers = self._subscribers.get(address)
            if subscribers is not None:
                subscribers.discard(session_id)
                if not subscribers:
                    del self._subscribers[address]
        if entry.subscriptions:
            self.on_subscriptions_removed(session_id, len(entry.subscriptions))
        for address in entry.learned:
            if self._learned.get(address) == session_id:
                del self._learned[address]
        if entry.learned:
            self.on_learned_removed(session_id, len(entry.learned))
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

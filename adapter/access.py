"""The reference monitor: the one place that decides who may use an address.

Every question of the form "may this principal use this address" is answered here, from one
table of holders (the routing table: what the node allocated to each session, each session's
runtimeURL, the routes it learned, who subscribed to what). The ingress, the subscription
manager, address allocation, the registry, the peer feed and delivery ask; none of them holds a
rule of its own. The rules are those of DESIGN.md section 10 and docs/stub-protocol.md ("Who may
do what"):

- **Speak from.** A runtime speaks from its runtimeURL and what is under it, and from what the
  node allocated to it (and what is under that). It may also speak from an address of a domain
  this node knows nothing about (a hyperty of another provider hosted in the runtime): the node
  then learns that route. Never from the node's service addresses, another runtime's URL, this
  domain's or a peer domain's addresses it was not allocated, or a ``user://`` address other
  than its own verified identity's. Ownership never comes from first use of a string the node
  hands out or a credential stands behind.
- **Receive at.** The holder of an address receives what is sent to it (and to what is under
  it). Subscribers receive what is sent to a stream (``<object>/changes``,
  ``<object>/children/…``, ``<hyperty>/registration``) and what is sent to an address nobody
  holds. ``<object>/subscription`` is the reporter's request channel: only the object's holder
  receives it.
- **Send to.** A registration status (``<hyperty>/registration``) is published by the node
  only (a peer's node, for its own domain's hyperties), a data object's changes by the
  object's holder only.
- **Subscribe to.** Streams, the runtime's own addresses, and addresses nobody holds that are
  nobody's to hold (a stub's URL); never another runtime's address, a runtimeURL, this domain's
  or a peer's unallocated addresses, or another user's address. A peer domain's runtimes
  subscribe to this domain's streams only.
- **Register.** A runtime registers hyperties and data objects the node allocated to it, naming
  its own runtimeURL as their runtime.
- **Claim.** reTHINK's runtimes (runtime-core since 2018) make their hyperty and object
  addresses themselves, ``<scheme>://<this domain>/<random GUID>``, and never ask the node for
  them. Such an address, held by nobody and never let go by a runtime it was allocated to
  (released addresses are kept for as long as the registry may name them), is allocated to the
  runtime that first speaks from it, subscribes to it or registers it: a random GUID is a name
  nobody else can know before its maker uses it, so taking it up is allocation, not first use
  of somebody's address. The allocation service does the taking (and its quota counts it).
- **Answer.** A ``response`` goes back only from an address the request was sent to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from .addresses import (
    CHANGES_SUFFIX,
    REGISTRATION_SUFFIX,
    RUNTIME_SCHEME,
    SERVICE_SCHEMES,
    STUB_SCHEME,
    SUBSCRIPTION_SUFFIX,
    USER_SCHEME,
    domain_of,
    is_self_made,
    is_stream_address,
    is_stub_url,
    scheme_of,
)
from .identity.model import Identity
from .routing_table import RoutingTable


class Principal(Protocol):
    """A runtime's session as the monitor sees it."""

    @property
    def session_id(self) -> int: ...

    @property
    def runtime_url(self) -> str: ...

    @property
    def identity(self) -> Identity | None: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """A "no", with the code and reason the requester is answered with."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Claim:
    """Allowed once the principal holds ``address``, a self-made address nobody holds: it is
    allocated to it first (see "Claim" above)."""

    address: str


# What speaking from an address comes to: the principal holds it, the node learns the route (an
# address of an unknown domain, or the principal's own verified user URL), or it claims it.
OWN: Final = "own"
LEARN: Final = "learn"
SpeakFrom = Literal["own", "learn"] | Claim | Refusal


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


_SERVICE_PREFIXES = tuple(f"{scheme}://" for scheme in SERVICE_SCHEMES)


class AccessMonitor:
    def __init__(
        self,
        domain: str,
        table: RoutingTable,
        peer_domains: Iterable[str] = (),
        asked: Callable[[int], AskedOf | None] = lambda _session: None,
    ) -> None:
        self._domain = domain
        self._table = table
        self._peers = frozenset(peer_domains)
        # What a session held by this process asked, and where (sessions/session.py).
        self._asked = asked

    @property
    def domain(self) -> str:
        return self._domain

    # -- who holds what -----------------------------------------------------------------------

    def holder(self, address: str) -> int | None:
        """The session that holds ``address``: allocated to it (itself or a parent), its
        runtimeURL (itself or a parent), or a route it learned."""
        found = self._table.allocated_holder(address)
        return found if found is not None else self._table.learned_holder(address)

    def _is_peer_address(self, address: str) -> bool:
        return domain_of(address) in self._peers

    def _in_this_domain(self, address: str) -> bool:
        return domain_of(address) == self._domain

    # -- speak from ---------------------------------------------------------------------------

    def speak_from(self, who: Principal, address: str) -> SpeakFrom:
        """Whether ``who`` may send a message from ``address``."""
        if address.startswith(_SERVICE_PREFIXES):
            return Refusal(403, f"'{address}' is an address of the node's own services")
        held = self._table.allocated_holder(address)
        if held is not None:
            if held == who.session_id:
                return OWN
            return Refusal(403, f"'{address}' is allocated to another runtime")
        learned = self._table.learned_holder(address)
        if learned is not None:
            if learned == who.session_id:
                return OWN
            return Refusal(403, f"'{address}' is in use by another runtime")
        if is_self_made(address, self._domain):
            return Claim(address)
        refusal = self._unlearnable(who, address)
        return LEARN if refusal is None else refusal

    def _unlearnable(self, who: Principal, address: str) -> Refusal | None:
        """Why nobody may take ``address`` by speaking from it (None: an address of a domain
        the node knows nothing about, or the principal's own verified user URL)."""
        scheme = scheme_of(address)
        if scheme == RUNTIME_SCHEME:
            return Refusal(
                403, f"'{address}' is not this runtime's: a runtime speaks from its own runtimeURL"
            )
        if scheme == STUB_SCHEME:
            # A stub's URL (hyperty-runtime://<domain>/protostub/<n>) is a name its runtime
            # chooses and nothing vouches for; it carries the stub's requests and the answers
            # to them, so it is learned while nobody else uses it. Only that form: a bare host
            # or a shorter path would be the parent of every other runtime's stub URL.
            if is_stub_url(address):
                return None
            return Refusal(
                403, f"'{address}' is not a stub's URL (hyperty-runtime://<domain>/<kind>/<id>)"
            )
        if scheme == USER_SCHEME:
            if _verified_user_url(who.identity) == address:
                return None
            return Refusal(
                403,
                f"'{address}' is a user's address: only a runtime that proved that identity "
                "speaks from it",
            )
        if self._in_this_domain(address):
            return Refusal(
                403,
                f"'{address}' was not allocated to this runtime: the node allocates this "
                f"domain's addresses (domain://msg-node.{self._domain}/address-allocation)",
            )
        if self._is_peer_address(address):
            return Refusal(403, f"'{address}' belongs to the peer domain {domain_of(address)}")
        return None

    # -- send to ------------------------------------------------------------------------------

    def send_to(
        self, sender: int | None, address: str, peer_domain: str | None = None
    ) -> Refusal | None:
        """Whether the session ``sender`` (None: the peer domain ``peer_domain``) may send to
        ``address``, beyond speaking from an address of its own. A stream of publications (an
        object's changes, a hyperty's status) has one publisher: the object's reporter, or the
        node of the hyperty's domain; nobody else may publish there, here or for a domain of
        its own choosing."""
        if address.endswith(REGISTRATION_SUFFIX):
            if sender is not None or self._in_this_domain(address):
                return Refusal(
                    403, f"'{address}' is a registration status: only the node publishes it"
                )
            if domain_of(address) != peer_domain:
                return Refusal(403, f"'{address}': a domain publishes its own hyperties' status")
        if address.endswith(CHANGES_SUFFIX):
            parent = address[: -len(CHANGES_SUFFIX)]
            holder = self.holder(parent)
            if holder is not None and holder != sender:
                return Refusal(
                    403, f"'{address}': only the object's reporter publishes its changes"
                )
            if holder is None:
                if self._in_this_domain(parent):
                    return Refusal(404, f"no data object {parent} in this domain")
                if sender is not None or domain_of(parent) != peer_domain:
                    # Another domain's object: its reporter is there, and its changes come
                    # from its own domain's node only.
                    return Refusal(
                        403, f"'{address}': only the object's reporter publishes its changes"
                    )
        return None

    # -- receive at ---------------------------------------------------------------------------

    def receivers(self, addresses: Iterable[str], sender: int | None) -> Destinations:
        """Every session (and peer domain) a message to ``addresses`` goes to.

        The holder of an address gets it. Subscribers get it when the address is a stream, or
        when nobody holds it: a runtime never receives what is sent to another runtime's own
        address, whenever it subscribed to it. The sender gets its own message back only if it
        subscribed to the address or holds it exactly. A registration's status reaches its
        subscribers only (a publication the holder did not ask for would arrive in place of
        an answer it waits for). Other domains get streams only."""
        table = self._table
        found: set[int] = set()
        owners: set[int] = set()
        domains: set[str] = set()
        known = False
        for address in addresses:
            subscribers = table.subscribers(address)
            stream = is_stream_address(address)
            exact = table.exact_holder(address)
            holder = exact if exact is not None else table.runtime_holder(address)
            if subscribers:
                known = True
                if holder is None or stream:
                    found.update(subscribers)
            if stream:
                remote = table.remote_domains(address)
                if remote:
                    domains.update(remote)  # a domain is listed while any runtime holds it
                    known = True
            if exact is not None:
                owners.add(exact)
                known = True
            elif holder is not None:
                known = True
                if (holder != sender or (subscribers and sender in subscribers)) and not (
                    address.endswith(REGISTRATION_SUFFIX)
                ):
                    owners.add(holder)
        found.update(owners)
        return Destinations(frozenset(found), known, frozenset(owners), frozenset(domains))

    # -- subscribe to -------------------------------------------------------------------------

    def subscribe_to(self, who: Principal, address: str) -> Refusal | Claim | None:
        """Whether ``who`` may subscribe to ``address``: receive what is sent there."""
        if is_stream_address(address):
            return None
        if address.endswith(SUBSCRIPTION_SUFFIX):
            parent = address[: -len(SUBSCRIPTION_SUFFIX)]
            holder = self.holder(parent)
            if holder == who.session_id:
                return None
            if holder is None and is_self_made(parent, self._domain):
                return Claim(parent)
            return Refusal(
                403,
                f"'{address}' is the request channel of {parent}: only its reporter receives "
                "what is sent there",
            )
        holder = self.holder(address)
        if holder == who.session_id:
            return None
        if holder is not None:
            return Refusal(403, _NOT_A_TARGET.format(address))
        if is_self_made(address, self._domain):
            return Claim(address)
        if is_stub_url(address):
            return None  # a stub's URL: nobody's to hold (runtimes subscribe their stubs')
        # Nobody holds it now, but it is somebody's to hold (a runtime, a user, an allocation of
        # this domain or another's): a subscription would catch what is sent to its next holder.
        return Refusal(403, _NOT_A_TARGET.format(address))

    def peer_subscribe_to(self, address: str) -> Refusal | None:
        """Whether a peer domain's runtime may subscribe to ``address`` here."""
        if self._in_this_domain(address) and is_stream_address(address):
            return None
        return Refusal(
            403,
            f"{address!r}: another domain's runtimes subscribe only to {self._domain}'s "
            "data-object streams and registration status",
        )

    # -- allocations and registrations --------------------------------------------------------

    def release_allocation(self, who: Principal, address: str) -> Refusal | None:
        holder = self._table.allocated_holder(address)
        if holder is not None and holder != who.session_id:
            return Refusal(403, f"{address!r} is allocated to another runtime")
        return None

    def register(self, who: Principal, url: str, runtime: str | None) -> Refusal | Claim | None:
        """Whether ``who`` may register (or change the registration of) ``url`` naming
        ``runtime`` as its runtime: the node allocated ``url`` to it (or it claims it), and
        ``runtime`` is its own runtimeURL."""
        if runtime is not None and runtime != who.runtime_url:
            return Refusal(403, f"a runtime registers under its own runtimeURL, not {runtime}")
        holder = self._table.allocated_holder(url)
        if holder == who.session_id and self._in_this_domain(url):
            return None
        if (
            holder is None
            and self._table.learned_holder(url) is None
            and is_self_made(url, self._domain)
        ):
            return Claim(url)
        return Refusal(
            403, f"{url} was not allocated to this runtime: it registers only its own addresses"
        )

    # -- answer -------------------------------------------------------------------------------

    def answer(self, to: Iterable[str], request_id: Any, address: str) -> Refusal | None:
        """Whether a ``response`` from ``address`` to ``to`` answers a request each requester
        sent there: every addressee this process holds must have asked ``address``. A
        requester this process does not hold (another process of the domain, or another
        domain, whose own node judges) is not asked."""
        for requester in to:
            holder = self.holder(requester)
            asked = self._asked(holder) if holder is not None else None
            if asked is not None and address not in asked.went_to(request_id):
                return Refusal(
                    403, f"'{address}' was not asked: a response comes from where its request went"
                )
        return None


class AskedOf(Protocol):
    def went_to(self, request_id: Any) -> tuple[str, ...]: ...


_NOT_A_TARGET = (
    "{0!r} is not a subscription target for this runtime: a runtime subscribes to data-object "
    "streams (…/changes, …/children/…), registration status (…/registration), its own "
    "addresses and its objects' request channels (…/subscription)"
)


def _verified_user_url(identity: Identity | None) -> str | None:
    if identity is None or not identity.authenticated:
        return None
    return identity.user_url


async def no_claims(_who: Principal, address: str) -> Refusal | None:
    """Where nothing may be claimed (a test's monitor without an allocation service)."""
    return Refusal(403, f"'{address}' was not allocated to this runtime")

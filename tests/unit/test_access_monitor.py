"""The reference monitor's table of rules (adapter/access.py, DESIGN.md section 10): every
principal, every operation, on its own, another's and nobody's addresses.

Each row says what the monitor must answer; a row is a promise, not an attack. ALICE is an
anonymous runtime, BOB a runtime with a verified identity; both are sessions of domain ``d``,
which federates with ``peer.example``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from adapter.access import LEARN, OWN, AccessMonitor, Claim, Refusal
from adapter.addresses import runtime_url_problem, spelling_problem
from adapter.identity.model import Identity
from adapter.routing_table import RoutingTable
from adapter.sessions.session import ASKED_ADDRESSES, AskedRequests

ALICE_ID, BOB_ID = 1, 2
BOB_IDENTITY = Identity(
    user_id="user://idp.example/bob",
    idp_domain="idp.example",
    method="oidc",
    authenticated=True,
    issuer="https://idp.example",
    subject="bob",
)


@dataclass(frozen=True)
class Who:
    session_id: int
    runtime_url: str
    identity: Identity | None = None


ALICE = Who(ALICE_ID, "runtime://d/alice")
BOB = Who(BOB_ID, "runtime://d/bob", BOB_IDENTITY)

# What each address is, seen from ALICE.
OWN_ADDRESSES = [
    "runtime://d/alice",
    "runtime://d/alice/registry/allocation",
    "hyperty://d/a",
    "hyperty://d/a/inner",
    "comm://d/ao",
]
ANOTHERS = [
    "runtime://d/bob",
    "runtime://d/bob/sm",
    "hyperty://d/b",
    "comm://d/bo",
    "user://idp.example/bob",  # learned by BOB, whose verified identity it is
    "hyperty://elsewhere.example/learned-by-bob",
]
NOBODYS = [
    "hyperty://d/released",  # this domain's allocation space
    "comm://d/released",
    "runtime://d/nobody",
    "runtime://elsewhere.example/1",
    "hyperty-runtime://d/protostub/1",
    "user://idp.example/carol",
    "hyperty://peer.example/x",
]
SERVICES = ["domain://msg-node.d/sm", "domain://registry.d", "global://registry", "domain://idm.d"]
STREAMS = ["comm://d/bo/changes", "comm://d/bo/children/chat", "hyperty://d/b/registration"]


def _monitor() -> tuple[AccessMonitor, RoutingTable, dict[int, AskedRequests]]:
    table = RoutingTable()
    table.add_runtime(ALICE_ID, ALICE.runtime_url)
    table.add_allocations(ALICE_ID, ["hyperty://d/a", "comm://d/ao"], None)
    table.add_runtime(BOB_ID, BOB.runtime_url)
    table.add_allocations(BOB_ID, ["hyperty://d/b", "comm://d/bo"], None)
    table.learn(BOB_ID, "user://idp.example/bob")
    table.learn(BOB_ID, "hyperty://elsewhere.example/learned-by-bob")
    asked = {ALICE_ID: AskedRequests(), BOB_ID: AskedRequests()}
    monitor = AccessMonitor("d", table, ["peer.example"], asked.get)
    return monitor, table, asked


# -- speak from --------------------------------------------------------------------------------


@pytest.mark.parametrize("address", OWN_ADDRESSES)
def test_a_runtime_speaks_from_what_it_holds(address: str) -> None:
    monitor, _, _ = _monitor()
    assert monitor.speak_from(ALICE, address) == OWN


@pytest.mark.parametrize("address", ANOTHERS + SERVICES + STREAMS[:2])
def test_a_runtime_never_speaks_from_anothers_address(address: str) -> None:
    monitor, _, _ = _monitor()
    verdict = monitor.speak_from(ALICE, address)
    assert isinstance(verdict, Refusal) and verdict.code == 403, verdict


@pytest.mark.parametrize("address", [a for a in NOBODYS if not a.startswith("hyperty-runtime")])
def test_nothing_of_this_domain_a_runtime_a_user_or_a_peer_is_taken_by_first_use(
    address: str,
) -> None:
    monitor, _, _ = _monitor()
    verdict = monitor.speak_from(ALICE, address)
    assert isinstance(verdict, Refusal) and verdict.code == 403, verdict


def test_an_unknown_domains_address_is_learned_and_a_verified_user_speaks_as_itself() -> None:
    monitor, table, _ = _monitor()
    assert monitor.speak_from(ALICE, "hyperty://elsewhere.example/mine") == LEARN
    # A stub's URL is a name its runtime chose: learned while nobody else uses it.
    assert monitor.speak_from(ALICE, "hyperty-runtime://d/protostub/1") == LEARN
    table.learn(ALICE_ID, "hyperty-runtime://d/protostub/1")
    assert isinstance(monitor.speak_from(BOB, "hyperty-runtime://d/protostub/1"), Refusal)
    # Only a stub's URL: a bare host or a shorter path would parent every other stub's URL.
    for parent in (
        "hyperty-runtime://d",
        "hyperty-runtime://d/protostub",
        "hyperty-runtime://d/x/",
    ):
        verdict = monitor.speak_from(BOB, parent)
        assert isinstance(verdict, Refusal) and verdict.code == 403, parent
        assert isinstance(monitor.subscribe_to(BOB, parent), Refusal), parent
    carol = Who(3, "runtime://d/carol", BOB_IDENTITY)  # the same identity, another runtime
    assert monitor.speak_from(carol, "user://idp.example/bob") == Refusal(
        403, "'user://idp.example/bob' is in use by another runtime"
    )
    table.remove_session(BOB_ID)
    # The verified identity speaks from its own user URL; nobody else does.
    assert monitor.speak_from(carol, "user://idp.example/bob") == LEARN
    assert isinstance(monitor.speak_from(ALICE, "user://idp.example/bob"), Refusal)


# -- receive at ---------------------------------------------------------------------------------


def test_the_holder_receives_and_subscribers_receive_streams_and_nobodys_only() -> None:
    monitor, table, _ = _monitor()
    table.subscribe(ALICE_ID, ["comm://d/bo/changes", "hyperty-runtime://d/protostub/1"])
    # Subscriptions the monitor would refuse today, kept from an older node.
    table.subscribe(ALICE_ID, ["hyperty://d/b", "comm://d/bo/subscription"])
    assert monitor.receivers(["hyperty://d/b"], None).sessions == {BOB_ID}
    assert monitor.receivers(["runtime://d/bob/sm"], None).sessions == {BOB_ID}
    assert monitor.receivers(["comm://d/bo/subscription"], None).sessions == {BOB_ID}
    assert monitor.receivers(["comm://d/bo/changes"], BOB_ID).sessions == {ALICE_ID}
    assert monitor.receivers(["hyperty-runtime://d/protostub/1"], None).sessions == {ALICE_ID}
    assert not monitor.receivers(["hyperty://d/released"], None).known


def test_other_domains_receive_streams_only() -> None:
    monitor, table, _ = _monitor()
    table.subscribe_domain("peer.example", "runtime://peer.example/1", ["hyperty://d/b"])
    table.subscribe_domain("peer.example", "runtime://peer.example/1", ["comm://d/bo/changes"])
    assert monitor.receivers(["hyperty://d/b"], ALICE_ID).domains == frozenset()
    assert monitor.receivers(["comm://d/bo/changes"], BOB_ID).domains == {"peer.example"}


# -- send to ------------------------------------------------------------------------------------


def test_only_the_node_publishes_registration_status_and_only_the_reporter_changes() -> None:
    monitor, _, _ = _monitor()
    for sender in (ALICE_ID, BOB_ID, None):
        refused = monitor.send_to(sender, "hyperty://d/b/registration")
        assert refused is not None and refused.code == 403
    assert monitor.send_to(BOB_ID, "comm://d/bo/changes") is None
    for sender in (ALICE_ID, None):
        refused = monitor.send_to(sender, "comm://d/bo/changes")
        assert refused is not None and refused.code == 403
    # Anyone may add to an object's children (a group chat's messages).
    assert monitor.send_to(ALICE_ID, "comm://d/bo/children/chat") is None
    # A peer's own object's changes, and its own hyperties' status, are the peer's to publish;
    # a third domain's are not, and no runtime here publishes another domain's object's changes.
    peer, third = "peer.example", "third.example"
    assert monitor.send_to(None, f"comm://{peer}/o/changes", peer) is None
    assert monitor.send_to(None, f"hyperty://{peer}/h/registration", peer) is None
    for forged in (f"comm://{third}/o/changes", f"hyperty://{third}/h/registration"):
        refused = monitor.send_to(None, forged, peer)
        assert refused is not None and refused.code == 403, forged
    for sender in (ALICE_ID, BOB_ID):
        refused = monitor.send_to(sender, f"comm://{peer}/o/changes")
        assert refused is not None and refused.code == 403


# -- subscribe to -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [*STREAMS, *OWN_ADDRESSES, "comm://d/ao/subscription", "hyperty-runtime://d/protostub/1"],
)
def test_a_runtime_subscribes_to_streams_its_own_addresses_and_stub_urls(address: str) -> None:
    monitor, _, _ = _monitor()
    assert monitor.subscribe_to(ALICE, address) is None


@pytest.mark.parametrize(
    "address",
    [
        *ANOTHERS,
        *SERVICES,
        "comm://d/bo/subscription",  # another's object's request channel
        *[a for a in NOBODYS if not a.startswith("hyperty-runtime")],
    ],
)
def test_a_runtime_never_subscribes_to_what_is_or_may_become_anothers(address: str) -> None:
    monitor, _, _ = _monitor()
    refused = monitor.subscribe_to(ALICE, address)
    assert refused is not None and refused.code == 403


def test_a_peer_subscribes_to_this_domains_streams_only() -> None:
    monitor, _, _ = _monitor()
    for stream in STREAMS:
        assert monitor.peer_subscribe_to(stream) is None
    for address in ["comm://d/bo/subscription", "hyperty://d/b", "runtime://d/bob", "x://d/o"]:
        assert monitor.peer_subscribe_to(address) is not None
    assert monitor.peer_subscribe_to("comm://peer.example/o/changes") is not None


# -- allocations and registrations --------------------------------------------------------------


def test_a_runtime_releases_and_registers_only_what_it_was_allocated() -> None:
    monitor, _, _ = _monitor()
    assert monitor.release_allocation(ALICE, "hyperty://d/a") is None
    assert monitor.release_allocation(ALICE, "hyperty://d/b") is not None
    assert monitor.release_allocation(ALICE, "hyperty://d/released") is None  # nothing to do
    assert monitor.register(ALICE, "hyperty://d/a", "runtime://d/alice") is None
    assert monitor.register(ALICE, "comm://d/ao", None) is None
    for url, runtime in [
        ("hyperty://d/b", "runtime://d/alice"),  # another's hyperty
        ("hyperty://d/released", "runtime://d/alice"),  # nobody's
        ("hyperty://elsewhere.example/x", "runtime://d/alice"),  # not this domain's
        ("hyperty://d/a", "runtime://d/bob"),  # under another runtime
    ]:
        refused = monitor.register(ALICE, url, runtime)
        assert refused is not None and refused.code == 403, url


# -- answer -------------------------------------------------------------------------------------


def test_a_response_comes_only_from_where_its_request_went() -> None:
    monitor, _, asked = _monitor()
    asked[ALICE_ID].note(7, ("hyperty://d/b",))
    assert monitor.answer(("hyperty://d/a",), 7, "hyperty://d/b") is None
    assert monitor.answer(("hyperty://d/a",), 7, "hyperty://d/evil") is not None
    assert monitor.answer(("hyperty://d/a",), "7", "hyperty://d/b") is not None  # another id
    assert monitor.answer(("hyperty://d/a",), 8, "hyperty://d/b") is not None  # never asked
    # A requester this process does not hold: its own node (or process) judges.
    assert monitor.answer(("hyperty://elsewhere.example/r",), 8, "hyperty://d/b") is None
    # Every addressee must have asked: a requester of one's own first in `to` opens no door to
    # the others (Bob never asked hyperty://d/b with id 7).
    refused = monitor.answer(("hyperty://d/a", "comm://d/bo"), 7, "hyperty://d/b")
    assert refused is not None and refused.code == 403


# -- one spelling -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "DOMAIN://registry.d",
        "domain://Registry.d",
        "domain://registry.d.",
        "global://REGISTRY/",
        "domain://registry.d\u200b",
        "hyperty://d/a\u2028",
        "hyperty://d/a\u0085",
        "hyperty://d/a b",
        "hyperty:/d/a",
        "hyperty://",
        "no-scheme",
        # What a URL parser (a browser's, or reTHINK runtime-core's divideURL) reads as another
        # host or another path than an exact comparison does.
        "hyperty://d:80/a",
        "hyperty://d:/a",
        "hyperty://b.example\\@d/a",
        "hyperty://mallory@d/a",
        "hyperty://d%2eexample/a",
        "hyperty://d\uff0eexample/a",
        "hyperty://d\u3002/a",
        "hyperty://d/a?x=",
        "hyperty://d/a#",
        "hyperty://d/a\\b",
        "hyperty://d/mine/../a",
        "hyperty://d/mine/%2e%2e/a",
        "hyperty://d/./a",
        "hyperty://d/%61",
        "hyperty://d/a%2fb",
        "hyperty://d/a%zz",
        "runtime://d/alice/..",
    ],
)
def test_an_address_has_one_spelling(spelling: str) -> None:
    assert spelling_problem(spelling) is not None


def test_canonical_addresses_pass_as_written() -> None:
    for address in [
        *OWN_ADDRESSES,
        *ANOTHERS,
        *NOBODYS,
        *SERVICES,
        *STREAMS,
        "comm://d/Ä/ÖPath",
        "user://d/a%40b",
    ]:
        assert spelling_problem(address) is None, address


def test_a_runtime_url_is_an_opaque_id_in_this_domain() -> None:
    assert runtime_url_problem("runtime://d/1", "d") is None
    assert runtime_url_problem("runtime://d/3f0c-ab_9.x~%20", "d") is None
    for bad in [
        "runtime://other/1",
        "runtime://d/1/2",
        "runtime://d/",
        "user://d/1",
        "hyperty://d/1",
        "hyperty-runtime://d/1",
        "runtime://D/1",
        "runtime://d/1\u200b",
        "runtime://d/" + "x" * 129,
        "",
        5,
        None,
    ]:
        assert runtime_url_problem(bad, "d") is not None, bad


def test_what_a_runtime_asked_is_remembered_within_a_bound_of_addresses() -> None:
    asked = AskedRequests()
    wide = tuple(f"hyperty://d/{n}" for n in range(256))
    for n in range(64):
        asked.note(n, wide)
    asked.note("last", ("hyperty://d/b",))
    assert asked.went_to("last") == ("hyperty://d/b",)
    assert asked.went_to(0) == ()  # forgotten: the oldest go first
    assert asked.went_to(63) == wide
    held = sum(len(asked.went_to(n)) for n in range(64)) + 1
    assert held <= ASKED_ADDRESSES


# -- claim ---------------------------------------------------------------------------------------

SELF_MADE = "hyperty://d/0f3c2a9e-1b7d-4c55-9e1a-2b3c4d5e6f70"
SELF_MADE_OBJECT = "comm://d/0f3c2a9e-1b7d-4c55-9e1a-2b3c4d5e6f71"


def test_a_self_made_address_nobody_holds_is_claimed_by_its_first_use() -> None:
    """reTHINK's runtimes name their hyperties and objects with a random GUID themselves: the
    first to use such a name claims it (it is allocated to it then), on every path."""
    monitor, table, _ = _monitor()
    assert monitor.speak_from(ALICE, SELF_MADE) == Claim(SELF_MADE)
    assert monitor.subscribe_to(ALICE, SELF_MADE) == Claim(SELF_MADE)
    assert monitor.subscribe_to(ALICE, f"{SELF_MADE_OBJECT}/subscription") == Claim(
        SELF_MADE_OBJECT
    )
    assert monitor.register(ALICE, SELF_MADE, ALICE.runtime_url) == Claim(SELF_MADE)
    # Once it is somebody's, it is theirs alone.
    table.add_allocations(ALICE_ID, [SELF_MADE], None)
    assert monitor.speak_from(ALICE, SELF_MADE) == OWN
    assert isinstance(monitor.speak_from(BOB, SELF_MADE), Refusal)
    assert isinstance(monitor.subscribe_to(BOB, SELF_MADE), Refusal)
    assert isinstance(monitor.register(BOB, SELF_MADE, BOB.runtime_url), Refusal)


@pytest.mark.parametrize(
    "address",
    [
        "hyperty://d/not-a-guid",
        "hyperty://elsewhere.example/0f3c2a9e-1b7d-4c55-9e1a-2b3c4d5e6f70",  # another domain
        "runtime://d/0f3c2a9e-1b7d-4c55-9e1a-2b3c4d5e6f70",  # reserved schemes
        "user://d/0f3c2a9e-1b7d-4c55-9e1a-2b3c4d5e6f70",
        "hyperty://d/0F3C2A9E-1B7D-4C55-9E1A-2B3C4D5E6F70",  # not the form runtimes make
        "hyperty://d/0f3c2a9e-1b7d-4c55-9e1a-2b3c4d5e6f70/below",
    ],
)
def test_only_a_guid_of_this_domain_is_self_made(address: str) -> None:
    monitor, _, _ = _monitor()
    assert not isinstance(monitor.speak_from(ALICE, address), Claim), address

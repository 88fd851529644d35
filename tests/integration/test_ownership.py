"""An address belongs to whoever holds its credential (issue 42), through the real Synapse: no
runtime takes another's runtimeURL, hyperty, user URL, registry entry or answers by speaking
first, spelling an address another way, or coming back after the owner left. Each test keeps
the honest runtimes working beside the attacker.

The rules are the reference monitor's (adapter/access.py); its table of rules is tested on its
own in tests/unit/test_access_monitor.py."""

from __future__ import annotations

from typing import Any

import pytest

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"
SM = f"domain://msg-node.{D}/sm"
REGISTRY = f"domain://registry.{D}"


async def _runtime(node: Any, name: str) -> PyRuntime:
    return await PyRuntime(stub_url(node), f"runtime://{D}/{name}", acked=True).connect()


async def _ping(sender: PyRuntime, receiver: PyRuntime, frm: str, to: str, tag: str) -> None:
    await sender.send({"id": tag, "type": "ping", "from": frm, "to": to})
    got = await receiver.receive(10)
    assert got["id"] == tag, got


def _hyperty(url: str, runtime: str, user: str) -> dict[str, Any]:
    return {
        "value": {
            "user": user,
            "descriptor": "hyperty-catalogue://catalogue.mn.test/.well-known/hyperty/Chat",
            "url": url,
            "expires": 120,
            "resources": ["chat"],
            "dataSchemes": ["comm"],
            "runtime": runtime,
            "status": "live",
        },
        "policy": "policy",
    }


async def test_nobody_squats_a_runtime_url_or_a_user_url_by_speaking_from_it(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 1: before the victim connects, the attacker speaks once from its runtimeURL (and
    from a user URL): the node learns nothing, and the victim, connecting later, receives
    what is sent to it."""
    node = await start_node(await databases.migrated_sqlite())
    mallory = await _runtime(node, "sq-mallory")
    alice = await _runtime(node, "sq-alice")
    try:
        [m] = await mallory.allocate(D)
        [a] = await alice.allocate(D)
        victim = f"runtime://{D}/sq-victim"
        for forged in (victim, f"{victim}/registry", "user://gmail.com/victim"):
            reply = await mallory.request(a, "ping", from_=forged)
            assert reply["body"]["code"] == 403, (forged, reply)
        bob = await _runtime(node, "sq-victim")
        try:
            await _ping(alice, bob, a, victim, "secret")
            assert await mallory.nothing_within(1.0)
        finally:
            await bob.close()
        await _ping(alice, mallory, a, m, "still-routing")
    finally:
        await mallory.close()
        await alice.close()


async def test_a_runtime_url_is_a_runtime_of_this_domain_and_parents_nothing_else(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 1b (and 4c): a "runtimeURL" naming a user, a hyperty, another domain or holding
    control characters is refused at the handshake."""
    node = await start_node(await databases.migrated_sqlite())
    for bad in (
        "user://gmail.com",
        f"hyperty://{D}",
        "runtime://elsewhere.example/1",
        f"runtime://{D}/a/b",
        f"runtime://{D}/a\u0085",
        f"runtime://{D}/a\u2028",
        f"RUNTIME://{D}/a",
    ):
        runtime = PyRuntime(stub_url(node), bad, acked=True)
        try:
            await runtime.connect()
            assert runtime.connect_answer is not None
            assert runtime.connect_answer.get("response") == 400, (bad, runtime.connect_answer)
        finally:
            await runtime.close()


async def test_a_released_hyperty_is_nobodys_to_speak_from(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 1c: after its runtime disconnects, another runtime speaking from the old hyperty
    address is refused, and messages to it are answered 404."""
    node = await start_node(await databases.migrated_sqlite())
    gone = await _runtime(node, "rel-gone")
    mallory = await _runtime(node, "rel-mallory")
    alice = await _runtime(node, "rel-alice")
    try:
        [old] = await gone.allocate(D)
        [a] = await alice.allocate(D)
        await gone.disconnect()
        reply = await mallory.request(a, "ping", from_=old)
        assert reply["body"]["code"] == 403, reply
        reply = await alice.request(old, "ping", from_=a)
        assert reply["body"]["code"] == 404, reply
    finally:
        for runtime in (gone, mallory, alice):
            await runtime.close()


async def test_the_registry_takes_only_what_was_allocated_to_the_registering_runtime(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 2: registering the victim's freshly allocated hyperty (or naming another runtime)
    is refused; the victim registers it and discovery names the victim."""
    node = await start_node(await databases.migrated_sqlite())
    victim = await _runtime(node, "reg-victim")
    mallory = await _runtime(node, "reg-mallory")
    try:
        [h] = await victim.allocate(D)
        [m] = await mallory.allocate(D)
        frm = f"{mallory.runtime_url}/registry"
        for body in (
            _hyperty(h, mallory.runtime_url, f"user://{D}/mallory"),
            _hyperty(m, victim.runtime_url, f"user://{D}/mallory"),
            _hyperty(f"hyperty://{D}/never-allocated", mallory.runtime_url, f"user://{D}/m"),
        ):
            reply = await mallory.request(REGISTRY, "create", body, from_=frm)
            assert reply["body"]["code"] == 403, reply
        reply = await victim.request(
            REGISTRY,
            "create",
            _hyperty(h, victim.runtime_url, f"user://{D}/victim"),
            from_=f"{victim.runtime_url}/registry",
        )
        assert reply["body"]["code"] == 200, reply
        found = await victim.request(
            REGISTRY, "read", {"resource": h}, from_=f"{victim.runtime_url}/registry"
        )
        assert found["body"]["value"]["runtime"] == victim.runtime_url, found
    finally:
        await victim.close()
        await mallory.close()


async def test_a_runtime_url_left_with_registrations_stays_its_credentials(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 3: after the victim's clean disconnect, a stranger connecting with its runtimeURL is
    refused while its registrations live; the victim, with its token, comes back and manages
    them."""
    node = await start_node(await databases.migrated_sqlite())
    victim = await _runtime(node, "left-victim")
    frm = f"{victim.runtime_url}/registry"
    [h] = await victim.allocate(D)
    reply = await victim.request(
        REGISTRY, "create", _hyperty(h, victim.runtime_url, f"user://{D}/left"), from_=frm
    )
    assert reply["body"]["code"] == 200, reply
    token = victim.token
    await victim.disconnect()

    stranger = PyRuntime(stub_url(node), victim.runtime_url, acked=True)
    try:
        await stranger.connect()
        assert stranger.connect_answer is not None
        assert stranger.connect_answer.get("response") == 401, stranger.connect_answer
    finally:
        await stranger.close()

    back = PyRuntime(stub_url(node), victim.runtime_url, acked=True)
    back.token = token
    try:
        await back.connect()
        assert back.connect_answer is not None and back.connect_answer["response"] == 200
        reply = await back.request(
            REGISTRY, "update", {"resource": h, "value": {"status": "live"}}, from_=frm
        )
        assert reply["body"]["code"] == 200, reply
    finally:
        await back.close()


async def test_an_old_token_names_no_session_that_reuses_its_id(
    start_node: NodeFactory, databases: Databases
) -> None:
    """A session's token names that session, not its row id: SQLite gives a deleted session's
    id to the next session, so the attacker's token from a session it ended must not admit it
    to the victim's live session under the same runtimeURL, nor to the runtimeURL the victim's
    registrations keep for the victim's credential."""
    node = await start_node(await databases.migrated_sqlite())
    url = f"runtime://{D}/reuse-victim"
    mallory = await PyRuntime(stub_url(node), url, acked=True).connect()
    old_token = mallory.token
    await mallory.disconnect()
    victim = await PyRuntime(stub_url(node), url, acked=True).connect()
    [h] = await victim.allocate(D)
    frm = f"{url}/registry"
    reply = await victim.request(REGISTRY, "create", _hyperty(h, url, f"user://{D}/v"), from_=frm)
    assert reply["body"]["code"] == 200, reply
    try:
        for stage in ("live", "left"):
            thief = PyRuntime(stub_url(node), url, acked=True)
            thief.token = old_token
            try:
                await thief.connect()
                assert thief.connect_answer is not None
                assert thief.connect_answer.get("response") == 401, (stage, thief.connect_answer)
            finally:
                await thief.close()
            if stage == "live":
                victim_token = victim.token
                await victim.disconnect()
        back = PyRuntime(stub_url(node), url, acked=True)
        back.token = victim_token
        try:
            await back.connect()
            assert back.connect_answer is not None and back.connect_answer["response"] == 200
        finally:
            await back.close()
    finally:
        await victim.close()


async def test_an_objects_subscription_channel_reaches_its_reporter_only(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 3b: a runtime subscribing to another's object's request channel is refused, and
    what observers send there reaches the reporter alone."""
    node = await start_node(await databases.migrated_sqlite())
    reporter = await _runtime(node, "ch-reporter")
    observer = await _runtime(node, "ch-observer")
    spy = await _runtime(node, "ch-spy")
    try:
        [obj] = await reporter.allocate(D, scheme="comm", endpoint="object-address-allocation")
        [o] = await observer.allocate(D)
        channel = f"{obj}/subscription"
        refused = await spy.request(SM, "subscribe", {"resources": [channel]})
        assert refused["body"]["code"] == 403, refused
        accepted = await reporter.request(SM, "subscribe", {"resources": [channel]})
        assert accepted["body"]["code"] == 200, accepted
        await _ping(observer, reporter, o, channel, "let-me-in")
        assert await spy.nothing_within(1.0)
    finally:
        for runtime in (reporter, observer, spy):
            await runtime.close()


async def test_an_answer_comes_only_from_where_its_request_went(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 6: a response forged from the registry (spelled in capitals, with a trailing dot,
    with a zero-width space, or plainly), or from an address nobody asked, never reaches the
    requester; the real answer does."""
    node = await start_node(await databases.migrated_sqlite())
    alice = await _runtime(node, "ans-alice")
    bob = await _runtime(node, "ans-bob")
    mallory = await _runtime(node, "ans-mallory")
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        [m] = await mallory.allocate(D)
        await alice.send({"id": "q1", "type": "read", "from": a, "to": b})
        assert (await bob.receive(10))["id"] == "q1"
        for forged in (
            f"domain://Registry.{D}",
            f"DOMAIN://registry.{D}",
            f"domain://registry.{D}.",
            "global://REGISTRY/",
            f"domain://registry.{D}\u200b",
            f"domain://registry.{D}",
            m,
        ):
            fake = {"id": "q1", "type": "response", "from": forged, "to": a, "body": {"code": 200}}
            await mallory.send(fake)
            refusal = await mallory.receive(10)
            assert refusal["body"]["code"] in (400, 403), (forged, refusal)
        await bob.send({"id": "q1", "type": "response", "from": b, "to": a, "body": {"code": 200}})
        answer = await alice.receive(10)
        assert answer["from"] == b and answer["type"] == "response", answer
        assert await alice.nothing_within(1.0)
    finally:
        for runtime in (alice, bob, mallory):
            await runtime.close()


async def test_a_runtime_that_names_its_own_addresses_claims_them_once(
    start_node: NodeFactory, databases: Databases
) -> None:
    """reTHINK's runtimes since 2018 make their hyperty and object addresses themselves (a random
    GUID in this domain) and subscribe to them at /sm instead of asking the node: the first use
    allocates such an address to its runtime, nobody else takes it, and once its runtime let it
    go nobody takes it up again."""
    node = await start_node(await databases.migrated_sqlite())
    made = await _runtime(node, "claim-maker")
    alice = await _runtime(node, "claim-alice")
    mallory = await _runtime(node, "claim-mallory")
    hyperty = f"hyperty://{D}/5d2f0c1e-7a4b-4c3d-8e9f-0a1b2c3d4e5f"
    obj = f"comm://{D}/5d2f0c1e-7a4b-4c3d-8e9f-0a1b2c3d4e60"
    try:
        [a] = await alice.allocate(D)
        # As runtime-core's AddressAllocation and ReporterObject do: subscribe, with a source.
        reply = await made.request(
            SM, "subscribe", {"resources": [hyperty], "source": f"{made.runtime_url}/registry"}
        )
        assert reply["body"]["code"] == 200, reply
        reply = await made.request(SM, "subscribe", {"resources": [f"{obj}/subscription"]})
        assert reply["body"]["code"] == 200, reply
        await _ping(alice, made, a, hyperty, "to-the-maker")
        await _ping(made, alice, obj, a, "from-its-object")
        for taken in (hyperty, obj):
            reply = await mallory.request(a, "ping", from_=taken)
            assert reply["body"]["code"] == 403, reply
            reply = await mallory.request(SM, "subscribe", {"resources": [taken]})
            assert reply["body"]["code"] == 403, reply
        await made.disconnect()
        # Let go: not taken up again by anyone while the registry may still name it.
        reply = await mallory.request(a, "ping", from_=hyperty)
        assert reply["body"]["code"] == 403 and "let go" in reply["body"]["desc"], reply
        reply = await mallory.request(SM, "subscribe", {"resources": [obj]})
        assert reply["body"]["code"] == 403, reply
        assert await alice.nothing_within(0.5)
    finally:
        for runtime in (made, alice, mallory):
            await runtime.close()

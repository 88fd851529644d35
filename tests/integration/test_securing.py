"""Who may do what, end to end through the node and the test session's Synapse: sessions that
cannot be taken, parties that cannot be impersonated, quotas, authenticated runtimes (Matrix
accounts and OpenID Connect), identity assertion, the IdM connector and the policy API."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from ..conftest import Databases, Homeserver, NodeFactory
from ..support.fake_idp import AUDIENCE, FakeIdp, idp, rsa_key
from ..support.matrix_users import MatrixUser, login, register_user
from ..support.runtime import PyRuntime, stub_url

__all__ = ["idp"]  # the fixture, used by name

pytestmark = [pytest.mark.integration]
D = "mn.test"
MN = f"domain://msg-node.{D}"
IDM = f"domain://idm.{D}"
POLICY_TOKEN = "policy-token-for-the-tests"


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_a_session_handed_a_token_cannot_be_taken(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    victim = await PyRuntime(stub_url(node), f"runtime://{D}/victim", acked=True).connect()
    peer = await PyRuntime(stub_url(node), f"runtime://{D}/peer").connect()
    try:
        [v] = await victim.allocate(D)
        [p] = await peer.allocate(D)
        # A stranger who knows the runtimeURL, without the token: every handshake refused.
        stranger = PyRuntime(stub_url(node), victim.runtime_url)
        await stranger.connect("v1")
        assert stranger.connect_answer is not None
        assert stranger.connect_answer["response"] == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await PyRuntime(stub_url(node), victim.runtime_url).connect("v2")
        assert refused.value.status == 401
        await stranger.close()
        # The victim's connection is untouched and still gets its messages.
        await peer.send({"id": 1, "type": "ping", "from": p, "to": v})
        assert (await victim.receive(10))["id"] == 1
        # Its own token takes the session back after a drop, as the bundled stub does.
        await victim.drop()
        await victim.connect()
        assert victim.connect_answer is not None
        assert victim.connect_answer["data"]["session"] == "resumed"
    finally:
        await victim.close()
        await peer.close()


async def test_tokenless_stubs_are_the_operators_choice(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(
        await databases.migrated_sqlite(), **{"stub.tokenless_sessions": "refuse"}
    )
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await PyRuntime(stub_url(node), f"runtime://{D}/tokenless").connect("v2")
    assert refused.value.status == 401
    ok = await PyRuntime(stub_url(node), f"runtime://{D}/hello").connect("v2", hello=True)
    try:
        assert ok.connect_answer is not None and ok.connect_answer["data"]["token"]
    finally:
        await ok.close()


async def test_nobody_acts_for_another_runtime_or_for_the_node(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite(), **{"quotas.addresses": 5})
    reporter = await PyRuntime(stub_url(node), f"runtime://{D}/sec-reporter").connect()
    observer = await PyRuntime(stub_url(node), f"runtime://{D}/sec-observer").connect()
    mallory = await PyRuntime(stub_url(node), f"runtime://{D}/sec-mallory").connect()
    try:
        [obj] = await reporter.allocate(D, scheme="comm", endpoint="address-allocation")
        [watcher] = await observer.allocate(D)
        [m] = await mallory.allocate(D)
        changes = f"{obj}/changes"
        sub = await observer.request(
            f"{MN}/sm", "subscribe", {"resources": [changes], "source": watcher}
        )
        assert sub["body"]["code"] == 200

        # Unsubscribing someone else's observer by naming it as the source: refused.
        forged = await mallory.request(
            f"{MN}/sm", "unsubscribe", {"resources": [changes], "source": watcher}
        )
        assert forged["body"]["code"] == 403
        # Deleting someone else's allocation: refused.
        taken = await mallory.request(
            f"{MN}/hyperty-address-allocation", "delete", {"resource": watcher}
        )
        assert taken["body"]["code"] == 403
        # Speaking as the node's subscription manager: refused.
        await mallory.send(
            {"id": "fake", "type": "response", "from": f"{MN}/sm", "to": watcher, "body": {}}
        )
        assert (await mallory.receive(10))["body"]["code"] == 403

        await reporter.send({"id": 1, "type": "update", "from": obj, "to": changes, "body": {}})
        got = await observer.receive(10)
        assert got["id"] == 1  # still subscribed; the forged answer never arrived
        assert await observer.nothing_within(0.3)

        # Quota: five addresses, then 429.
        more = await mallory.request(
            f"{MN}/hyperty-address-allocation", "create", {"value": {"number": 5}}
        )
        assert more["body"]["code"] == 429
        refused = node.metrics.quota_refusals.labels("addresses")._value.get()
        assert refused == 1 and m
    finally:
        for rt in (reporter, observer, mallory):
            await rt.close()


async def test_matrix_accounts_authenticate_runtimes_and_their_messages(
    homeserver: Homeserver,
    start_node: NodeFactory,
    databases: Databases,
    http: aiohttp.ClientSession,
) -> None:
    alice_user = await register_user(http, homeserver, "sec_alice")
    bob_user = await register_user(http, homeserver, "sec_bob")
    node = await start_node(await databases.migrated_sqlite(), **{"auth.mode": "matrix"})

    def runtime(name: str) -> PyRuntime:
        return PyRuntime(stub_url(node), f"runtime://{D}/{name}", acked=True)

    def cred(user: MatrixUser | str) -> dict[str, str]:
        token = user if isinstance(user, str) else user.access_token
        return {"type": "matrix", "token": token}

    alice = await runtime("m-alice").connect(auth=cred(alice_user))
    bob = await runtime("m-bob").connect(auth=cred(bob_user))
    try:
        assert alice.connect_answer is not None and alice.connect_answer["response"] == 200
        # No credential, a wrong one, a logged-out one: refused.
        for bad in (None, cred("syt_not_a_token")):
            nobody = await runtime("m-nobody").connect(auth=bad)
            assert nobody.connect_answer is not None
            assert nobody.connect_answer["response"] == 401, bad
            await nobody.close()
        stale = await login(http, homeserver, alice_user)
        async with http.post(
            f"{homeserver.url}/_matrix/client/v3/logout",
            headers={"Authorization": f"Bearer {stale}"},
        ) as resp:
            assert resp.status == 200
        logged_out = await runtime("m-stale").connect(auth=cred(stale))
        assert logged_out.connect_answer is not None
        assert logged_out.connect_answer["response"] == 401
        await logged_out.close()
        # Bob's valid credential does not get him alice's session.
        thief = PyRuntime(stub_url(node), alice.runtime_url, acked=True)
        await thief.connect(auth=cred(bob_user))
        assert thief.connect_answer is not None and thief.connect_answer["response"] == 401
        await thief.close()

        # The IdM connector tells a runtime who it proved to be.
        me = await alice.request(IDM, "read")
        assert me["body"]["code"] == 200
        assert me["body"]["value"]["userProfile"]["userURL"] == "user://mn.test/sec_alice"

        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        # A message asserting nobody gets the sender's identity, asserted by the node.
        await alice.send({"id": 1, "type": "ping", "from": a, "to": b})
        got = await bob.receive(10)
        assert got["body"]["assertedIdentity"] is True
        assert got["body"]["identity"]["userProfile"]["userURL"] == "user://mn.test/sec_alice"
        # Asserting someone else is refused.
        spoof = {"userProfile": {"userURL": "user://mn.test/sec_bob"}}
        await alice.send({"id": 2, "type": "ping", "from": a, "to": b, "body": {"identity": spoof}})
        assert (await alice.receive(10))["body"]["code"] == 403
        assert await bob.nothing_within(0.3)
        # And bob can have the node validate alice's assertion (reTHINK's validateAssertion).
        valid = await bob.request(
            IDM,
            "execute",
            {
                "method": "validateAssertion",
                "params": {"assertion": got["body"]["identity"], "origin": a},
            },
        )
        assert valid["body"]["code"] == 200
    finally:
        await alice.close()
        await bob.close()


async def test_openid_connect_id_tokens(
    start_node: NodeFactory, databases: Databases, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k1", key)
    node = await start_node(
        await databases.migrated_sqlite(),
        **{"auth.mode": "oidc", "auth.oidc": {"issuer": idp.url, "audience": AUDIENCE}},
    )

    async def attempt(token: str) -> int:
        rt = PyRuntime(stub_url(node), f"runtime://{D}/oidc-{token[-8:]}")
        await rt.connect("v1", auth={"type": "oidc", "token": token})
        await rt.close()
        assert rt.connect_answer is not None
        return int(rt.connect_answer["response"])

    assert await attempt(idp.token(key, "k1")) == 200
    assert await attempt(idp.token(rsa_key(), "k1")) == 401  # forged signature
    assert await attempt(idp.token(key, "k1", aud="someone-else")) == 401
    assert await attempt(idp.token(key, "k1", exp=1)) == 401  # expired
    assert await attempt(idp.token(key, "unknown-kid")) == 401


async def test_a_policy_rule_added_over_the_api_applies_to_the_next_message(
    start_node: NodeFactory, databases: Databases, http: aiohttp.ClientSession
) -> None:
    node = await start_node(await databases.migrated_sqlite(), **{"policy_api.token": POLICY_TOKEN})
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/pol-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/pol-bob").connect()
    api = f"http://127.0.0.1:{node.appservice_port}/_rethink/policy/rules"
    auth = {"Authorization": f"Bearer {POLICY_TOKEN}"}
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        await alice.send({"id": 1, "type": "invite", "from": a, "to": b})
        assert (await bob.receive(10))["id"] == 1

        rule = {"id": 7, "target": {"actionType": {"equals": "invite"}}, "effect": "deny"}
        async with http.put(f"{api}/7", json=rule, headers=auth) as resp:
            assert resp.status in (200, 201), await resp.text()
        async with http.get(api) as resp:
            assert resp.status == 401  # the API has its own token

        await alice.send({"id": 2, "type": "invite", "from": a, "to": b})
        refused = await alice.receive(10)
        assert refused["body"]["code"] == 403 and "7" in refused["body"]["desc"]
        assert await bob.nothing_within(0.3)

        async with http.delete(f"{api}/7", headers=auth) as resp:
            assert resp.status in (200, 204)
        await alice.send({"id": 3, "type": "invite", "from": a, "to": b})
        assert (await bob.receive(10))["id"] == 3
    finally:
        await alice.close()
        await bob.close()

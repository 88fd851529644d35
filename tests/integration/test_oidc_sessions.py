"""OpenID Connect identities end to end (issue 22): who a session belongs to is the ID token's
(iss, sub), never its e-mail; and the node vouches for an identity only until its token's `exp`,
unless the runtime presents a fresh token on the open socket ({cmd: 'auth'}). Real WebSockets,
the test session's Synapse and the fake IdP."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson
import pytest

from ..conftest import Databases, NodeFactory
from ..support.fake_idp import AUDIENCE, FakeIdp, idp, rsa_key
from ..support.runtime import PyRuntime, stub_url

__all__ = ["idp"]  # the fixture, used by name

pytestmark = [pytest.mark.integration]
D = "mn.test"
IDM = f"domain://idm.{D}"


async def oidc_node(start_node: NodeFactory, databases: Databases, idp: FakeIdp) -> Any:
    return await start_node(
        await databases.migrated_sqlite(),
        **{"auth.mode": "oidc", "auth.oidc": {"issuer": idp.url, "audience": AUDIENCE}},
    )


def oidc(token: str) -> dict[str, str]:
    return {"type": "oidc", "token": token}


async def auth_command(rt: PyRuntime, token: str) -> dict[str, Any]:
    """Sends {cmd: 'auth'} on the runtime's open socket and returns the node's answer."""
    assert rt.ws is not None
    frame = {"cmd": "auth", "data": {"type": "oidc", "token": token}}
    await rt.ws.send_str(orjson.dumps(frame).decode())
    async with asyncio.timeout(10):
        while True:
            got = await rt.inbox.get()
            if got.get("cmd") == "auth":
                return dict(got)


async def test_a_token_with_the_victims_email_gets_nothing_of_the_victim(
    start_node: NodeFactory, databases: Databases, idp: FakeIdp
) -> None:
    """Issue 22 row 5: an attacker's own valid ID token carrying the victim's e-mail, with
    `email_verified` missing or "false" (or even true, for another subject), does not resume the
    victim's session, does not close it, and nothing it sends is asserted as the victim."""
    key = rsa_key()
    idp.publish("k-row5", key)
    node = await oidc_node(start_node, databases, idp)
    victim = PyRuntime(stub_url(node), f"runtime://{D}/row5-victim", acked=True)
    await victim.connect(auth=oidc(idp.token(key, "k-row5", sub="victim-sub")))
    peer = PyRuntime(stub_url(node), f"runtime://{D}/row5-peer", acked=True)
    await peer.connect(auth=oidc(idp.token(key, "k-row5", sub="peer-sub", email="p@x.org")))
    attacker_own: PyRuntime | None = None
    try:
        assert victim.connect_answer is not None and victim.connect_answer["response"] == 200
        [v] = await victim.allocate(D)
        [p] = await peer.allocate(D)
        attacks = [
            idp.token(key, "k-row5", sub="attacker-sub", email_verified=None),
            idp.token(key, "k-row5", sub="attacker-sub", email_verified="false"),
            idp.token(key, "k-row5", sub="attacker-sub", email_verified=False),
            idp.token(key, "k-row5", sub="attacker-sub", email_verified=True),
        ]
        for token in attacks:
            # The victim's runtimeURL, the attacker's own valid token, no session token.
            thief = PyRuntime(stub_url(node), victim.runtime_url)
            await thief.connect("v1", auth=oidc(token))
            assert thief.connect_answer is not None
            assert thief.connect_answer["response"] == 401, thief.connect_answer
            await thief.close()
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await PyRuntime(stub_url(node), victim.runtime_url).connect(
                    "v2", auth=oidc(token), hello=True
                )
            assert refused.value.status == 401

        # Even with the victim's session token, another subject's credential is refused: a
        # session's identity does not change hands.
        assert victim.token is not None
        thief = PyRuntime(stub_url(node), victim.runtime_url)
        await thief.connect("v1", token=victim.token, auth=oidc(attacks[0]))
        assert thief.connect_answer is not None and thief.connect_answer["response"] == 401
        await thief.close()

        # The victim was not closed and still has its session and messages.
        assert victim.close_code is None
        await peer.send({"id": "to-victim", "type": "ping", "from": p, "to": v})
        assert (await victim.receive(10))["id"] == "to-victim"

        # The attacker's own runtime is its own identity, not the victim's.
        attacker_own = PyRuntime(stub_url(node), f"runtime://{D}/row5-attacker", acked=True)
        await attacker_own.connect(auth=oidc(attacks[0]))
        assert attacker_own.connect_answer is not None
        assert attacker_own.connect_answer["response"] == 200
        assert attacker_own.connect_answer["data"]["session"] == "new"
        me = await attacker_own.request(IDM, "read")
        assert me["body"]["value"]["userProfile"]["userURL"] == "user://127.0.0.1/attacker-sub"
        [a] = await attacker_own.allocate(D)
        await attacker_own.send({"id": "plain", "type": "ping", "from": a, "to": p})
        got = await peer.receive(10)
        assert got["id"] == "plain" and got["body"]["assertedIdentity"] is True
        profile = got["body"]["identity"]["userProfile"]
        assert profile["userURL"] == "user://127.0.0.1/attacker-sub"
        assert profile["username"] == "attacker-sub"
        # Claiming the victim in the body is refused; nothing reaches the peer.
        for claim in (
            {"identity": {"userProfile": {"userURL": "user://gmail.com/alice"}}},
            {"identity": {"userProfile": {"username": "alice@gmail.com"}}},
            # the victim's own token, were it leaked: it names the victim's subject
            {"idToken": idp.token(key, "k-row5", sub="victim-sub")},
        ):
            await attacker_own.send(
                {"id": "spoof", "type": "ping", "from": a, "to": p, "body": claim}
            )
            answer = await attacker_own.receive(10)
            assert answer["body"]["code"] == 403, (claim, answer)
        assert await peer.nothing_within(0.3)
        assert victim.close_code is None
    finally:
        for rt in (victim, peer, attacker_own):
            if rt is not None:
                await rt.close()


async def test_an_identity_ends_at_exp_unless_a_fresh_token_is_presented(
    start_node: NodeFactory, databases: Databases, idp: FakeIdp
) -> None:
    """Issue 22 row 8: after its ID token's exp, a live socket's messages are refused 401; a
    fresh token for the same (iss, sub) on the open socket makes them flow again, asserted; a
    token for another subject is refused (403) and changes nothing; a reconnect must present a
    valid credential."""
    key = rsa_key()
    idp.publish("k-row8", key)
    node = await oidc_node(start_node, databases, idp)
    exp = int(time.time()) + 3
    alice = PyRuntime(stub_url(node), f"runtime://{D}/row8-alice", acked=True)
    await alice.connect(auth=oidc(idp.token(key, "k-row8", sub="alice-sub", exp=exp)))
    bob = PyRuntime(stub_url(node), f"runtime://{D}/row8-bob", acked=True)
    await bob.connect(auth=oidc(idp.token(key, "k-row8", sub="bob-sub", email="b@x.org")))
    try:
        assert alice.connect_answer is not None and alice.connect_answer["response"] == 200
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        await alice.send({"id": 1, "type": "ping", "from": a, "to": b})
        got = await bob.receive(10)
        assert got["id"] == 1 and got["body"]["assertedIdentity"] is True

        await asyncio.sleep(max(0.0, exp - time.time()) + 0.3)
        # Past exp: the node no longer vouches; nothing goes out in alice's name.
        await alice.send({"id": 2, "type": "ping", "from": a, "to": b})
        refused = await alice.receive(10)
        assert refused["id"] == 2 and refused["body"]["code"] == 401
        assert "auth" in refused["body"]["desc"]
        assert await bob.nothing_within(0.3)

        # A valid token of another subject (same e-mail, even verified): 403, nothing changes.
        other = idp.token(key, "k-row8", sub="mallory-sub")
        answer = await auth_command(alice, other)
        assert answer["response"] == 403, answer
        # A forged token, an expired one: 401.
        answer = await auth_command(alice, idp.token(rsa_key(), "k-row8", sub="alice-sub"))
        assert answer["response"] == 401, answer
        answer = await auth_command(alice, idp.token(key, "k-row8", sub="alice-sub", exp=exp))
        assert answer["response"] == 401, answer
        await alice.send({"id": 3, "type": "ping", "from": a, "to": b})
        assert (await alice.receive(10))["body"]["code"] == 401
        assert await bob.nothing_within(0.3)

        # A fresh token for alice's (iss, sub): messages flow again, asserted as alice.
        fresh_exp = int(time.time()) + 300
        fresh = idp.token(key, "k-row8", sub="alice-sub", exp=fresh_exp)
        answer = await auth_command(alice, fresh)
        assert answer == {"cmd": "auth", "response": 200, "data": {"expires": fresh_exp}}
        await alice.send({"id": 4, "type": "ping", "from": a, "to": b})
        got = await bob.receive(10)
        assert got["id"] == 4 and got["body"]["assertedIdentity"] is True
        assert got["body"]["identity"]["userProfile"]["userURL"] == "user://gmail.com/alice"
        assert got["body"]["identity"]["expires"] == fresh_exp

        # A reconnect must present a valid credential: the expired token is refused even with
        # the session token; the fresh one resumes the session.
        await alice.drop()
        await alice.connect(auth=oidc(idp.token(key, "k-row8", sub="alice-sub", exp=exp)))
        assert alice.connect_answer is not None and alice.connect_answer["response"] == 401
        await alice.drop()
        await alice.connect(auth=oidc(fresh))
        assert alice.connect_answer is not None and alice.connect_answer["response"] == 200
        assert alice.connect_answer["data"]["session"] == "resumed"
        await alice.send({"id": 5, "type": "ping", "from": a, "to": b})
        assert (await bob.receive(10))["id"] == 5
    finally:
        await alice.close()
        await bob.close()

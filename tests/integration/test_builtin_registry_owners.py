"""Who may change the built-in registry's entries, through reTHINK messages on SQLite and
PostgreSQL: only the runtime that registered an entry updates, keeps alive, replaces or deletes
it; a hyperty's user is the runtime's verified identity, or, for anonymous runtimes, a user URL
no other runtime holds; racing creations have one winner. Reads, the operator (REST API,
no runtime) and presence are unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
import pytest_asyncio

from adapter.identity.model import Identity
from adapter.services.base import Requester, ServiceReply
from adapter.services.registry_builtin import build_builtin_registry
from adapter.services.registry_http import RestCall
from adapter.storage.database import Database
from adapter.storage.registry_models import DISCONNECTED, LIVE

from .registry_support import (
    ALICE,
    BOB,
    GRACE,
    RT1,
    RT2,
    D,
    Harness,
    claim_of,
    registry_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

H1, H2, H3 = (f"hyperty://{D}/h-{n}" for n in (1, 2, 3))
CHAT1 = f"comm://{D}/chat-1"
RT3 = f"runtime://{D}/3"
CAROL = f"user://{D}/carol"
BOB_VERIFIED = Identity(
    user_id="@bob:example.com", idp_domain=D, method="matrix", authenticated=True
)
BOB_ANONYMOUS = Identity(user_id=RT2, idp_domain=D, method="anonymous", authenticated=False)


def foreign(url: str) -> str:
    return (
        f"{url} is registered by another runtime: only the runtime that registered it may "
        "replace, update, keep alive or delete it"
    )


def held(user: str) -> str:
    return (
        f"{user} is held by another runtime's registrations: one user on several devices "
        "needs verified identities"
    )


async def _everything(registry: Harness) -> tuple[Any, ...]:
    return (
        (await registry.read(H1)).value,
        (await registry.read(ALICE)).value,
        (await registry.read(CHAT1)).value,
    )


HYPERTY_ATTACKS = {
    # The hijack: the victim's hyperty answered by the attacker's runtime and p2p handler.
    "update": {"resource": H1, "value": {"runtime": RT2, "p2pHandler": f"{RT2}/p2phandler"}},
    "descriptor": {"resource": H1, "value": {"descriptor": "hyperty-catalogue://evil/x"}},
    # The victim shown disconnected.
    "status": {"resource": H1, "attribute": "status", "value": DISCONNECTED},
    "keep-alive": {"resource": H1},
}
OBJECT_ATTACKS = {
    "update": {"resource": CHAT1, "value": {"reporter": H3, "runtime": RT2}},
    "status": {"resource": CHAT1, "attribute": "status", "value": DISCONNECTED},
    "keep-alive": {"resource": CHAT1},
}


async def _registered_by_rt1(registry: Harness) -> tuple[Any, ...]:
    assert (await registry.register_hyperty(H1, ALICE, runtime=RT1)).code == 200
    assert (await registry.register_object(CHAT1, "chat", H1, runtime=RT1)).code == 200
    registry.clock.advance(30)  # a keep-alive let through would show in lastModified
    before = await _everything(registry)
    registry.take_notes()
    return before


async def _still_rt1s(registry: Harness, before: tuple[Any, ...]) -> None:
    assert await _everything(registry) == before
    assert registry.take_notes() == []
    # Still RT1's: its presence moves them, RT2's does not.
    await registry.built.presence.runtime_away(claim_of(RT2))
    assert registry.take_notes() == []
    await registry.built.presence.runtime_away(claim_of(RT1))
    assert registry.take_notes() == [(H1, DISCONNECTED), (CHAT1, DISCONNECTED)]
    await registry.built.presence.runtime_back(claim_of(RT1))
    assert registry.take_notes() == [(H1, LIVE), (CHAT1, LIVE)]


@pytest.mark.parametrize("attack", list(HYPERTY_ATTACKS))
async def test_another_runtime_cannot_change_a_hyperty(registry: Harness, attack: str) -> None:
    before = await _registered_by_rt1(registry)
    reply = await registry.send("update", HYPERTY_ATTACKS[attack], runtime=RT2)
    assert (reply.code, reply.value, reply.desc) == (403, None, foreign(H1))
    await _still_rt1s(registry, before)
    # Its owner does it (a new session of the same runtimeURL is the same owner).
    assert (await registry.send("update", HYPERTY_ATTACKS[attack], runtime=RT1)).code == 200


@pytest.mark.parametrize("attack", list(OBJECT_ATTACKS))
async def test_another_runtime_cannot_change_a_data_object(registry: Harness, attack: str) -> None:
    before = await _registered_by_rt1(registry)
    reply = await registry.send("update", OBJECT_ATTACKS[attack], runtime=RT2)
    assert (reply.code, reply.value, reply.desc) == (403, None, foreign(CHAT1))
    await _still_rt1s(registry, before)
    assert (await registry.send("update", OBJECT_ATTACKS[attack], runtime=RT1)).code == 200


async def test_another_runtime_cannot_delete_a_hyperty_or_data_object(registry: Harness) -> None:
    before = await _registered_by_rt1(registry)
    reply = await registry.send("delete", {"value": {"user": ALICE, "url": H1}}, runtime=RT2)
    assert (reply.code, reply.desc) == (403, foreign(H1))
    reply = await registry.send("delete", {"value": {"name": CHAT1}}, runtime=RT2)
    assert (reply.code, reply.desc) == (403, foreign(CHAT1))
    reply = await registry.send("delete", {"resource": CHAT1}, runtime=RT2)
    assert (reply.code, reply.desc) == (403, foreign(CHAT1))
    await _still_rt1s(registry, before)
    assert (await registry.send("delete", {"value": {"name": CHAT1}}, runtime=RT1)).code == 200
    assert (
        await registry.send("delete", {"value": {"user": ALICE, "url": H1}}, runtime=RT1)
    ).code == 200
    assert registry.take_notes() == [(CHAT1, DISCONNECTED), (H1, DISCONNECTED)]


async def test_another_runtime_cannot_replace_a_registration(registry: Harness) -> None:
    before = await _registered_by_rt1(registry)
    reply = await registry.register_hyperty(
        H1, ALICE, runtime=RT2, p2pHandler=f"{RT2}/p2phandler", resources=("evil",)
    )
    assert (reply.code, reply.desc) == (403, foreign(H1))
    reply = await registry.register_object(CHAT1, "mine", H3, runtime=RT2)
    assert (reply.code, reply.desc) == (403, foreign(CHAT1))
    await _still_rt1s(registry, before)
    # RT1 registers both again (a page reload: a new stub instance, the same runtimeURL).
    assert (await registry.register_hyperty(H1, ALICE, runtime=RT1)).code == 200
    assert (await registry.register_object(CHAT1, "chat", H1, runtime=RT1)).code == 200


async def test_an_anonymous_runtime_cannot_register_under_another_runtimes_user(
    registry: Harness,
) -> None:
    assert (await registry.register_hyperty(H1, ALICE, runtime=RT1)).code == 200
    registry.take_notes()
    # No identity, or only the anonymous one: the user URL is RT1's while it has entries there.
    for identity in (None, BOB_ANONYMOUS):
        reply = await registry.register_hyperty(H2, ALICE, runtime=RT2, identity=identity)
        assert (reply.code, reply.value, reply.desc) == (403, None, held(ALICE))
    assert list((await registry.read(ALICE)).value) == [H1]
    assert (await registry.read(H2)).code == 404
    assert registry.take_notes() == []

    # RT1 adds another hyperty under it.
    assert (await registry.register_hyperty(H3, ALICE, runtime=RT1)).code == 200
    # Disconnected, the entries still hold it until they are gone.
    for url in (H1, H3):
        assert (
            await registry.send("delete", {"value": {"user": ALICE, "url": url}}, runtime=RT1)
        ).code == 200
    assert (await registry.register_hyperty(H2, ALICE, runtime=RT2)).code == 403
    registry.clock.advance(GRACE)
    assert (await registry.read(ALICE)).code == 404
    # Then the user URL is free: RT2 takes it, and now RT1 is the one refused.
    assert (await registry.register_hyperty(H2, ALICE, runtime=RT2)).code == 200
    reply = await registry.register_hyperty(H1, ALICE, runtime=RT1)
    assert (reply.code, reply.desc) == (403, held(ALICE))


async def test_a_verified_runtime_registers_under_its_own_user_only(registry: Harness) -> None:
    # RT1, anonymous, got to Bob's user URL first.
    assert (await registry.register_hyperty(H1, BOB, runtime=RT1)).code == 200
    registry.take_notes()

    # RT2 is verified as Bob: not Alice.
    reply = await registry.register_hyperty(H2, ALICE, runtime=RT2, identity=BOB_VERIFIED)
    assert (reply.code, reply.desc) == (
        403,
        f"the runtime is authenticated as {BOB}: it registers hyperties under that user, "
        f"not {ALICE}",
    )
    assert (await registry.read(ALICE)).code == 404 and registry.take_notes() == []

    # Under its own user URL (its host in any case) the anonymous holder does not block it,
    # and what RT1 registered there, never Bob's, is gone.
    bob = BOB.replace(D, D.upper())
    reply = await registry.register_hyperty(H2, bob, runtime=RT2, identity=BOB_VERIFIED)
    assert reply.code == 200
    again = await registry.register_hyperty(H2, BOB, runtime=RT2, identity=BOB_VERIFIED)
    assert again.code == 404  # H2 is filed under the spelling it was registered with
    h3 = await registry.register_hyperty(H3, BOB, runtime=RT2, identity=BOB_VERIFIED)
    assert h3.code == 200
    assert list((await registry.read(BOB)).value) == [H3]
    assert (await registry.read(H1)).code == 404
    assert registry.take_notes() == [(H2, LIVE), (H1, DISCONNECTED), (H3, LIVE)]
    reply = await registry.register_hyperty(H1, BOB, runtime=RT1)
    assert (reply.code, reply.desc) == (403, held(BOB))
    assert (await registry.send("update", {"resource": H1}, runtime=RT1)).code == 404

    # Bob on another device: a verified runtime of the same user registers beside RT2's.
    h4 = f"hyperty://{D}/h-4"
    other_device = await registry.register_hyperty(h4, BOB, runtime=RT3, identity=BOB_VERIFIED)
    assert other_device.code == 200
    assert list((await registry.read(BOB)).value) == [H3, h4]
    # ...but it is another runtime: it changes only its own.
    assert (await registry.send("update", {"resource": H3}, runtime=RT3)).code == 403


@pytest_asyncio.fixture(loop_scope="session")
async def second_node(registry: Harness, database_url: str) -> AsyncIterator[Harness]:
    """Another node process's registry on the same database (scaling out: section 9 of the
    design), so that racing requests run in separate, concurrent transactions."""
    db = Database(database_url)
    built = build_builtin_registry(registry_config(), db, None, clock=registry.clock)
    assert built is not None
    yield Harness(built, registry.clock)
    await db.dispose()


@pytest.mark.parametrize("how", ["one node", "two nodes", "two nodes, pair by pair"])
async def test_two_runtimes_racing_to_create_one_url_one_wins(
    registry: Harness, second_node: Harness, how: str
) -> None:
    """Through one node the racing requests may share a transaction; through two they run in
    concurrent ones: a burst conflicts inside the database's group commit, a lone pair inside
    ``RegistryStore.register`` (its ConstraintViolation retry)."""
    rounds = 20
    nodes = (registry, registry) if how == "one node" else (registry, second_node)

    async def create(node: Harness, n: int, runtime: str) -> tuple[ServiceReply, ServiceReply]:
        # Each runtime under a user of its own: only the URLs are contested.
        user = f"user://{D}/{runtime[-1]}-{n}"
        url = f"hyperty://{D}/race-{n}"
        hyperty = await node.register_hyperty(url, user, runtime=runtime)
        data_object = await node.register_object(
            f"comm://{D}/race-{n}", "race", url, runtime=runtime
        )
        return hyperty, data_object

    def pair(n: int) -> list[Awaitable[tuple[ServiceReply, ServiceReply]]]:
        return [create(node, n, rt) for node, rt in zip(nodes, (RT1, RT2), strict=True)]

    if how == "two nodes, pair by pair":
        answers = [answer for n in range(rounds) for answer in await asyncio.gather(*pair(n))]
    else:
        answers = await asyncio.gather(*(call for n in range(rounds) for call in pair(n)))
    for n in range(rounds):
        for kind, url in ((0, f"hyperty://{D}/race-{n}"), (1, f"comm://{D}/race-{n}")):
            first, second = answers[2 * n][kind], answers[2 * n + 1][kind]
            assert sorted((first.code, second.code)) == [200, 403], (url, first, second)
            assert (first if first.code == 403 else second).desc == foreign(url)
            winner = RT1 if first.code == 200 else RT2
            assert (await registry.read(url)).value["runtime"] == winner


async def test_two_anonymous_runtimes_racing_for_one_user_one_wins(
    registry: Harness, second_node: Harness
) -> None:
    async def take(node: Harness, n: int, runtime: str) -> int:
        url = f"hyperty://{D}/{runtime[-1]}-{n}"
        return (await node.register_hyperty(url, f"{CAROL}-{n}", runtime=runtime)).code

    rounds = 20
    codes = await asyncio.gather(
        *(
            take(node, n, rt)
            for n in range(rounds)
            for node, rt in zip((registry, second_node), (RT1, RT2), strict=True)
        )
    )
    for n in range(rounds):
        assert sorted(codes[2 * n : 2 * n + 2]) == [200, 403], n
        holders = {h["runtime"] for h in (await registry.read(f"{CAROL}-{n}")).value.values()}
        assert len(holders) == 1


async def test_reads_and_the_operator_are_not_checked(registry: Harness) -> None:
    await _registered_by_rt1(registry)
    # Reads by another runtime, and by a peer domain's node (federation's requester).
    assert (await registry.send("read", {"resource": H1}, runtime=RT2)).code == 200
    peer = Requester(0, "domain://msg-node.other.example")
    reply = await registry.built.service.handle(registry.message("read", {"resource": ALICE}), peer)
    assert reply.code == 200 and list(reply.value) == [H1]

    # The REST API (read-write mode) is the operator's: no runtime, no ownership check.
    async def operator(method: str, segments: tuple[str, ...], body: bytes | None) -> int:
        answer = await registry.built.backend.call(RestCall(method, segments, body=body))
        return answer.status

    assert await operator("PUT", ("hyperty", "url", H1), b'{"status": "created"}') == 200
    assert await operator("PUT", ("dataobject", "url", CHAT1), b"{}") == 200
    assert await operator("DELETE", ("hyperty", "user", ALICE, H1), None) == 200
    assert registry.take_notes() == [(H1, "created"), (H1, DISCONNECTED)]
    # ...and the entries are still RT1's.
    assert (await registry.send("update", {"resource": H1}, runtime=RT1)).code == 200
    assert (await registry.send("update", {"resource": H1}, runtime=RT2)).code == 403

"""The built-in domain registry through reTHINK messages, on SQLite and PostgreSQL: searches,
keep-alive, unregistration, data objects, expiry, presence and status notifications."""

from __future__ import annotations

import asyncio

import pytest

from adapter.services.registry_lifecycle import RegistryPresence
from adapter.storage.registry_models import DISCONNECTED, LIVE

from .registry_support import (
    ALICE,
    BOB,
    COMM_SCHEMA,
    DESCRIPTOR,
    GRACE,
    MAX_LIFETIME,
    RT1,
    RT2,
    SWEEP_INTERVAL,
    D,
    Harness,
    claim_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

H1, H2, H3 = (f"hyperty://{D}/h-{n}" for n in (1, 2, 3))
CHAT1, CHAT2, CALL = f"comm://{D}/chat-1", f"comm://{D}/chat-2", f"connection://{D}/call-1"


async def test_hyperties_are_found_by_user_email_guid_and_url(registry: Harness) -> None:
    guid = "user-guid://alice"
    assert (
        await registry.register_hyperty(H1, ALICE, resources=("chat", "video"), guid=guid)
    ).code == 200
    assert (
        await registry.register_hyperty(H2, ALICE, schemes=("comm", "connection"), guid=guid)
    ).code == 200
    assert (await registry.register_hyperty(H3, BOB, runtime=RT2)).code == 200

    by_user = await registry.read(ALICE)
    assert by_user.code == 200 and by_user.desc is None
    assert list(by_user.value) == [H1, H2]
    h1 = by_user.value[H1]
    assert h1["hypertyID"] == H1 and h1["userID"] == ALICE and h1["status"] == LIVE
    assert h1["descriptor"] == DESCRIPTOR and h1["runtime"] == RT1 and h1["guid"] == guid
    assert h1["resources"] == ["chat", "video"] and h1["dataSchemes"] == ["comm"]
    assert h1["expires"] == 120 and h1["startingTime"] == "2026-11-24T10:00:00Z"

    assert set((await registry.read(f"/hyperty/user/{ALICE}")).value) == {H1, H2}
    assert set((await registry.read("/hyperty/idp-identifier/alice@gmail.com")).value) == {H1, H2}
    assert set((await registry.read(guid)).value) == {H1, H2}

    by_url = await registry.read(H1)
    assert by_url.code == 200 and by_url.value["hypertyID"] == H1


@pytest.mark.parametrize(
    ("criteria", "found"),
    [
        ({"dataSchemes": ["connection"]}, {H2}),
        ({"resources": ["video"]}, {H1}),
        ({"resources": ["chat"], "dataSchemes": ["comm"]}, {H1, H2}),
        ({"resources": ["chat", "video"], "dataSchemes": ["comm"]}, {H1}),
        ({"resources": ["chat"], "dataSchemes": ["connection"]}, {H2}),
    ],
)
async def test_a_users_hyperties_are_filtered_by_resources_and_schemes(
    registry: Harness, criteria: dict[str, list[str]], found: set[str]
) -> None:
    await registry.register_hyperty(H1, ALICE, resources=("chat", "video"))
    await registry.register_hyperty(H2, ALICE, schemes=("comm", "connection"))
    reply = await registry.read(ALICE, **criteria)
    assert reply.code == 200 and set(reply.value) == found
    by_email = await registry.read("/hyperty/idp-identifier/alice@gmail.com", **criteria)
    assert by_email.code == 200 and set(by_email.value) == found


async def test_what_is_not_there_is_404(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE)
    for reply in (
        await registry.read(f"user://{D}/carol"),
        await registry.read(ALICE, resources=["audio"]),
        await registry.read(ALICE, dataSchemes=["ctxt"]),
        await registry.read(f"hyperty://{D}/nobody"),
        await registry.read("user-guid://nobody"),
        await registry.read("/hyperty/idp-identifier/carol@gmail.com"),
        await registry.read(CHAT1),
        await registry.read("no such name"),
        await registry.send("update", {"resource": f"hyperty://{D}/nobody"}),
        await registry.send("delete", {"value": {"user": ALICE, "url": f"hyperty://{D}/x"}}),
    ):
        assert (reply.code, reply.value, reply.desc) == (404, None, "Not Found")


async def test_creation_fields_are_checked(registry: Harness) -> None:
    reply = await registry.send("create", {"value": {"user": ALICE, "url": H1, "status": "live"}})
    assert reply.code == 400
    assert reply.desc == "missing fields: descriptor, resources, dataSchemes"
    reply = await registry.register_hyperty(H1, ALICE, expires="soon")
    assert (reply.code, reply.desc) == (400, "expires must be a whole number of seconds, 0 or more")
    reply = await registry.register_object(CHAT1, "", H1)
    assert (reply.code, reply.desc) == (400, "name must not be empty")
    assert (await registry.read(ALICE)).code == 404  # nothing was stored


async def test_a_hyperty_belongs_to_its_user(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE)
    assert (await registry.register_hyperty(H1, BOB)).code == 404
    assert (await registry.send("delete", {"value": {"user": BOB, "url": H1}})).code == 404
    assert (await registry.read(H1)).value["userID"] == ALICE
    # Its own user registers it again: the entry is replaced, its starting time kept.
    registry.clock.advance(30)
    assert (await registry.register_hyperty(H1, ALICE, resources=("audio",))).code == 200
    h1 = (await registry.read(H1)).value
    assert h1["resources"] == ["audio"] and h1["startingTime"] == "2026-11-24T10:00:00Z"
    assert h1["lastModified"] == "2026-11-24T10:00:30Z"


async def test_unregistered_hyperties_are_disconnected_then_gone(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE)
    await registry.register_hyperty(H2, ALICE)
    assert registry.take_notes() == [(H1, LIVE), (H2, LIVE)]

    assert (await registry.send("delete", {"value": {"user": ALICE, "url": H1}})).code == 200
    assert registry.take_notes() == [(H1, DISCONNECTED)]
    reply = await registry.read(ALICE)
    assert reply.code == 200  # one of the two is still live
    assert reply.value[H1]["status"] == DISCONNECTED and reply.value[H2]["status"] == LIVE
    h1 = await registry.read(H1)
    assert (h1.code, h1.desc, h1.value["status"]) == (408, "Temporarily Unavailable", DISCONNECTED)

    await registry.send("delete", {"value": {"user": ALICE, "url": H2}})
    reply = await registry.read(ALICE)
    assert reply.code == 408 and set(reply.value) == {H1, H2}

    registry.clock.advance(GRACE)
    assert (await registry.read(ALICE)).code == 404
    assert await registry.built.expiry.sweep_once() == (0, 2)
    assert registry.take_notes() == [(H2, DISCONNECTED)]


async def test_keep_alive_restarts_the_lifetime(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE, expires=60)
    registry.clock.advance(50)
    # The specs' keep-alive (no value) and Registry.js's refresh (value {status: live}).
    assert (await registry.send("update", {"resource": H1})).code == 200
    registry.clock.advance(50)
    assert (await registry.read(H1)).code == 200
    refresh = {"resource": H1, "value": {"status": "live"}, "method": "refresh"}
    assert (await registry.send("update", refresh)).code == 200
    registry.clock.advance(60)
    assert (await registry.read(H1)).code == 200
    assert await registry.built.expiry.sweep_once() == (0, 0)
    assert registry.take_notes() == [(H1, LIVE)]  # the creation only


async def test_expired_registrations_are_disconnected_then_removed(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE, expires=60)
    await registry.register_hyperty(H2, ALICE, expires=10**9)
    assert (await registry.read(H2)).value["expires"] == MAX_LIFETIME
    registry.take_notes()

    registry.clock.advance(61)
    expired = await registry.read(H1)
    assert expired.code == 408 and expired.value["status"] == DISCONNECTED
    assert (await registry.read(ALICE)).code == 200  # H2 is still live
    assert await registry.built.expiry.sweep_once() == (1, 0)
    assert registry.take_notes() == [(H1, DISCONNECTED)]
    assert await registry.built.expiry.sweep_once() == (0, 0)  # recorded once

    # A keep-alive within the grace period brings it back.
    assert (await registry.send("update", {"resource": H1})).code == 200
    assert registry.take_notes() == [(H1, LIVE)]
    assert (await registry.read(H1)).code == 200

    registry.clock.advance(61)
    # Expired but not yet swept: the keep-alive records the expiry, then the revival.
    assert (await registry.send("update", {"resource": H1})).code == 200
    assert registry.take_notes() == [(H1, DISCONNECTED), (H1, LIVE)]

    registry.clock.advance(61 + GRACE)
    assert (await registry.read(H1)).code == 404
    assert (await registry.send("update", {"resource": H1})).code == 404
    assert (await registry.read(H2)).code == 200
    assert await registry.built.expiry.sweep_once() == (0, 0)  # the keep-alive removed it


async def test_the_expiry_task_runs_until_stopped(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE, expires=60)
    registry.take_notes()
    registry.clock.advance(61)
    registry.built.start()
    for _ in range(200):
        if registry.notes:
            break
        await asyncio.sleep(SWEEP_INTERVAL)
    await registry.built.stop()
    assert registry.take_notes() == [(H1, DISCONNECTED)]
    registry.clock.advance(GRACE)
    await asyncio.sleep(SWEEP_INTERVAL * 3)
    # Stopped: nothing removed it, the next sweep does.
    assert await registry.built.expiry.sweep_once() == (0, 1)


async def test_status_updates_are_notified(registry: Harness) -> None:
    await registry.register_hyperty(H1, ALICE)
    registry.take_notes()
    phase2 = {"resource": H1, "attribute": "status", "value": DISCONNECTED}
    assert (await registry.send("update", phase2)).code == 200
    assert registry.take_notes() == [(H1, DISCONNECTED)]
    assert (await registry.read(ALICE)).code == 408
    # Same status again: no change, no notification.
    assert (await registry.send("update", phase2)).code == 200
    assert registry.take_notes() == []
    assert (
        await registry.send("update", {"resource": H1, "value": {"status": "live"}})
    ).code == 200
    assert registry.take_notes() == [(H1, LIVE)]


async def test_data_objects_by_url_name_and_reporter(registry: Harness) -> None:
    assert (await registry.register_object(CHAT1, "chat", H1)).code == 200
    assert (
        await registry.register_object(CHAT2, "chat", H2, resources=("chat", "file"))
    ).code == 200
    assert (
        await registry.register_object(
            CALL, "call", H1, resources=("audio",), schemes=("connection",)
        )
    ).code == 200

    chat1 = await registry.read(CHAT1)
    assert chat1.code == 200
    assert chat1.value["url"] == CHAT1 and chat1.value["name"] == "chat"
    assert chat1.value["reporter"] == H1 and chat1.value["schema"] == COMM_SCHEMA
    assert (await registry.read(CALL)).value["reporter"] == H1

    assert list((await registry.read("chat")).value) == [CHAT1, CHAT2]
    assert set((await registry.read("/comm", reporter=H1)).value) == {CHAT1, CALL}
    assert set((await registry.read("/dataObject/reporter/" + H2)).value) == {CHAT2}
    assert set((await registry.read("chat", resources=["file"])).value) == {CHAT2}
    assert set((await registry.read("/comm", reporter=H1, dataSchemes=["connection"])).value) == {
        CALL
    }
    filtered_url = await registry.read(CHAT1, resources=["chat"])
    assert filtered_url.code == 200 and set(filtered_url.value) == {CHAT1}
    assert (await registry.read(CHAT1, resources=["audio"])).code == 404
    assert (await registry.read("/comm", reporter=H2, dataSchemes=["connection"])).code == 404

    # Keep-alive, status update and deletion (Registry.js: {value: {name: <url>}}).
    assert (await registry.send("update", {"resource": CHAT1})).code == 200
    assert (await registry.send("delete", {"value": {"name": CHAT1}})).code == 200
    deleted = await registry.read(CHAT1)
    # Data-object lookups answer 200 whatever the status, as the reference does.
    assert deleted.code == 200 and deleted.value["status"] == DISCONNECTED
    assert registry.take_notes()[-1] == (CHAT1, DISCONNECTED)


async def test_presence_follows_the_registering_runtime(registry: Harness) -> None:
    # H1's registration names no runtime: it is the requester's.
    reply = await registry.send(
        "create",
        {
            "value": {
                "user": ALICE,
                "url": H1,
                "descriptor": DESCRIPTOR,
                "expires": 120,
                "resources": ["chat"],
                "dataSchemes": ["comm"],
                "status": "live",
            }
        },
        runtime=RT1,
    )
    assert reply.code == 200
    assert (await registry.read(H1)).value["runtime"] == RT1
    await registry.register_hyperty(H2, ALICE, runtime=RT1)
    await registry.register_hyperty(H3, BOB, runtime=RT2, expires=MAX_LIFETIME)
    await registry.register_object(CHAT1, "chat", H1, runtime=RT1)
    registry.take_notes()
    presence = registry.built.presence

    await presence.runtime_away(claim_of(RT1))
    assert registry.take_notes() == [(H1, DISCONNECTED), (H2, DISCONNECTED), (CHAT1, DISCONNECTED)]
    all_gone = await registry.read(ALICE)
    assert all_gone.code == 408 and all_gone.desc == "Temporarily Unavailable"
    assert {h["status"] for h in all_gone.value.values()} == {DISCONNECTED}
    assert (await registry.read(BOB)).code == 200
    assert (await registry.read(CHAT1)).value["status"] == DISCONNECTED

    registry.clock.advance(200)  # beyond the 120 s lifetime: the resume restarts it
    await presence.runtime_back(claim_of(RT1))
    assert registry.take_notes() == [(H1, LIVE), (H2, LIVE), (CHAT1, LIVE)]
    assert (await registry.read(ALICE)).code == 200
    assert await registry.built.expiry.sweep_once() == (0, 0)

    # Detached beyond the grace period: removed, and a late resume revives nothing.
    await presence.runtime_away(claim_of(RT1))
    registry.take_notes()
    registry.clock.advance(GRACE + 1)
    assert (await registry.read(ALICE)).code == 404
    await presence.runtime_back(claim_of(RT1))
    assert registry.take_notes() == []
    assert (await registry.read(ALICE)).code == 404
    assert await registry.built.expiry.sweep_once() == (0, 3)
    assert (await registry.read(BOB)).code == 200


async def test_a_runtime_that_comes_back_finds_its_registrations_live(registry: Harness) -> None:
    """Its session ended (``disconnect``, a page closed) or its socket dropped: back with the same
    runtimeURL in any session within the grace period, what it registered is live again, as
    dev-registry-domain would answer (only the runtime or the lease changes a status)."""
    await registry.register_hyperty(H1, ALICE, runtime=RT1)
    await registry.register_hyperty(H3, BOB, runtime=RT2)
    registry.take_notes()
    presence = registry.built.presence
    await presence.runtime_away(claim_of(RT1))  # dropped
    await presence.runtime_away(claim_of(RT1))  # then its session ended
    await presence.runtime_away(claim_of(RT2))
    assert registry.take_notes() == [(H1, DISCONNECTED), (H3, DISCONNECTED)]
    assert (await registry.read(BOB)).code == 408
    await presence.runtime_back(claim_of(RT1))
    await presence.runtime_back(claim_of(RT2))
    assert registry.take_notes() == [(H1, LIVE), (H3, LIVE)]
    assert (await registry.read(BOB)).code == 200
    # What its lease ended stays disconnected until the runtime says otherwise, whatever its
    # presence does.
    registry.clock.advance(121)  # beyond their 120 s lease, within the grace period
    await registry.built.expiry.sweep_once()
    assert registry.take_notes() == [(H1, DISCONNECTED), (H3, DISCONNECTED)]
    await presence.runtime_away(claim_of(RT2))
    await presence.runtime_back(claim_of(RT2))
    assert registry.take_notes() == []
    assert (await registry.read(BOB)).code == 408


async def test_a_runtime_back_within_the_presence_delay_changes_nothing(
    registry: Harness,
) -> None:
    built = registry.built.presence
    presence = RegistryPresence(built._store, built._notifier, 0.3)
    await registry.register_hyperty(H1, ALICE, runtime=RT1)
    registry.take_notes()
    await presence.runtime_away(claim_of(RT1))  # a reload: gone and back at once
    await presence.runtime_back(claim_of(RT1))
    await asyncio.sleep(0.5)
    assert registry.take_notes() == [] and (await registry.read(ALICE)).code == 200
    await presence.runtime_away(claim_of(RT1))  # gone for longer than the delay
    await asyncio.sleep(0.5)
    assert registry.take_notes() == [(H1, DISCONNECTED)]
    await presence.runtime_back(claim_of(RT1))
    assert registry.take_notes() == [(H1, LIVE)]
    await presence.stop()


async def test_messages_the_registry_cannot_take(registry: Harness) -> None:
    reply = await registry.send("subscribe", {"resource": H1})
    assert reply.code == 405
    reply = await registry.send("read", {})
    assert (reply.code, reply.desc) == (400, "missing body.resource")

"""Failures inside the built-in registry cost one answer: a storage failure is 503, a bug 500,
a failing notification callback is logged, presence and expiry never raise into the node. And
entries belong to the runtime that registered them: another runtime's writes are 403."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import pytest_asyncio

from adapter.identity.model import Identity
from adapter.services.registry_backend import BuiltinRegistryBackend, StatusNotifier, Writer
from adapter.services.registry_fields import Lifetimes
from adapter.services.registry_http import RestCall
from adapter.services.registry_lifecycle import RegistryExpiry, RegistryPresence
from adapter.storage.database import Database, DatabaseUnavailable
from adapter.storage.registry_models import RegistryEntry
from adapter.storage.registry_store import RegistryStore, StatusChange


class BrokenStore:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def find(self, *args: Any) -> Any:
        raise self.error

    async def detach(self, runtime: str) -> Any:
        raise self.error

    async def sweep(self) -> Any:
        raise self.error


def backend(error: Exception, notifier: StatusNotifier | None = None) -> BuiltinRegistryBackend:
    store: Any = BrokenStore(error)
    return BuiltinRegistryBackend(store, notifier or StatusNotifier(None), Lifetimes(60, 60))


GET_USER = RestCall("GET", ("hyperty", "user", "user://example.com/alice"))


async def test_a_storage_failure_is_503_and_a_bug_500() -> None:
    down = DatabaseUnavailable("connection refused")
    answer = await backend(down).call(GET_USER)
    assert (answer.status, answer.json()) == (
        503,
        {"message": "the registry's storage is unavailable"},
    )
    answer = await backend(KeyError("bug")).call(GET_USER)
    assert (answer.status, answer.json()) == (500, {"message": "Internal Server Error"})


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (RestCall("PUT", ("hyperty", "url", "hyperty://x/1")), 400, "missing request body"),
        (
            RestCall("PUT", ("hyperty", "url", "h"), body=b"{"),
            400,
            "the request body is not valid JSON",
        ),
        (RestCall("PATCH", ("hyperty", "url", "h")), 404, "Not Found"),
        (RestCall("GET", ("hyperty", "user")), 404, "Not Found"),
    ],
)
async def test_requests_refused_before_the_store(call: RestCall, status: int, message: str) -> None:
    answer = await backend(AssertionError("the store must not be reached")).call(call)
    assert (answer.status, answer.json()) == (status, {"message": message})


async def test_a_failing_callback_costs_its_notification_only() -> None:
    seen: list[tuple[str, str]] = []

    async def callback(url: str, status: str) -> None:
        if url == "hyperty://x/bad":
            raise RuntimeError("subscriber gone")
        seen.append((url, status))

    changes = [StatusChange("hyperty://x/bad", "live"), StatusChange("hyperty://x/2", "live")]
    await StatusNotifier(callback).publish(changes)
    assert seen == [("hyperty://x/2", "live")]


async def test_presence_and_expiry_do_not_raise_into_the_node() -> None:
    store: Any = BrokenStore(DatabaseUnavailable("down"))
    presence = RegistryPresence(store, StatusNotifier(None))
    await presence.runtime_away("runtime://example.com/1")  # logged, not raised
    expiry = RegistryExpiry(store, StatusNotifier(None), 60)
    with pytest.raises(DatabaseUnavailable):
        await expiry.sweep_once()  # the task's loop catches it; a direct call sees it


# -- who may change an entry -------------------------------------------------------------------
# A real store on an in-memory SQLite database: the check and the write are one transaction.

RT1, RT2 = "runtime://example.com/1", "runtime://example.com/2"
ALICE, BOB = "user://example.com/alice", "user://example.com/bob"
H1, H2 = "hyperty://example.com/h-1", "hyperty://example.com/h-2"
CHAT = "comm://example.com/chat-1"
_CHAT_URL = ("hyperty", "dataobject", "url", CHAT)
HYPERTY = {
    "descriptor": "hyperty-catalogue://catalogue.example.com/.well-known/hyperty/Connector",
    "resources": ["chat"],
    "dataSchemes": ["comm"],
    "status": "live",
    "expires": 120,
}
CHAT_OBJECT = {
    "name": "chat",
    "schema": "hyperty-catalogue://catalogue.example.com/.well-known/dataschema/Communication",
    "reporter": H1,
    "resources": ["chat"],
    "dataSchemes": ["comm"],
    "status": "live",
    "expires": 120,
}
ALICE_OIDC = Identity(
    user_id=ALICE,
    idp_domain="example.com",
    method="oidc",
    authenticated=True,
    username="alice@example.com",
)


def writer(runtime: str | None, identity: Identity | None = None) -> Writer | None:
    """A runtime writing through the MN, its claim named after it (one credential each)."""
    return None if runtime is None else Writer(runtime, f"claim-of-{runtime}", identity)


@dataclass
class Real:
    backend: BuiltinRegistryBackend
    notes: list[tuple[str, str]]

    async def put(
        self,
        segments: tuple[str, ...],
        body: dict[str, Any],
        runtime: str | None,
        identity: Identity | None = None,
    ) -> tuple[int, Any]:
        call = RestCall("PUT", segments, body=orjson.dumps(body))
        answer = await self.backend.call(call, writer=writer(runtime, identity))
        return answer.status, answer.json()

    async def delete(self, segments: tuple[str, ...], runtime: str | None) -> tuple[int, Any]:
        answer = await self.backend.call(RestCall("DELETE", segments), writer=writer(runtime))
        return answer.status, answer.json()

    async def get(self, segments: tuple[str, ...]) -> Any:
        answer = await self.backend.call(RestCall("GET", segments))
        assert answer.status in (200, 408), answer
        return answer.json()


@pytest_asyncio.fixture(loop_scope="session")
async def real() -> AsyncIterator[Real]:
    db = Database("sqlite:///:memory:")
    await db.run(lambda conn: RegistryEntry.__table__.create(conn))
    notes: list[tuple[str, str]] = []

    async def note(url: str, status: str) -> None:
        notes.append((url, status))

    store = RegistryStore(db, grace_seconds=300)
    yield Real(BuiltinRegistryBackend(store, StatusNotifier(note), Lifetimes(600, 1000)), notes)
    await db.dispose()


def _hyperty(runtime: str, **fields: Any) -> dict[str, Any]:
    return {**HYPERTY, "runtime": runtime, **fields}


FOREIGN_H1 = (
    f"{H1} is registered by another runtime: only the runtime that registered it may "
    "replace, update, keep alive or delete it"
)
FOREIGN_CHAT = FOREIGN_H1.replace(H1, CHAT)

# (method, segments, body) of every write RT2 may try on RT1's entries.
ATTACKS = [
    ("PUT", ("hyperty", "user", ALICE, H1), _hyperty(RT2, p2pHandler=f"{RT2}/p2phandler")),
    ("PUT", ("hyperty", "url", H1), {"runtime": RT2, "descriptor": "hyperty-catalogue://evil"}),
    ("PUT", ("hyperty", "url", H1), {"status": "disconnected"}),
    ("PUT", ("hyperty", "url", H1), {}),
    ("DELETE", ("hyperty", "user", ALICE, H1), None),
    ("PUT", ("hyperty", "dataobject", CHAT), {**CHAT_OBJECT, "runtime": RT2, "name": "mine"}),
    ("PUT", ("dataobject", "url", CHAT), {"reporter": H2, "runtime": RT2}),
    ("PUT", ("dataobject", "url", CHAT), {}),
    ("DELETE", ("hyperty", "dataobject", "url", CHAT), None),
]


@pytest.mark.parametrize(("method", "segments", "body"), ATTACKS)
async def test_another_runtimes_write_is_403_and_changes_nothing(
    real: Real, method: str, segments: tuple[str, ...], body: dict[str, Any] | None
) -> None:
    assert (await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1))[0] == 200
    chat = {**CHAT_OBJECT, "runtime": RT1}
    assert (await real.put(("hyperty", "dataobject", CHAT), chat, RT1))[0] == 200
    before = (await real.get(("hyperty", "url", H1)), await real.get(_CHAT_URL))
    real.notes.clear()

    if method == "PUT":
        assert body is not None
        status, answer = await real.put(segments, body, RT2)
    else:
        status, answer = await real.delete(segments, RT2)
    foreign = FOREIGN_CHAT if CHAT in segments else FOREIGN_H1
    assert (status, answer) == (403, {"message": foreign})
    assert (await real.get(("hyperty", "url", H1)), await real.get(_CHAT_URL)) == before
    assert real.notes == []
    # The owner's own writes go on as before.
    if method == "PUT":
        assert body is not None
        assert (await real.put(segments, {**body, "runtime": RT1}, RT1))[0] == 200
    else:
        assert (await real.delete(segments, RT1))[0] == 200


async def test_the_operator_is_not_checked(real: Real) -> None:
    """Calls without a runtime (the REST API) are the operator's."""
    await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1)
    assert (await real.put(("hyperty", "url", H1), {}, None))[0] == 200
    assert (await real.put(("hyperty", "url", H1), {"status": "created"}, None))[0] == 200
    assert (await real.delete(("hyperty", "user", ALICE, H1), None))[0] == 200
    # Registered by the operator, the entry is the operator's: no runtime's credential stands
    # behind it, so no runtime changes it, not even the one it names.
    assert (await real.put(("hyperty", "user", BOB, H2), _hyperty(RT2), None))[0] == 200
    assert (await real.put(("hyperty", "url", H2), {}, RT1))[0] == 403
    assert (await real.put(("hyperty", "url", H2), {}, RT2))[0] == 403
    assert (await real.put(("hyperty", "url", H2), {}, None))[0] == 200


async def test_an_anonymous_runtime_cannot_register_under_a_held_user(real: Real) -> None:
    assert (await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1))[0] == 200
    status, answer = await real.put(("hyperty", "user", ALICE, H2), _hyperty(RT2), RT2)
    assert (status, answer) == (
        403,
        {
            "message": f"{ALICE} is held by another runtime's registrations: one user on "
            "several devices needs verified identities"
        },
    )
    assert list(await real.get(("hyperty", "user", ALICE))) == [H1]
    # The holder adds hyperties under it and registers its own again (a page reload).
    assert (await real.put(("hyperty", "user", ALICE, H2), _hyperty(RT1), RT1))[0] == 200
    assert (await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1))[0] == 200


async def test_a_verified_runtime_registers_under_its_own_user_only() -> None:
    # Refused before the store is reached.
    status, answer = await Real(backend(AssertionError("no store")), []).put(
        ("hyperty", "user", BOB, H1), _hyperty(RT1), RT1, ALICE_OIDC
    )
    assert (status, answer) == (
        403,
        {
            "message": f"the runtime is authenticated as {ALICE}: it registers hyperties "
            f"under that user, not {BOB}"
        },
    )


async def test_a_verified_user_is_not_blocked_by_an_anonymous_holder(real: Real) -> None:
    # RT1, anonymous, registered first under Alice's user URL; RT2 is Alice.
    assert (await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1))[0] == 200
    real.notes.clear()
    alice = await real.put(("hyperty", "user", ALICE, H2), _hyperty(RT2), RT2, ALICE_OIDC)
    assert alice[0] == 200
    # What RT1 registered there was never Alice's: it is gone, and stays out.
    assert list(await real.get(("hyperty", "user", ALICE))) == [H2]
    assert real.notes == [(H1, "disconnected"), (H2, "live")]
    assert (await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1))[0] == 403
    # Alice on another device (another verified runtime) keeps what RT2 registered.
    other_device = "runtime://example.com/3"
    shouting = Identity(
        user_id=ALICE.replace("example.com", "EXAMPLE.com"),
        idp_domain="example.com",
        method="oidc",
        authenticated=True,
    )
    hyperty_3 = "hyperty://example.com/h-3"
    # A user URL's host compares case-insensitively (its user part does not).
    segments = ("hyperty", "user", ALICE, hyperty_3)
    assert (await real.put(segments, _hyperty(other_device), other_device, shouting))[0] == 200
    assert list(await real.get(("hyperty", "user", ALICE))) == [H2, hyperty_3]


async def test_a_requests_status_changes_wait_for_its_caller_to_publish_them(real: Real) -> None:
    """Through the MN the answer goes first and the publications it causes after it (else a
    runtime subscribed to its own registration hears the publication in place of the answer)."""
    assert (await real.put(("hyperty", "user", ALICE, H1), _hyperty(RT1), RT1))[0] == 200
    real.notes.clear()
    changes: list[Any] = []
    call = RestCall("PUT", ("hyperty", "url", H1), body=orjson.dumps({"status": "disconnected"}))
    answer = await real.backend.call(call, writer=writer(RT1), changes=changes)
    assert answer.status == 200
    assert real.notes == [] and [(c.url, c.status) for c in changes] == [(H1, "disconnected")]
    await real.backend.publish(changes)
    assert real.notes == [(H1, "disconnected")]

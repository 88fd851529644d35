"""Failures inside the built-in registry cost one answer: a storage failure is 503, a bug 500,
a failing notification callback is logged, presence and expiry never raise into the node."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from adapter.services.registry_backend import BuiltinRegistryBackend, StatusNotifier
from adapter.services.registry_fields import Lifetimes
from adapter.services.registry_http import RestCall
from adapter.services.registry_lifecycle import RegistryExpiry, RegistryPresence
from adapter.storage.registry_store import StatusChange


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
    down = OperationalError("SELECT", {}, Exception("connection refused"))
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
    store: Any = BrokenStore(OperationalError("UPDATE", {}, Exception("down")))
    presence = RegistryPresence(store, StatusNotifier(None))
    await presence.runtime_detached("runtime://example.com/1")  # logged, not raised
    expiry = RegistryExpiry(store, StatusNotifier(None), 60)
    with pytest.raises(OperationalError):
        await expiry.sweep_once()  # the task's loop catches it; a direct call sees it

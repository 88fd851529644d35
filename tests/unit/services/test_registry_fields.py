"""The built-in registry's records: what a creation or update must carry, how entries answer."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from adapter.services.registry_fields import (
    InvalidRecord,
    Lifetimes,
    creation,
    data_object_json,
    hyperty_json,
    matches,
    update,
    user_email,
)
from adapter.storage.registry_models import EntryKind
from adapter.storage.registry_store import Entry

LIFETIMES = Lifetimes(default_seconds=600, max_seconds=3600)
HYPERTY = {
    "descriptor": "hyperty-catalogue://example.com/.well-known/hyperty/Chat",
    "resources": ["chat"],
    "dataSchemes": ["comm"],
    "status": "live",
    "runtime": "runtime://example.com/1",
    "expires": 120,
}
T0 = datetime(2026, 11, 24, 10, 0, 0, 500_000, tzinfo=UTC)


def test_a_hyperty_creation_keeps_every_field_of_its_kind() -> None:
    values = creation(
        EntryKind.HYPERTY, {**HYPERTY, "guid": "user-guid://g", "extra": 1}, LIFETIMES
    )
    assert values == {
        "descriptor": HYPERTY["descriptor"],
        "resources": ["chat"],
        "data_schemes": ["comm"],
        "status": "live",
        "runtime": "runtime://example.com/1",
        "p2p_requester": None,
        "p2p_handler": None,
        "guid": "user-guid://g",
        "expires": 120,
    }


@pytest.mark.parametrize(
    ("kind", "body", "missing"),
    [
        (EntryKind.HYPERTY, {}, "descriptor, resources, dataSchemes, status, runtime"),
        (EntryKind.HYPERTY, {**HYPERTY, "status": None, "runtime": None}, "status, runtime"),
        (EntryKind.DATA_OBJECT, {**HYPERTY}, "schema, name, reporter"),
    ],
)
def test_a_creation_without_required_fields_names_them(
    kind: EntryKind, body: dict[str, Any], missing: str
) -> None:
    with pytest.raises(InvalidRecord) as info:
        creation(kind, body, LIFETIMES)
    assert info.value.desc == f"missing fields: {missing}"


@pytest.mark.parametrize(
    ("field", "value", "desc"),
    [
        ("resources", "chat", "resources must be a list of strings"),
        ("dataSchemes", [1], "dataSchemes must be a list of strings"),
        ("status", 3, "status must be a string"),
        ("status", "x" * 65, "status is longer than 64 characters"),
        ("runtime", "", "runtime must not be empty"),
        ("expires", -1, "expires must be a whole number of seconds, 0 or more"),
        ("expires", True, "expires must be a whole number of seconds, 0 or more"),
        ("expires", 1.5, "expires must be a whole number of seconds, 0 or more"),
        ("guid", "g" * 1025, "guid is longer than 1024 characters"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(field: str, value: Any, desc: str) -> None:
    with pytest.raises(InvalidRecord) as info:
        creation(EntryKind.HYPERTY, {**HYPERTY, field: value}, LIFETIMES)
    assert info.value.desc == desc


def test_the_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRecord, match="JSON object"):
        creation(EntryKind.HYPERTY, ["descriptor"], LIFETIMES)
    with pytest.raises(InvalidRecord, match="JSON object"):
        update(EntryKind.HYPERTY, "live", LIFETIMES)


def test_expires_defaults_to_the_lifetime_and_is_cut_to_the_maximum() -> None:
    body = {key: value for key, value in HYPERTY.items() if key != "expires"}
    assert creation(EntryKind.HYPERTY, body, LIFETIMES)["expires"] == 600
    assert creation(EntryKind.HYPERTY, {**body, "expires": 10**9}, LIFETIMES)["expires"] == 3600
    assert creation(EntryKind.HYPERTY, {**body, "expires": 0}, LIFETIMES)["expires"] == 0
    assert update(EntryKind.HYPERTY, {"expires": 10**9}, LIFETIMES) == {"expires": 3600}


def test_the_requesting_runtime_stands_in_for_a_missing_runtime_field() -> None:
    body = {key: value for key, value in HYPERTY.items() if key != "runtime"}
    assert creation(EntryKind.HYPERTY, body, LIFETIMES, "runtime://r/2")["runtime"] == (
        "runtime://r/2"
    )
    # A runtime the registration names is kept as named.
    assert creation(EntryKind.HYPERTY, HYPERTY, LIFETIMES, "runtime://r/2")["runtime"] == (
        "runtime://example.com/1"
    )


def test_an_update_takes_the_known_non_null_fields_only() -> None:
    body = {"status": "disconnected", "user": "alice@example.com", "descriptor": None, "guid": "g"}
    assert update(EntryKind.HYPERTY, body, LIFETIMES) == {"status": "disconnected", "guid": "g"}
    # guid and p2pHandler are hyperty fields, name and reporter data-object fields.
    assert update(EntryKind.DATA_OBJECT, {**body, "name": "chat"}, LIFETIMES) == {
        "status": "disconnected",
        "name": "chat",
    }


@pytest.mark.parametrize(
    ("user", "email"),
    [
        ("user://google.com/alice@gmail.com", "alice@gmail.com"),
        ("user://example.com/alice/", "alice"),
        ("alice@example.com", "alice@example.com"),
    ],
)
def test_the_email_is_the_last_piece_of_the_user_url(user: str, email: str) -> None:
    assert user_email(user) == email


def _entry(**overrides: Any) -> Entry:
    values: dict[str, Any] = {
        "id": 1,
        "kind": EntryKind.HYPERTY,
        "url": "hyperty://example.com/1",
        "user_url": "user://example.com/alice",
        "email": "alice",
        "guid": None,
        "descriptor": "hyperty-catalogue://example.com/Chat",
        "p2p_handler": None,
        "name": None,
        "object_schema": None,
        "reporter": None,
        "resources": ["chat", "video"],
        "data_schemes": ["comm", "connection"],
        "status": "live",
        "runtime": "runtime://example.com/1",
        "owner": "runtime://example.com/1",
        "p2p_requester": None,
        "expires": 120,
        "starting_time": T0,
        "last_modified": T0,
        "expires_at": T0,
        "disconnected_at": None,
        "detached": False,
    }
    return Entry(**{**values, **overrides})


def test_filters_need_every_requested_resource_and_scheme() -> None:
    entry = _entry()
    assert matches(entry, {"resources": ("chat",)})
    assert matches(entry, {"resources": ("video", "chat"), "dataSchemes": ("comm",)})
    assert not matches(entry, {"resources": ("chat", "audio")})
    assert not matches(entry, {"resources": ("chat",), "dataSchemes": ("ctxt",)})


def test_entries_answer_with_the_reference_names_and_no_nulls() -> None:
    assert hyperty_json(_entry()) == {
        "resources": ["chat", "video"],
        "dataSchemes": ["comm", "connection"],
        "descriptor": "hyperty-catalogue://example.com/Chat",
        "startingTime": "2026-11-24T10:00:00Z",
        "hypertyID": "hyperty://example.com/1",
        "userID": "user://example.com/alice",
        "lastModified": "2026-11-24T10:00:00Z",
        "status": "live",
        "expires": 120,
        "runtime": "runtime://example.com/1",
    }
    chat = _entry(
        kind=EntryKind.DATA_OBJECT,
        url="comm://example.com/chat",
        user_url=None,
        email=None,
        name="chat",
        object_schema="hyperty-catalogue://example.com/.well-known/dataschema/Communication",
        reporter="hyperty://example.com/1",
        p2p_requester="runtime://example.com/1/p2prequester",
    )
    assert data_object_json(chat) == {
        "schema": "hyperty-catalogue://example.com/.well-known/dataschema/Communication",
        "url": "comm://example.com/chat",
        "reporter": "hyperty://example.com/1",
        "name": "chat",
        "status": "live",
        "expires": 120,
        "startingTime": "2026-11-24T10:00:00Z",
        "resources": ["chat", "video"],
        "dataSchemes": ["comm", "connection"],
        "lastModified": "2026-11-24T10:00:00Z",
        "runtime": "runtime://example.com/1",
        "p2pRequester": "runtime://example.com/1/p2prequester",
    }

"""dev-registry-domain's records: what a creation or an update must carry, and what a lookup
answers. Pure functions, no I/O.

Sources (reTHINK-project/dev-registry-domain, server/): RequestValidParams.java (the creation
fields that must be present), HypertyInstance.java / DataObjectInstance.java (the fields kept and
their JSON names), HypertyService.java (EXPIRES_MAX cuts a longer `expires`), RamClient.java
(a user's e-mail is the last segment of the user URL), AdvancedSearch.java (the filters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from ..storage.registry_models import KEY_LENGTH, STATUS_LENGTH, EntryKind
from ..storage.registry_store import Entry

# The reference refuses a creation without these (400). `expires` is required there too; here a
# creation without it gets the configured lifetime (every runtime sends it anyway).
HYPERTY_REQUIRED: Final = ("descriptor", "resources", "dataSchemes", "status", "runtime")
DATA_OBJECT_REQUIRED: Final = (
    "schema",
    "name",
    "reporter",
    "resources",
    "dataSchemes",
    "status",
    "runtime",
)
FILTERS: Final = ("resources", "dataSchemes")


class InvalidRecord(Exception):
    """A creation or update the registry refuses with 400; ``desc`` says why."""

    def __init__(self, desc: str) -> None:
        super().__init__(desc)
        self.desc = desc


@dataclass(frozen=True, slots=True)
class Lifetimes:
    default_seconds: int
    max_seconds: int


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(f"{name} must be a string")
    return value


def valid_key(name: str, value: Any) -> str:
    """A string the registry indexes: not empty, at most KEY_LENGTH characters."""
    text = _text(name, value)
    if not text:
        raise InvalidRecord(f"{name} must not be empty")
    if len(text) > KEY_LENGTH:
        raise InvalidRecord(f"{name} is longer than {KEY_LENGTH} characters")
    return text


def _status(name: str, value: Any) -> str:
    text = valid_key(name, value)
    if len(text) > STATUS_LENGTH:
        raise InvalidRecord(f"{name} is longer than {STATUS_LENGTH} characters")
    return text


def _strings(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidRecord(f"{name} must be a list of strings")
    return list(value)


def _seconds(name: str, value: Any) -> int:
    # bool is an int in Python, not in JSON.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRecord(f"{name} must be a whole number of seconds, 0 or more")
    return value


# JSON field -> (column, check). One table for both kinds: which fields a kind takes is below.
_FIELDS: Final[dict[str, tuple[str, Callable[[str, Any], Any]]]] = {
    "descriptor": ("descriptor", _text),
    "resources": ("resources", _strings),
    "dataSchemes": ("data_schemes", _strings),
    "status": ("status", _status),
    "runtime": ("runtime", valid_key),
    "p2pRequester": ("p2p_requester", _text),
    "p2pHandler": ("p2p_handler", _text),
    "guid": ("guid", valid_key),
    "expires": ("expires", _seconds),
    "schema": ("object_schema", _text),
    "name": ("name", valid_key),
    "reporter": ("reporter", valid_key),
}
_KIND_FIELDS: Final = {
    EntryKind.HYPERTY: (
        "descriptor",
        "resources",
        "dataSchemes",
        "status",
        "runtime",
        "p2pRequester",
        "p2pHandler",
        "guid",
        "expires",
    ),
    EntryKind.DATA_OBJECT: (
        "schema",
        "name",
        "reporter",
        "resources",
        "dataSchemes",
        "status",
        "runtime",
        "p2pRequester",
        "expires",
    ),
}
_REQUIRED: Final = {
    EntryKind.HYPERTY: HYPERTY_REQUIRED,
    EntryKind.DATA_OBJECT: DATA_OBJECT_REQUIRED,
}


def creation(
    kind: EntryKind, body: Any, lifetimes: Lifetimes, runtime: str | None = None
) -> dict[str, Any]:
    """The columns of a new registration (every column of its kind: a creation replaces an
    existing entry whole, as the reference does). ``runtime`` stands in for a missing
    ``runtime`` field: the MN knows which runtime sent the registration."""
    if not isinstance(body, dict):
        raise InvalidRecord("the request body must be a JSON object")
    if runtime is not None and body.get("runtime") is None:
        body = {**body, "runtime": runtime}
    missing = [name for name in _REQUIRED[kind] if body.get(name) is None]
    if missing:
        raise InvalidRecord(f"missing fields: {', '.join(missing)}")
    values: dict[str, Any] = {}
    for name in _KIND_FIELDS[kind]:
        column, check = _FIELDS[name]
        raw = body.get(name)
        values[column] = None if raw is None else check(name, raw)
    values["expires"] = _lifetime(values["expires"], lifetimes)
    return values


def update(kind: EntryKind, body: Any, lifetimes: Lifetimes) -> dict[str, Any]:
    """The columns a field update changes: the kind's fields present and not null (the
    reference merges the non-null fields over the stored ones and ignores unknown keys)."""
    if not isinstance(body, dict):
        raise InvalidRecord("the request body must be a JSON object")
    values: dict[str, Any] = {}
    for name in _KIND_FIELDS[kind]:
        raw = body.get(name)
        if raw is not None:
            column, check = _FIELDS[name]
            values[column] = check(name, raw)
    if "expires" in values:
        values["expires"] = _lifetime(values["expires"], lifetimes)
    return values


def _lifetime(expires: int | None, lifetimes: Lifetimes) -> int:
    if expires is None:
        return lifetimes.default_seconds
    return min(expires, lifetimes.max_seconds)


def user_email(user_url: str) -> str:
    """'user://google.com/alice@gmail.com' -> 'alice@gmail.com': the last non-empty piece after
    a '/', which is how the reference files hyperties under an e-mail (Java's split drops
    trailing empty pieces)."""
    pieces = user_url.split("/")
    while pieces and not pieces[-1]:
        pieces.pop()
    return pieces[-1] if pieces else ""


def matches(entry: Entry, filters: Mapping[str, tuple[str, ...]]) -> bool:
    """Every requested resource type among the entry's resources, every requested scheme among
    its data schemes."""
    return set(filters.get("resources", ())) <= set(entry.resources) and set(
        filters.get("dataSchemes", ())
    ) <= set(entry.data_schemes)


def _timestamp(value: datetime) -> str:
    # The reference's format (Dates.java), in UTC.
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hyperty_json(entry: Entry) -> dict[str, Any]:
    """A hyperty as the reference answers it (Gson: absent values are left out)."""
    return _without_nulls(
        {
            "resources": entry.resources,
            "dataSchemes": entry.data_schemes,
            "descriptor": entry.descriptor,
            "startingTime": _timestamp(entry.starting_time),
            "hypertyID": entry.url,
            "userID": entry.user_url,
            "lastModified": _timestamp(entry.last_modified),
            "status": entry.status,
            "expires": entry.expires,
            "guid": entry.guid,
            "runtime": entry.runtime,
            "p2pRequester": entry.p2p_requester,
            "p2pHandler": entry.p2p_handler,
        }
    )


def data_object_json(entry: Entry) -> dict[str, Any]:
    return _without_nulls(
        {
            "schema": entry.object_schema,
            "url": entry.url,
            "reporter": entry.reporter,
            "name": entry.name,
            "status": entry.status,
            "expires": entry.expires,
            "startingTime": _timestamp(entry.starting_time),
            "resources": entry.resources,
            "dataSchemes": entry.data_schemes,
            "lastModified": _timestamp(entry.last_modified),
            "runtime": entry.runtime,
            "p2pRequester": entry.p2p_requester,
        }
    )


def _without_nulls(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if value is not None}

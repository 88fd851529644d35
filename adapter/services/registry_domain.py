"""reTHINK registry messages -> dev-registry-domain REST calls, and REST answers -> replies.

Pure functions, no I/O, so every mapping can be checked on its own. The message forms are the
ones the runtime (dev-runtime-core Registry.js and CoreDiscovery.js), the specs
(messages/registration-messages.md) and the conformance tests (specs tests/msg-node
registration.spec.js) send; the REST side is the registry's HypertyController.java and the
reference connector (dev-registry-domain connector/src). docs/registry-connector.md has the
table with sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..envelope import Message
from .base import ServiceReply
from .registry_http import INVALID_JSON, RestAnswer, RestCall, json_body

# URL schemes the reference connector files under hyperties; every other scheme is a data object.
HYPERTY_SCHEMES: Final = frozenset({"hyperty", "user", "hyperty-runtime", "user-guid"})

# The value fields the reference connector forwards, in its order. Only present keys are sent (the
# JavaScript connector's JSON.stringify drops undefined ones); the registry ignores other keys, and
# some versions of it refuse a creation carrying unknown ones.
HYPERTY_CREATE_FIELDS: Final = (
    "descriptor",
    "expires",
    "resources",
    "dataSchemes",
    "status",
    "runtime",
    "p2pRequester",
    "p2pHandler",
    "guid",
)
HYPERTY_UPDATE_FIELDS: Final = HYPERTY_CREATE_FIELDS[:-1]
DATA_OBJECT_FIELDS: Final = (
    "name",
    "schema",
    "url",
    "reporter",
    "expires",
    "dataSchemes",
    "resources",
    "status",
    "runtime",
    "p2pRequester",
)
FILTERS: Final = ("resources", "dataSchemes")
OPERATIONS: Final = ("create", "read", "update", "delete")


class BadRegistryRequest(Exception):
    """The message cannot be mapped; ``code`` and ``desc`` are the answer."""

    def __init__(self, desc: str, code: int = 400) -> None:
        super().__init__(desc)
        self.code = code
        self.desc = desc


def domain_call(message: Message) -> RestCall:
    """The REST call for a create/read/update/delete message to ``domain://registry.<d>``."""
    body = message.body
    if message.type == "create":
        return _create(body)
    if message.type == "read":
        return _read(body)
    if message.type == "update":
        return _update(body)
    if message.type == "delete":
        return _delete(body)
    raise BadRegistryRequest(
        f"the domain registry connector handles {', '.join(OPERATIONS)}; got type '{message.type}'",
        code=405,
    )


def domain_reply(call: RestCall, answer: RestAnswer) -> ServiceReply:
    """The registry's status is the answer code. A lookup carries the registry's JSON as value on
    200, and on 408 (entries exist but are all disconnected: reTHINK's 'Temporarily
    Unavailable'). Errors carry no value: the runtime takes any body.value as a hit."""
    status = answer.status
    if call.method == "GET" and status in (200, 408):
        parsed = answer.json()
        if parsed is INVALID_JSON:
            return ServiceReply(502, desc="the domain registry answered with malformed JSON")
        return ServiceReply(
            status, value=parsed, desc=None if status == 200 else "Temporarily Unavailable"
        )
    if 200 <= status < 300:
        # Writes answer the code alone, as the reference connector does; the registry's own
        # text ("Hyperty created") adds nothing the runtime reads.
        return ServiceReply(status)
    return ServiceReply(status, desc=_registry_message(answer))


def _registry_message(answer: RestAnswer) -> str:
    parsed = answer.json()
    if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        return str(parsed["message"])
    return f"the domain registry answered HTTP {answer.status}"


# --- create -------------------------------------------------------------------------------


def _create(body: Mapping[str, Any]) -> RestCall:
    value = _object(body, "value", "body.value")
    url = _text(value, "url", "body.value.url")
    if is_hyperty_url(url):
        user = _text(value, "user", "body.value.user")
        return _put(("hyperty", "user", user, url), _pick(value, HYPERTY_CREATE_FIELDS))
    return _put(("hyperty", "dataobject", url), _pick(value, DATA_OBJECT_FIELDS))


# --- read ---------------------------------------------------------------------------------


def _read(body: Mapping[str, Any]) -> RestCall:
    resource = _text(body, "resource", "body.resource")
    criteria = _criteria(body)
    if resource.startswith("/"):
        return _read_path_form(resource, criteria)
    scheme = url_scheme(resource)
    if scheme == "user":
        return _hyperties_of("user", resource, criteria)
    if scheme == "user-guid":
        return _get(("hyperty", "guid", resource))
    if scheme in HYPERTY_SCHEMES:
        return _get(("hyperty", "url", resource))
    if "reporter" in criteria:
        return _objects_by(
            "reporter", _text(criteria, "reporter", "body.criteria.reporter"), criteria
        )
    # A URL is looked up as a URL whatever its scheme (the reference connector did so only for
    # comm://, sending connection://, ctxt://… to the by-name lookup, which cannot find them).
    return _objects_by("url" if scheme else "name", resource, criteria)


def _read_path_form(resource: str, criteria: Mapping[str, Any]) -> RestCall:
    """``/<type>/<kind>/<key>`` resources: the specs' "/hyperty/user/<userURL>", CoreDiscovery's
    "/hyperty/idp-identifier/<email>", "/dataObject/name/<name>", "/comm" + criteria.reporter."""
    kind_of, kind, key = split_path_resource(resource)
    if kind_of == "hyperty":
        return _read_hyperty_path(resource, kind, key, criteria)
    if kind in ("url", "name", "reporter"):
        return _objects_by(kind, _nonempty(key, resource), criteria)
    if kind is None and key:
        return _objects_by("url", key, criteria)
    if kind is None and "reporter" in criteria:
        return _objects_by(
            "reporter", _text(criteria, "reporter", "body.criteria.reporter"), criteria
        )
    if kind is None:
        raise BadRegistryRequest(
            f"'{resource}' names no data object: missing body.criteria.reporter"
        )
    raise BadRegistryRequest(
        f"the domain registry has no data object lookup by '{kind}' ({resource}); "
        "look up the user's hyperties, then their data objects by reporter"
    )


def _read_hyperty_path(
    resource: str, kind: str | None, key: str, criteria: Mapping[str, Any]
) -> RestCall:
    key = _nonempty(key, resource)
    if kind == "user":
        return _hyperties_of("user", key, criteria)
    if kind in ("idp-identifier", "email"):
        return _hyperties_of("email", key, criteria)
    if kind == "guid":
        return _get(("hyperty", "guid", key))
    if kind in ("url", None):
        return _get(("hyperty", "url", key))
    raise BadRegistryRequest(f"the domain registry has no hyperty lookup by '{kind}' ({resource})")


def _hyperties_of(kind: str, key: str, criteria: Mapping[str, Any]) -> RestCall:
    # The filtered search lives one segment deeper: /hyperty/user/<u>/hyperty?resources=…
    query = _filters(criteria)
    segments = ("hyperty", kind, key, "hyperty") if query else ("hyperty", kind, key)
    return RestCall("GET", segments, query)


def _objects_by(kind: str, key: str, criteria: Mapping[str, Any]) -> RestCall:
    query = _filters(criteria)
    base = ("hyperty", "dataobject", kind, key)
    return RestCall("GET", (*base, "do") if query else base, query)


def split_path_resource(resource: str) -> tuple[str, str | None, str]:
    """'/hyperty/user/user://a/b' -> ('hyperty', 'user', 'user://a/b');
    '/hyperty/hyperty://a/1' -> ('hyperty', None, 'hyperty://a/1'); '/comm' -> ('comm', None, '').
    The type is lowercased ('dataObject' and 'dataobject' both occur)."""
    kind_of, _, rest = resource[1:].partition("/")
    if not rest or url_scheme(rest):
        return kind_of.lower(), None, rest
    kind, _, key = rest.partition("/")
    return kind_of.lower(), kind, key


# --- update -------------------------------------------------------------------------------


def _update(body: Mapping[str, Any]) -> RestCall:
    target, hyperty = _update_target(_text(body, "resource", "body.resource"))
    fields = HYPERTY_UPDATE_FIELDS if hyperty else DATA_OBJECT_FIELDS
    data = _update_fields(body, fields)
    # Hyperties are updated under /hyperty/url/, data objects under /dataobject/url/ (no
    # /hyperty prefix): the registry's routes differ, and '{}' is its keep-alive.
    if hyperty:
        return _put(("hyperty", "url", target), data)
    return _put(("dataobject", "url", target), data)


def _update_target(resource: str) -> tuple[str, bool]:
    if not resource.startswith("/"):
        return resource, is_hyperty_url(resource)
    kind_of, kind, key = split_path_resource(resource)
    if kind not in (None, "url") or not key:
        raise BadRegistryRequest(f"body.resource '{resource}' names no registry entry to update")
    return key, kind_of == "hyperty"


def _update_fields(body: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    value = body.get("value")
    if isinstance(value, dict):
        return _pick(value, fields)
    attribute = body.get("attribute")
    if value is not None and isinstance(attribute, str) and attribute in fields:
        # The specs' phase-2 form: {"attribute": "status", "value": "disconnected"}.
        return {attribute: value}
    # No value the registry can store: the update is the spec's keep-alive, as in the
    # reference connector (the conformance test sends a dummy value with attribute "attribute").
    return {}


# --- delete -------------------------------------------------------------------------------


def _delete(body: Mapping[str, Any]) -> RestCall:
    value = _optional_object(body, "value", "body.value")
    resource = _optional_text(body, "resource", "body.resource")
    url = _optional_text(value, "url", "body.value.url") or resource
    if url is not None and is_hyperty_url(url):
        user = _text(value, "user", "body.value.user")
        return RestCall("DELETE", ("hyperty", "user", user, url))
    # The runtime deletes a data object with {value: {name: <object url>}} (Registry.js
    # deleteDataObjectInstance); the reference connector sends that name as the URL.
    key = url or _optional_text(value, "name", "body.value.name")
    if key is None:
        raise BadRegistryRequest("missing body.value.url (or body.value.name, body.resource)")
    return RestCall("DELETE", ("hyperty", "dataobject", "url", key))


# --- helpers ------------------------------------------------------------------------------


def url_scheme(text: str) -> str | None:
    scheme, sep, _ = text.partition("://")
    if not sep or not scheme or "/" in scheme:
        return None
    return scheme.lower()


def is_hyperty_url(url: str) -> bool:
    return url_scheme(url) in HYPERTY_SCHEMES


def _get(segments: tuple[str, ...]) -> RestCall:
    return RestCall("GET", segments)


def _put(segments: tuple[str, ...], data: dict[str, Any]) -> RestCall:
    body, content_type = json_body(data)
    return RestCall("PUT", segments, body=body, content_type=content_type)


def _pick(value: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {name: value[name] for name in fields if name in value}


def _criteria(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return _optional_object(body, "criteria", "body.criteria")


def _filters(criteria: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    found: list[tuple[str, tuple[str, ...]]] = []
    for name in FILTERS:
        values = criteria.get(name)
        if values is None:
            continue
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise BadRegistryRequest(f"body.criteria.{name} must be a list of strings")
        if values:
            found.append((name, tuple(values)))
    return tuple(found)


def _object(body: Mapping[str, Any], key: str, name: str) -> Mapping[str, Any]:
    value = body.get(key)
    if value is None:
        raise BadRegistryRequest(f"missing {name}")
    if not isinstance(value, dict):
        raise BadRegistryRequest(f"{name} must be an object")
    return value


def _optional_object(body: Mapping[str, Any], key: str, name: str) -> Mapping[str, Any]:
    return {} if body.get(key) is None else _object(body, key, name)


def _text(body: Mapping[str, Any], key: str, name: str) -> str:
    value = _optional_text(body, key, name)
    if value is None:
        raise BadRegistryRequest(f"missing {name}")
    return value


def _optional_text(body: Mapping[str, Any], key: str, name: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise BadRegistryRequest(f"{name} must be a non-empty string")
    return value


def _nonempty(key: str, resource: str) -> str:
    if not key:
        raise BadRegistryRequest(f"body.resource '{resource}' names no registry entry")
    return key

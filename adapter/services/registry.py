"""The MN's registry connectors: domain registry and global registry relays, and the addresses of
the node's own services.

Each connector is an MN service (``handle(message, requester) -> ServiceReply``) that relays a
reTHINK message to a REST back end and answers with the back end's code and JSON. They never
raise: a bad message gets 400/405, an unconfigured back end 503, an unreachable or slow one 504.
The message -> REST mapping and its sources are in docs/registry-connector.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import aiohttp
import structlog

from ..envelope import Message
from .base import Requester, ServiceReply
from .registry_domain import BadRegistryRequest, domain_call, domain_reply
from .registry_http import (
    DEFAULT_MAX_ANSWER_BYTES,
    INVALID_JSON,
    TEXT_CONTENT_TYPE,
    RegistryFailure,
    RestAnswer,
    RestCall,
    perform,
)

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT_SECONDS: Final = 5.0
GLOBAL_REGISTRY_ADDRESS: Final = "global://registry"

# Answer when the operator configured no back end: the node offers the service but this
# deployment has no registry behind it (a configuration matter).
NOT_CONFIGURED_CODE: Final = 503
DOMAIN_NOT_CONFIGURED: Final = "domain registry not configured"
GLOBAL_NOT_CONFIGURED: Final = "global registry not configured"


def domain_registry_address(domain: str) -> str:
    return f"domain://registry.{domain}"


def idm_address(domain: str) -> str:
    return f"domain://idm.{domain}"


def node_addresses(domain: str) -> Callable[[str], bool]:
    """Whether an address is one of the node's own: its services at
    ``domain://msg-node.<domain>/…``, the domain registry, the global registry, the IdM."""
    roots = (
        f"domain://msg-node.{domain}",
        domain_registry_address(domain),
        GLOBAL_REGISTRY_ADDRESS,
        idm_address(domain),
    )
    # Asked of every routed message's `from`: one set lookup and one startswith.
    exact = frozenset(roots)
    below = tuple(root + "/" for root in roots)

    def check(address: str) -> bool:
        return address in exact or address.startswith(below)

    return check


def is_service_address(address: str, service: str) -> bool:
    """``service`` itself or anything below it: runtimes write ``domain://registry.<d>/`` (with a
    trailing slash) and ``global://registry/`` as well as the bare forms. A longer host
    (``domain://registry.<d>.evil``) is another address."""
    return address == service or address.startswith(service + "/")


class _Relay:
    """What the REST connectors share: the back end, the session, the failure mapping."""

    name: str = "registry"
    not_configured: str = "registry not configured"

    def __init__(
        self,
        base_url: str | None,
        session: aiohttp.ClientSession,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        *,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self._base_url = base_url.rstrip("/") if base_url else None
        self._session = session
        self._timeout = timeout_seconds
        self._max_answer_bytes = max_answer_bytes

    @property
    def configured(self) -> bool:
        return self._base_url is not None

    def _call(self, message: Message) -> RestCall:
        raise NotImplementedError

    def _reply(self, call: RestCall, answer: RestAnswer) -> ServiceReply:
        raise NotImplementedError

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        try:
            return await self._handle(message)
        except Exception:  # a connector bug must cost one answer, not the session
            log.exception("registry_connector_failed", service=self.name, id=message.id)
            return ServiceReply(500, desc=f"{self.name} connector failed")

    async def _handle(self, message: Message) -> ServiceReply:
        if not self.configured:
            return ServiceReply(NOT_CONFIGURED_CODE, desc=self.not_configured)
        try:
            call = self._call(message)
        except BadRegistryRequest as bad:
            return ServiceReply(bad.code, desc=bad.desc)
        answer = await self._relay(message, call)
        if isinstance(answer, ServiceReply):
            return answer
        return self._reply(call, answer)

    async def _relay(self, message: Message, call: RestCall) -> RestAnswer | ServiceReply:
        assert self._base_url is not None
        try:
            answer = await perform(
                self._session, self._base_url, call, self._timeout, self._max_answer_bytes
            )
        except RegistryFailure as failure:
            log.warning(
                "registry_unreachable",
                service=self.name,
                method=call.method,
                path=call.path_qs(),
                reason=failure.reason,
                id=message.id,
            )
            return ServiceReply(failure.code, desc=f"{self.name} unreachable: {failure.reason}")
        log.debug(
            "registry_call",
            service=self.name,
            method=call.method,
            path=call.path_qs(),
            status=answer.status,
            id=message.id,
        )
        return answer


class DomainRegistryConnector(_Relay):
    """``domain://registry.<domain>``: create/read/update/delete on dev-registry-domain."""

    name = "domain registry"
    not_configured = DOMAIN_NOT_CONFIGURED

    def _call(self, message: Message) -> RestCall:
        return domain_call(message)

    def _reply(self, call: RestCall, answer: RestAnswer) -> ServiceReply:
        return domain_reply(call, answer)


class GlobalRegistryConnector(_Relay):
    """``global://registry/``: read -> ``GET {GR}/guid/{guid}``; create/update ->
    ``PUT {GR}/guid/{guid}`` with the signed JWT as the raw request body."""

    name = "global registry"
    not_configured = GLOBAL_NOT_CONFIGURED

    def _call(self, message: Message) -> RestCall:
        return global_call(message)

    def _reply(self, call: RestCall, answer: RestAnswer) -> ServiceReply:
        return global_reply(call, answer)


def global_call(message: Message) -> RestCall:
    """The runtime's GraphConnector sends ``{guid}`` / ``{guid, jwt}``; the specs'
    global-registry-messages.md and the NoMatrix node use ``{resource}`` / ``{resource, value}``.
    Both are accepted."""
    body = message.body
    if message.type not in ("read", "create", "update"):
        raise BadRegistryRequest(
            f"the global registry connector handles read, create, update; got type "
            f"'{message.type}'",
            code=405,
        )
    guid = _either(body, "guid", "resource")
    if message.type == "read":
        return RestCall("GET", ("guid", guid))
    jwt = _either(body, "jwt", "value")
    # The JWT goes as the raw body: the global registry stores the request body verbatim as the
    # record (RestService.putdata takes @RequestBody String), so JSON-quoting it would corrupt it.
    return RestCall("PUT", ("guid", guid), body=jwt.encode(), content_type=TEXT_CONTENT_TYPE)


def global_reply(call: RestCall, answer: RestAnswer) -> ServiceReply:
    """The global registry answers every request with ``{Code, Description, Value,
    Explanation?}``; that object is the reply's value whatever the status (the runtime reads its
    ``Value``, the JWT, and its ``Code``)."""
    parsed = answer.json()
    if parsed is INVALID_JSON or not isinstance(parsed, dict):
        if call.method == "GET" and answer.status == 200:
            return ServiceReply(502, desc="the global registry answered with malformed JSON")
        parsed = None
    if 200 <= answer.status < 300:
        return ServiceReply(answer.status, value=parsed, extra=parsed)
    return ServiceReply(
        answer.status, value=parsed, desc=_global_message(answer.status, parsed), extra=parsed
    )


def _global_message(status: int, parsed: Mapping[str, Any] | None) -> str:
    if parsed is not None:
        for key in ("Explanation", "Description", "Message"):
            if isinstance(parsed.get(key), str) and parsed[key]:
                return str(parsed[key])
    return f"the global registry answered HTTP {status}"


def _either(body: Mapping[str, Any], key: str, alternative: str) -> str:
    for name in (key, alternative):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise BadRegistryRequest(f"body.{name} must be a non-empty string")
        return value
    raise BadRegistryRequest(f"missing body.{key} (or body.{alternative})")

"""``domain://idm.<domain>``: the node's identity management connector.

* ``read``: the requesting session's verified identity, in reTHINK's ``body.identity`` shape.
* ``execute`` with ``method: "validateAssertion"``, ``params: {assertion, origin}``: does an
  assertion another runtime of the domain made hold? ``origin`` names that runtime (its runtime
  URL or one of its addresses); the identity it proved is looked up through the injected
  ``lookup`` and the assertion is held against it. The runtime's Identity Module asks exactly
  this of an IdP proxy (dev-runtime-core ``IdentityModule.validateAssertion``) and treats any
  code but 200 as "not valid".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from ..envelope import Message
from ..identity.assertion import check_assertion
from ..identity.model import Identity
from .base import Requester, ServiceReply

log = structlog.get_logger(__name__)

# origin (runtime URL or an address it owns) -> the identity that runtime proved, if known.
IdentityLookup = Callable[[str], Awaitable[Identity | None]]


class IdmService:
    def __init__(self, lookup: IdentityLookup) -> None:
        self._lookup = lookup

    async def handle(self, message: Message, requester: Requester) -> ServiceReply:
        if message.type == "read":
            return self._read(requester)
        if message.type == "execute":
            method = message.body.get("method")
            if method == "validateAssertion":
                return await self._validate(message.body.get("params"))
            return ServiceReply(
                400, desc=f"unknown method {method!r}: the IdM answers 'validateAssertion'"
            )
        return ServiceReply(405, desc=f"the IdM does not support '{message.type}'")

    @staticmethod
    def _read(requester: Requester) -> ServiceReply:
        if requester.identity is None:
            return ServiceReply(404, desc="this session has no identity")
        return ServiceReply(200, value=requester.identity.to_rethink())

    async def _validate(self, params: Any) -> ServiceReply:
        if not isinstance(params, Mapping):
            return ServiceReply(400, desc="validateAssertion needs body.params {assertion, origin}")
        assertion, origin = params.get("assertion"), params.get("origin")
        if not isinstance(origin, str) or not origin:
            return ServiceReply(400, desc="params.origin must name the asserting runtime")
        if isinstance(assertion, str) and assertion.count(".") == 2 and "://" not in assertion:
            claimed: dict[str, Any] = {"idToken": assertion}
        elif isinstance(assertion, str | Mapping) and assertion:
            claimed = {"identity": assertion}
        else:
            return ServiceReply(
                400, desc="params.assertion must be an identity object, a user URL or a JWT"
            )
        try:
            owner = await self._lookup(origin)
        except Exception:
            log.exception("idm_lookup_failed", origin=origin)
            return ServiceReply(500, desc="the identity of the origin could not be looked up")
        if owner is None:
            return ServiceReply(404, desc=f"no runtime of this domain is known at {origin!r}")
        check = check_assertion(claimed, owner)
        if check.outcome == "match":
            return ServiceReply(
                200,
                value={
                    "valid": True,
                    "identity": owner.username or owner.user_id,
                    "contents": owner.to_rethink(),
                },
            )
        if check.outcome == "absent":
            return ServiceReply(400, desc="the assertion names no user")
        if check.outcome == "unverified":
            return ServiceReply(403, desc=f"the runtime at {origin!r} has not authenticated")
        return ServiceReply(403, desc=f"assertion not valid: {check.reason}")

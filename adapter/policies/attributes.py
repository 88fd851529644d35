"""What a policy decision is about (``PolicyRequest``) and the attributes rules test.

The attributes are JACPoL's (reTHINK's message-node policy language) plus ``authenticated`` and
``srcUserId``. Unlike JACPoL, which read ``body.identity`` as the message claimed it, the source
user's attributes come only from the identity the node verified for the sending session.

Each attribute yields a tuple of values (empty when unknown, several for a message to several
addresses); a comparison holds when it holds for any of them. Strings are case-folded, times are
seconds since midnight, dates ordinals, weekdays 0 (Monday) to 6.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final, Literal

from ..addresses import domain_of as service_domain
from ..identity.model import Identity

AttributeKind = Literal["string", "bool", "time", "date", "weekday"]
Values = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class PolicyRequest:
    msg_type: str
    msg_from: str
    msg_to: tuple[str, ...]
    # The sending session's verified identity; None when the session proved none.
    identity: Identity | None
    # Wall-clock time the rules' time/date/weekday conditions are read against (give it in the
    # timezone the operator writes rules in).
    now: datetime
    # The destination's service domain when the caller knows it; else read from msg_to.
    dst_domain: str | None = None
    # Attribute values computed so far for this decision (each is computed at most once).
    memo: dict[str, Values] = field(default_factory=dict, init=False, compare=False, repr=False)

    def values(self, attribute: str) -> Values:
        cached = self.memo.get(attribute)
        if cached is None:
            cached = self.memo[attribute] = GETTERS[attribute](self)
        return cached


def message_category(msg_from: str, msg_to: tuple[str, ...]) -> str:
    """JACPoL's ``msgType``: which MN function a message concerns (the Node.js MN's
    classification by address), ``data`` for traffic between hyperties."""
    for address in (*msg_to, msg_from):
        scheme, _, rest = address.partition("://")
        host, _, path = rest.partition("/")
        if scheme == "global" and host == "registry":
            return "globalRegistry"
        if scheme == "domain":
            if host.startswith("registry."):
                return "registration"
            if host.startswith("idm."):
                return "identityManagement"
            if host.startswith("msg-node."):
                if "address-allocation" in path:
                    return "addressAllocation"
                if path.rstrip("/") == "sm":
                    return "subscription"
                return "messageNode"
    return "data"


def _identity_value(get: Callable[[Identity], str | None]) -> Callable[[PolicyRequest], Values]:
    def values(request: PolicyRequest) -> Values:
        identity = request.identity
        value = get(identity) if identity is not None else None
        return (value.casefold(),) if value else ()

    return values


def _domains(request: PolicyRequest) -> Values:
    if request.dst_domain:
        return (request.dst_domain.casefold(),)
    return tuple(d for d in dict.fromkeys(service_domain(t) for t in request.msg_to) if d)


def _src_domain(request: PolicyRequest) -> Values:
    domain = service_domain(request.msg_from)
    return (domain,) if domain else ()


def _time(request: PolicyRequest) -> Values:
    now = request.now
    return (now.hour * 3600 + now.minute * 60 + now.second,)


GETTERS: Final[Mapping[str, Callable[[PolicyRequest], Values]]] = MappingProxyType(
    {
        "srcUsername": _identity_value(lambda i: i.username),
        "srcIDPDomain": _identity_value(lambda i: i.idp_domain),
        "srcUserId": _identity_value(lambda i: i.user_id),
        "authenticated": lambda r: (r.identity is not None and r.identity.authenticated,),
        "srcSPDomain": _src_domain,
        "msgFrom": lambda r: (r.msg_from.casefold(),),
        "msgTo": lambda r: tuple(t.casefold() for t in r.msg_to),
        "dstSPDomain": _domains,
        "actionType": lambda r: (r.msg_type.casefold(),),
        "msgType": lambda r: (message_category(r.msg_from, r.msg_to).casefold(),),
        "time": _time,
        "date": lambda r: (r.now.date().toordinal(),),
        "weekday": lambda r: (r.now.weekday(),),
    }
)

ATTRIBUTES: Final[Mapping[str, AttributeKind]] = MappingProxyType(
    {
        "srcUsername": "string",
        "srcIDPDomain": "string",
        "srcUserId": "string",
        "authenticated": "bool",
        "srcSPDomain": "string",
        "msgFrom": "string",
        "msgTo": "string",
        "dstSPDomain": "string",
        "actionType": "string",
        "msgType": "string",
        "time": "time",
        "date": "date",
        "weekday": "weekday",
    }
)

# Names earlier reTHINK policy files use for the same attributes (the Node.js MN's policy.json
# and the runtime's policy context): srcUser is the user name, srcDomain/idp the user's IdP
# domain, auth the authentication status.
ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "srcUser": "srcUsername",
        "srcDomain": "srcIDPDomain",
        "idp": "srcIDPDomain",
        "srcIDP": "srcIDPDomain",
        "auth": "authenticated",
    }
)

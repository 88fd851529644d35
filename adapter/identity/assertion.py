"""Does what a message says about its sender's identity agree with what the node verified?

reTHINK runtimes put the user's identity into message bodies (dev-runtime-core
``IdentityHandler``/``MessageBodyIdentity``, specs ``Message.json``):

* ``identity: {userProfile: {userURL, username, preferred_username, ...}, idp: {domain, protocol},
  assertion, expires}`` — a logged-in user;
* ``identity: {userProfile: {guid: "anonymous"}}`` (or another guid) — no user named;
* ``identity: "user://gmail.com/alice"`` — older runtimes, a bare user URL;
* ``idToken: "<JWT>"`` — the IdP's token itself (its claims name the user).

Every identifier asserted (user URL, username/e-mail, the token's subject and — only when its
``email_verified`` is the boolean true — its e-mail) must be a spelling of the session's verified
identity, and an asserted IdP domain must be its IdP. The token's signature is not checked here:
a claim is only accepted when it names the identity the node already verified for this session,
so an unsigned claim proves nothing more than that. An identity whose credential expired
(``expires_at`` passed) backs no assertion.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import jwt

from ..addresses import host_of, spelling_problem
from .model import Identity, ascii_lower, identity_name, user_url_from_email

AssertionOutcome = Literal["match", "mismatch", "absent", "unverified"]

# userProfile fields that name the user. preferred_username and name are display names.
_PROFILE_IDENTIFIERS = ("userURL", "username", "email")


@dataclass(frozen=True, slots=True)
class AssertionCheck:
    """``match``: attach ``assertedIdentity: true``; ``mismatch``: refuse (403); ``absent``: the
    body asserts nobody; ``unverified``: it asserts someone but the session has no verified
    identity to hold it against (an anonymous runtime): forward without ``assertedIdentity``."""

    outcome: AssertionOutcome
    reason: str
    asserted: tuple[str, ...] = ()


def check_assertion(body: Mapping[str, Any], verified: Identity | None) -> AssertionCheck:
    if "identity" not in body and "idToken" not in body:
        return _ABSENT
    try:
        asserted, idp = _asserted(body)
    except _Malformed as exc:
        return AssertionCheck("mismatch", str(exc))
    if not asserted:
        return _ABSENT
    names = tuple(asserted)
    if verified is None or not verified.authenticated:
        return AssertionCheck(
            "unverified", "the message asserts an identity the session has not proven", names
        )
    if verified.expires_at is not None and verified.expires_at <= time.time():
        return AssertionCheck(
            "mismatch",
            f"the credential of {verified.user_id!r} expired: present a fresh one "
            "with {cmd:'auth'}",
            names,
        )
    aliases = verified.aliases()
    for name in names:
        if identity_name(name) not in aliases:
            return AssertionCheck(
                "mismatch",
                f"the message asserts {name!r}, the session is authenticated as "
                f"{verified.user_id!r}",
                names,
            )
    if idp is not None and ascii_lower(idp) != ascii_lower(verified.idp_domain):
        return AssertionCheck(
            "mismatch",
            f"the message asserts identity provider {idp!r}, the session's is "
            f"{verified.idp_domain!r}",
            names,
        )
    return AssertionCheck("match", f"asserted identity is {verified.user_id!r}", names)


class _Malformed(Exception):
    pass


_ABSENT = AssertionCheck("absent", "the message asserts no user identity")


def _asserted(body: Mapping[str, Any]) -> tuple[list[str], str | None]:
    names: list[str] = []
    idp: str | None = None
    identity = body.get("identity")
    if isinstance(identity, str):
        if identity:
            names.append(identity)
    elif isinstance(identity, Mapping):
        profile = identity.get("userProfile")
        if profile is not None and not isinstance(profile, Mapping):
            raise _Malformed("body.identity.userProfile is not an object")
        for key in _PROFILE_IDENTIFIERS:
            value = (profile or {}).get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise _Malformed(f"body.identity.userProfile.{key} is not a string")
            if value:
                names.append(value)
        idp = _idp_domain(identity.get("idp"), "body.identity.idp")
        if not names and isinstance(identity.get("assertion"), str):
            names += _token_names(identity["assertion"], strict=False)
    elif identity is not None:
        raise _Malformed("body.identity is neither an object nor a user URL")
    token = body.get("idToken")
    if isinstance(token, str) and token:
        names += _token_names(token, strict=True)
    elif isinstance(token, Mapping):
        nested, token_idp = _asserted({"identity": token})
        names += nested
        idp = idp or token_idp
    elif token is not None and token != "":
        raise _Malformed("body.idToken is neither a JWT nor an object")
    return list(dict.fromkeys(names)), idp


def _idp_domain(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, Mapping):
        domain = value.get("domain")
        if domain is None:
            return None
        if isinstance(domain, str):
            return domain or None
    raise _Malformed(f"{where} is neither a domain nor an object with a string 'domain'")


def _token_names(token: str, *, strict: bool) -> list[str]:
    """Who a JWT names: its issuer's user URL for the subject, and its e-mail (as e-mail and user
    URL) when the token says the address is verified. ``strict``: a token that is not a JWT, or
    names no subject, is malformed rather than ignored."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        if strict:
            raise _Malformed("body.idToken is not a JWT") from None
        return []
    names: list[str] = []
    sub, iss = claims.get("sub"), claims.get("iss")
    if isinstance(sub, str) and sub and isinstance(iss, str):
        names.append(f"user://{urlsplit(iss).hostname or iss}/{sub}")
    email = claims.get("email")
    if isinstance(email, str) and "@" in email and claims.get("email_verified") is True:
        names += [email, user_url_from_email(email)]
    if strict and not names:
        raise _Malformed("body.idToken names no subject")
    return names


def asserted_domains(body: Mapping[str, Any]) -> frozenset[str] | None:
    """The domains of every identity a body asserts (user URLs' and e-mails' domains, Matrix
    ids' servers, the IdP's domain), case-folded: what a peer domain's node may vouch for is
    judged on them. Empty when it asserts nobody; None when what it asserts is unreadable."""
    try:
        names, idp = _asserted(body)
    except _Malformed:
        return None
    if any("://" in name and spelling_problem(name) is not None for name in names):
        # A user URL in a second spelling (a user part, a port, a backslash) names one domain
        # to the node and another to a runtime that splits it its own way: nobody may vouch
        # for it.
        return None
    domains = {_name_domain(name) for name in names}
    if idp is not None:
        domains.add(ascii_lower(idp))
    return frozenset(domains)


def _name_domain(name: str) -> str:
    if "://" in name:
        return host_of(name)
    if name.startswith("@") and ":" in name:
        return ascii_lower(name.split(":", 1)[1])
    return ascii_lower(name.rpartition("@")[2])

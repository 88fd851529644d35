"""Who a runtime is: the identity the node verified for a stub session, and its reTHINK shape.

A runtime proves who it is when its stub connects (a Matrix access token or an OpenID Connect ID
token); the node keeps the result as an ``Identity`` with the session. Runtimes read it in
reTHINK's own shape (``body.identity``: ``userProfile``, ``idp``, ``expires``), the one their
Identity Module puts into messages (dev-runtime-core ``MessageBodyIdentity``).

Who someone *is* is ``Identity.key``: (issuer, subject) for OpenID Connect, the Matrix user ID for
Matrix accounts. Everything else (e-mail, user URL, names) is an attribute: two credentials are
the same identity only when their keys are equal (``same_as``). A verified identity lasts until
``expires_at`` (the ID token's ``exp``) unless the runtime presents a fresh credential.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

IdentityMethod = Literal["anonymous", "matrix", "oidc"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class IdentityRejected(Exception):
    """The credential a runtime presented proves nothing: wrong, expired, revoked, forged or for
    another audience. ``reason`` is safe to show the runtime; answer ``code`` (401)."""

    code = 401

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IdentityUnavailable(Exception):
    """The credential could not be checked because the identity provider (homeserver, IdP) did
    not answer usefully: not the runtime's fault, answer ``code`` (503) and let it retry."""

    code = 503

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Identity:
    """A user identity as the node knows it.

    ``user_id`` is how the identity is shown and what policies match: a Matrix user ID
    (``@alice:example.org``) or, for OpenID Connect, the reTHINK user URL derived from the e-mail
    address when the IdP says it verified it (``email_verified`` is the boolean true), else from
    the subject (``user://gmail.com/alice``, ``user://<idp host>/<sub>``). It is not what makes
    two identities the same: that is ``key``."""

    user_id: str
    idp_domain: str
    method: IdentityMethod
    authenticated: bool
    # The login name policies match on (JACPoL's srcUsername): an e-mail address for OIDC, the
    # Matrix user ID for Matrix accounts.
    username: str | None = None
    display_name: str | None = None
    # Seconds since the epoch after which the credential no longer holds; None: no known end.
    expires_at: float | None = None
    # The verified token's claims (OIDC) or the homeserver's answer (Matrix), read-only.
    claims: Mapping[str, Any] = field(
        default_factory=lambda: _EMPTY, compare=False, hash=False, repr=False
    )
    # OpenID Connect: the token's `iss` and `sub`, together the identity's key. None in records
    # kept before they were (such an identity has no key: nothing proves to be it again).
    issuer: str | None = None
    subject: str | None = None

    @property
    def key(self) -> tuple[str, ...] | None:
        """What makes two credentials the same identity: ``("oidc", iss, sub)`` for OpenID
        Connect, ``("matrix", user ID)`` for Matrix accounts; None when it is not known (an OIDC
        identity kept by an older node), and then no credential proves to be this identity."""
        if self.method == "oidc":
            if self.issuer is None or self.subject is None:
                return None
            return ("oidc", self.issuer, self.subject)
        return (self.method, self.user_id)

    def same_as(self, other: Identity | None) -> bool:
        """Whether ``other`` is this identity (equal, known keys; e-mail and names do not count)."""
        if other is None:
            return False
        key = self.key
        return key is not None and key == other.key

    @property
    def subject_url(self) -> str | None:
        """The user URL naming the OIDC subject itself, ``user://<idp host>/<sub>``."""
        if self.method != "oidc" or self.subject is None:
            return None
        return f"user://{self.idp_domain}/{self.subject}"

    @property
    def user_url(self) -> str:
        """The reTHINK user URL, ``user://<idp domain>/<user>``."""
        if self.method == "matrix" and self.user_id.startswith("@") and ":" in self.user_id:
            localpart, server = self.user_id[1:].split(":", 1)
            return f"user://{server}/{localpart}"
        return self.user_id

    def aliases(self) -> frozenset[str]:
        """Every name of this identity a runtime may assert, spelled as ``identity_name``
        spells them: only their domain parts are case-insensitive, and only in ASCII (a name
        that differs by case elsewhere, or by a character that merely folds to the same
        letter, is another identity)."""
        names = {self.user_id, self.user_url}
        if self.username:
            names.add(self.username)
        subject_url = self.subject_url
        if subject_url is not None:
            names.add(subject_url)
        if self.method == "matrix" and self.user_id.startswith("@") and ":" in self.user_id:
            localpart, server = self.user_id[1:].split(":", 1)
            names.add(f"{localpart}@{server}")
        return frozenset(identity_name(n) for n in names)

    def _preferred_username(self, username: str) -> str:
        if self.method == "matrix" and username.startswith("@"):
            return username[1:].split(":", 1)[0]
        return username.split("@", 1)[0] or username

    def to_rethink(self) -> dict[str, Any]:
        """The identity as reTHINK runtimes read ``body.identity`` (MessageBodyIdentity)."""
        profile: dict[str, Any] = {"userURL": self.user_url}
        if self.username is not None:
            profile["username"] = self.username
            profile["preferred_username"] = self._preferred_username(self.username)
        if self.display_name is not None:
            profile["name"] = self.display_name
        shaped: dict[str, Any] = {
            "userProfile": profile,
            "idp": {"domain": self.idp_domain, "protocol": _PROTOCOLS[self.method]},
            "authenticated": self.authenticated,
        }
        if self.expires_at is not None:
            shaped["expires"] = int(self.expires_at)
        return shaped

    def to_record(self) -> str:
        """The identity as the node keeps it with the session (JSON; the claims are not kept)."""
        return json.dumps(
            {
                "user_id": self.user_id,
                "idp_domain": self.idp_domain,
                "method": self.method,
                "authenticated": self.authenticated,
                "username": self.username,
                "display_name": self.display_name,
                "expires_at": self.expires_at,
                "issuer": self.issuer,
                "subject": self.subject,
            }
        )

    @staticmethod
    def from_record(record: str) -> Identity:
        """An identity from ``to_record``, also from older nodes' records (without ``issuer``
        and ``subject``: an OIDC identity then has no key) and newer ones (unknown fields are
        left out)."""
        stored = json.loads(record)
        known = {f.name for f in fields(Identity)} - {"claims"}
        return Identity(**{name: value for name, value in stored.items() if name in known})


_PROTOCOLS: Mapping[IdentityMethod, str] = {
    "anonymous": "none",
    "matrix": "matrix",
    "oidc": "OIDC",
}


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """``text`` with ASCII capitals in lower case and nothing else changed: unlike
    ``str.lower`` it never turns a look-alike (the Kelvin sign, a long s) into a letter."""
    return text.translate(_ASCII_LOWER)


def identity_name(name: str) -> str:
    """The one spelling of a user's name as identities are compared: the domain part of an
    e-mail address, of a user URL (its host) and of a Matrix ID (its server) in ASCII lower
    case, everything else exactly as written."""
    if "://" in name:
        scheme, _, rest = name.partition("://")
        host, slash, path = rest.partition("/")
        return f"{ascii_lower(scheme)}://{ascii_lower(host)}{slash}{path}"
    if name.startswith("@") and ":" in name:
        local, _, server = name.partition(":")
        return f"{local}:{ascii_lower(server)}"
    local, at, domain = name.rpartition("@")
    return f"{local}@{ascii_lower(domain)}" if at else name


def anonymous_identity(runtime_url: str, domain: str) -> Identity:
    """What a runtime that presented no credential is: its runtime URL, unauthenticated."""
    return Identity(user_id=runtime_url, idp_domain=domain, method="anonymous", authenticated=False)


def user_url_from_email(email: str) -> str:
    """reTHINK's user URL for an e-mail address: ``user://<domain>/<local part>`` (the runtime's
    ``getUserURLFromEmail``)."""
    local, _, domain = email.rpartition("@")
    return f"user://{domain.lower()}/{local}"

"""Who a runtime is: the identity the node verified for a stub session, and its reTHINK shape.

A runtime proves who it is when its stub connects (a Matrix access token or an OpenID Connect ID
token); the node keeps the result as an ``Identity`` for the session's life. Runtimes read it in
reTHINK's own shape (``body.identity``: ``userProfile``, ``idp``, ``expires``), the one their
Identity Module puts into messages (dev-runtime-core ``MessageBodyIdentity``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
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

    ``user_id`` is the identifier the identity provider vouches for: a Matrix user ID
    (``@alice:example.org``) or, for OpenID Connect, the reTHINK user URL derived from the verified
    e-mail address or subject (``user://gmail.com/alice``)."""

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

    @property
    def user_url(self) -> str:
        """The reTHINK user URL, ``user://<idp domain>/<user>``."""
        if self.method == "matrix" and self.user_id.startswith("@") and ":" in self.user_id:
            localpart, server = self.user_id[1:].split(":", 1)
            return f"user://{server}/{localpart}"
        return self.user_id

    def aliases(self) -> frozenset[str]:
        """Every spelling of this identity a runtime may assert, case-folded."""
        names = {self.user_id, self.user_url}
        if self.username:
            names.add(self.username)
        if self.method == "matrix" and self.user_id.startswith("@") and ":" in self.user_id:
            localpart, server = self.user_id[1:].split(":", 1)
            names.add(f"{localpart}@{server}")
        return frozenset(n.casefold() for n in names)

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
            }
        )

    @staticmethod
    def from_record(record: str) -> Identity:
        fields = json.loads(record)
        return Identity(**fields)


_PROTOCOLS: Mapping[IdentityMethod, str] = {
    "anonymous": "none",
    "matrix": "matrix",
    "oidc": "OIDC",
}


def anonymous_identity(runtime_url: str, domain: str) -> Identity:
    """What a runtime that presented no credential is: its runtime URL, unauthenticated."""
    return Identity(user_id=runtime_url, idp_domain=domain, method="anonymous", authenticated=False)


def user_url_from_email(email: str) -> str:
    """reTHINK's user URL for an e-mail address: ``user://<domain>/<local part>`` (the runtime's
    ``getUserURLFromEmail``)."""
    local, _, domain = email.rpartition("@")
    return f"user://{domain.lower()}/{local}"

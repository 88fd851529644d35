"""Who a connecting runtime is: the credential its stub presents, checked as the domain's
configuration says (``auth.mode``).

- ``anonymous``: nothing is required. A Matrix access token presented anyway is still checked
  (the homeserver is always at hand), so a runtime may prove who it is on a development node.
- ``matrix``: an access token of a user of the domain's homeserver is required.
- ``oidc``: an OpenID Connect ID token from the configured IdP is required.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .matrix import MatrixTokenVerifier
from .model import Identity, IdentityRejected
from .oidc import OidcVerifier

CredentialKind = Literal["matrix", "oidc"]


@dataclass(frozen=True, slots=True)
class Credential:
    kind: CredentialKind
    token: str


class Authenticator:
    def __init__(
        self,
        mode: Literal["anonymous", "matrix", "oidc"],
        matrix: MatrixTokenVerifier,
        oidc: OidcVerifier | None,
    ) -> None:
        self.mode = mode
        self._matrix = matrix
        self._oidc = oidc

    async def authenticate(self, credential: Credential | None) -> Identity | None:
        """The verified identity (None for an anonymous runtime). Raises IdentityRejected (401)
        or IdentityUnavailable (503, the identity provider did not answer)."""
        if credential is None:
            if self.mode != "anonymous":
                raise IdentityRejected(f"this domain requires a {self.mode} credential")
            return None
        if self.mode != "anonymous" and credential.kind != self.mode:
            raise IdentityRejected(
                f"this domain takes {self.mode} credentials, not {credential.kind}"
            )
        if credential.kind == "matrix":
            return await self._matrix.verify(credential.token)
        if self._oidc is None:
            raise IdentityRejected("this domain has no OpenID Connect provider configured")
        return await self._oidc.verify(credential.token)


def parse_credential(kind: object, token: object) -> Credential | None:
    """A credential from the handshake's fields; None when none was presented. Raises
    IdentityRejected for one that is malformed."""
    if kind is None and token is None:
        return None
    if kind not in ("matrix", "oidc"):
        raise IdentityRejected("auth.type must be 'matrix' or 'oidc'")
    if not isinstance(token, str) or not token or len(token) > 16_384:
        raise IdentityRejected("auth.token must be a non-empty string")
    return Credential(kind, token)  # type: ignore[arg-type]

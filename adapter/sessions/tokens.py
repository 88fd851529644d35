"""Session tokens handed to stubs: a JWT naming the session, presented again on reconnect."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

import jwt

ALGORITHM = "HS256"
ISSUER = "rethink-mn"


class TokenRejected(Exception):
    """The token is not one this node issued for that runtime, or it expired."""


@dataclass(frozen=True, slots=True)
class SessionClaim:
    session_id: int
    runtime_url: str
    # The random claim the session holds its runtimeURL under (a credential's, kept across its
    # sessions): session ids alone are reused by the database once a session's row is gone, so a
    # token naming only the id would name whichever session got that id next.
    claim: str

    def names(self, session_id: int, claim: str) -> bool:
        return self.session_id == session_id and secrets.compare_digest(self.claim, claim)


class SessionTokens:
    def __init__(self, secret: str | None, lifetime_seconds: int) -> None:
        # Without a configured secret the node sets one it keeps in its database at start.
        self.secret = secret or secrets.token_urlsafe(32)
        self._lifetime = lifetime_seconds

    def issue(self, session_id: int, runtime_url: str, claim: str) -> str:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": runtime_url,
            "sid": session_id,
            "clm": claim,
            "iat": now,
            "exp": now + self._lifetime,
        }
        return jwt.encode(claims, self.secret, algorithm=ALGORITHM)

    def verify(self, token: str, runtime_url: str) -> SessionClaim:
        try:
            claims = jwt.decode(
                token,
                self.secret,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"require": ["exp", "sub", "sid", "clm", "iss"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRejected("session token expired") from None
        except jwt.InvalidTokenError as exc:
            raise TokenRejected(f"invalid session token: {exc}") from None
        if claims["sub"] != runtime_url:
            raise TokenRejected("session token belongs to another runtimeURL")
        if not isinstance(claims["sid"], int) or not isinstance(claims["clm"], str):
            raise TokenRejected("invalid session token: bad session id")
        return SessionClaim(claims["sid"], runtime_url, claims["clm"])

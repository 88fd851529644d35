"""OpenID Connect ID tokens as runtime credentials, verified against the IdP's published keys.

Checked: the signature (with a key from the IdP's JWKS, by the token's ``kid``), the algorithm
(only the configured asymmetric ones: never ``none``, never an HMAC algorithm whose "secret" would
be the public key), ``iss``, ``aud``, ``exp`` (strictly: the node vouches for the identity until
``exp`` and not a moment longer, so it takes no token already past it), ``nbf``/``iat`` when
present (within a small leeway for clock skew) and that a subject is named.

The identity is (``iss``, ``sub``). The e-mail address is used — for the user URL and the
username policies match — only when ``email_verified`` is the boolean ``true``: a missing claim,
``false`` or the string ``"false"`` (or ``"true"``) prove nothing about who owns the address.

The JWKS is fetched once and kept. A token naming an unknown ``kid`` (the IdP rotated its keys)
triggers a refresh, at most once per ``min_refresh_seconds``: a flood of tokens with made-up kids
costs the IdP one request per interval, not one per token. Keys also expire after
``max_key_age_seconds``, so a key the IdP withdrew stops being accepted.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import jwt
import structlog
from jwt import PyJWK
from jwt.exceptions import PyJWKError

from .model import Identity, IdentityRejected, IdentityUnavailable, user_url_from_email

# Asymmetric signature algorithms pyjwt verifies with a public key, by the JWK key type they need.
_KEY_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "RS256": "RSA",
        "RS384": "RSA",
        "RS512": "RSA",
        "PS256": "RSA",
        "PS384": "RSA",
        "PS512": "RSA",
        "ES256": "EC",
        "ES384": "EC",
        "ES512": "EC",
        "EdDSA": "OKP",
    }
)
_EC_CURVES: Final[Mapping[str, str]] = MappingProxyType(
    {"ES256": "P-256", "ES384": "P-384", "ES512": "P-521"}
)
DEFAULT_ALGORITHMS: Final = ("RS256", "ES256")
MAX_TOKEN_BYTES: Final = 16 * 1024
MAX_DOCUMENT_BYTES: Final = 1024 * 1024


log = structlog.get_logger(__name__)


class OidcConfigError(ValueError):
    """The verifier was configured with something unsafe or unusable."""


class OidcVerifier:
    def __init__(
        self,
        http: aiohttp.ClientSession,
        *,
        issuer: str,
        audience: str,
        jwks_uri: str | None = None,
        algorithms: Iterable[str] = DEFAULT_ALGORITHMS,
        leeway_seconds: float = 30.0,
        min_refresh_seconds: float = 60.0,
        max_key_age_seconds: float = 3600.0,
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        allowed = tuple(algorithms)
        unsafe = [alg for alg in allowed if alg not in _KEY_TYPES]
        if unsafe or not allowed:
            raise OidcConfigError(
                f"algorithms must be asymmetric signature algorithms ({', '.join(_KEY_TYPES)}); "
                f"refused: {', '.join(unsafe) or 'an empty list'}"
            )
        if not issuer or not audience:
            raise OidcConfigError("issuer and audience are required")
        self._http = http
        self._issuer = issuer
        self._audience = audience
        self._jwks_uri = jwks_uri
        self._algorithms = allowed
        self._leeway = leeway_seconds
        self._min_refresh = min_refresh_seconds
        self._max_age = max_key_age_seconds
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._clock = clock
        self._wall_clock = wall_clock  # for `exp`: seconds since the epoch
        self._keys: dict[str, dict[str, Any]] = {}  # kid ('' when the IdP gives none) -> JWK
        self._fetched_at: float | None = None
        self._kid_refresh_at: float | None = None
        self._failed_at: float | None = None
        self._generation = 0
        self._refresh_lock = asyncio.Lock()
        self.fetches = 0  # JWKS requests made (observable for tests and metrics)

    @property
    def issuer(self) -> str:
        return self._issuer

    async def verify(self, id_token: str) -> Identity:
        """The identity an ID token proves. Raises IdentityRejected or IdentityUnavailable."""
        if not isinstance(id_token, str) or not id_token:
            raise IdentityRejected("no ID token")
        if len(id_token) > MAX_TOKEN_BYTES:
            raise IdentityRejected("ID token too large")
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.InvalidTokenError as exc:
            raise IdentityRejected(f"malformed ID token: {exc}") from None
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise IdentityRejected(
                f"ID token signed with {alg!r}; accepted: {', '.join(self._algorithms)}"
            )
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise IdentityRejected("malformed ID token: 'kid' is not a string")
        key = await self._key(kid, alg)
        try:
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key=key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise IdentityRejected("ID token expired") from None
        except jwt.InvalidAudienceError:
            raise IdentityRejected("ID token is for another audience") from None
        except jwt.InvalidIssuerError:
            raise IdentityRejected("ID token from another issuer") from None
        except jwt.InvalidSignatureError:
            raise IdentityRejected("ID token signature does not verify") from None
        except jwt.InvalidTokenError as exc:
            raise IdentityRejected(f"invalid ID token: {exc}") from None
        return self._identity(claims)

    def _expires_at(self, exp: Any) -> float:
        """The moment the token stops holding, from its ``exp`` (refused when past)."""
        if isinstance(exp, bool) or not isinstance(exp, int | float | str):
            raise IdentityRejected("invalid ID token: 'exp' is not a number")
        try:
            expires_at = float(exp)
        except ValueError:
            raise IdentityRejected("invalid ID token: 'exp' is not a number") from None
        if not math.isfinite(expires_at):
            raise IdentityRejected("invalid ID token: 'exp' is not a number")
        if expires_at <= self._wall_clock():
            raise IdentityRejected("ID token expired")
        return expires_at

    async def _key(self, kid: str | None, alg: str) -> PyJWK:
        await self._refresh(unknown_kid=False)
        jwk = self._find(kid, alg)
        if jwk is None:
            # Perhaps the IdP rotated its keys since the last fetch.
            await self._refresh(unknown_kid=True)
            jwk = self._find(kid, alg)
        if jwk is None:
            if self._fetched_at is None:
                raise IdentityUnavailable("the IdP's keys could not be fetched yet")
            named = f"key {kid!r}" if kid is not None else "a key (the token names no kid)"
            raise IdentityRejected(f"the IdP publishes no {named} for {alg}")
        try:
            return PyJWK(jwk, algorithm=alg)
        except PyJWKError as exc:
            raise IdentityRejected(f"the IdP's key {kid!r} is unusable for {alg}: {exc}") from None

    def _find(self, kid: str | None, alg: str) -> dict[str, Any] | None:
        if kid is not None:
            jwk = self._keys.get(kid)
            return jwk if jwk is not None and _fits(jwk, alg) else None
        # A token without kid is acceptable only when exactly one published key could sign it.
        fitting = [jwk for jwk in self._keys.values() if _fits(jwk, alg)]
        return fitting[0] if len(fitting) == 1 else None

    async def _refresh(self, *, unknown_kid: bool) -> None:
        """Fetch the JWKS when it is due: when no keys are held or they are older than
        ``max_key_age_seconds``, or (``unknown_kid``) when a token names a key not held, at most
        once per ``min_refresh_seconds``. A failed fetch is not retried within that interval
        either, so an IdP that is down is not hammered by every login."""
        generation = self._generation
        async with self._refresh_lock:
            if generation != self._generation:
                return  # fetched by another caller while this one waited
            now = self._clock()
            if self._failed_at is not None and now - self._failed_at < self._min_refresh:
                return
            if unknown_kid:
                if (
                    self._kid_refresh_at is not None
                    and now - self._kid_refresh_at < self._min_refresh
                ):
                    return
                self._kid_refresh_at = now
            elif self._fetched_at is not None and now - self._fetched_at < self._max_age:
                return
            try:
                keys = await self._fetch_keys()
            except IdentityUnavailable as exc:
                self._failed_at = self._clock()
                if not self._keys:
                    raise
                # Keep verifying with the keys held: an IdP outage must not lock every user out.
                log.warning("oidc_jwks_refresh_failed", issuer=self._issuer, reason=exc.reason)
                return
            self._failed_at = None
            self._keys = keys
            self._fetched_at = self._clock()
            self._generation += 1

    async def _fetch_keys(self) -> dict[str, dict[str, Any]]:
        if self._jwks_uri is None:
            discovery = await self._get_json(
                self._issuer.rstrip("/") + "/.well-known/openid-configuration"
            )
            if discovery.get("issuer") != self._issuer:
                raise IdentityUnavailable(
                    f"the IdP's discovery document names issuer {discovery.get('issuer')!r}, "
                    f"not {self._issuer!r}"
                )
            uri = discovery.get("jwks_uri")
            if not isinstance(uri, str) or urlsplit(uri).scheme not in ("http", "https"):
                raise IdentityUnavailable("the IdP's discovery document has no usable jwks_uri")
            self._jwks_uri = uri
        self.fetches += 1
        document = await self._get_json(self._jwks_uri)
        published = document.get("keys")
        if not isinstance(published, list):
            raise IdentityUnavailable("the IdP's JWKS has no 'keys' list")
        keys: dict[str, dict[str, Any]] = {}
        for jwk in published:
            # Keys for encryption, symmetric keys and keys of unknown types are never usable.
            if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
                continue
            if jwk.get("kty") not in ("RSA", "EC", "OKP"):
                continue
            kid = jwk.get("kid", "")
            if isinstance(kid, str):
                keys[kid] = jwk
        return keys

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            async with self._http.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise IdentityUnavailable(f"{url} answered HTTP {resp.status}")
                raw = await resp.content.read(MAX_DOCUMENT_BYTES + 1)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise IdentityUnavailable(f"{url} did not answer: {exc!r}") from None
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise IdentityUnavailable(f"{url} answered with an oversized document")
        try:
            document = json.loads(raw)
        except ValueError:
            raise IdentityUnavailable(f"{url} answered with malformed JSON") from None
        if not isinstance(document, dict):
            raise IdentityUnavailable(f"{url} answered with JSON that is not an object")
        return document

    def _identity(self, claims: dict[str, Any]) -> Identity:
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub:
            raise IdentityRejected("invalid ID token: 'sub' is not a non-empty string")
        expires_at = self._expires_at(claims["exp"])
        email = claims.get("email")
        # An address the IdP has not verified proves nothing about its owner: only the boolean
        # true counts (a missing claim, false, "false", even "true" do not).
        verified_email = (
            isinstance(email, str) and "@" in email and claims.get("email_verified") is True
        )
        idp_domain = urlsplit(self._issuer).hostname or self._issuer
        if verified_email:
            assert isinstance(email, str)
            user_id, username = user_url_from_email(email), email
        else:
            user_id, username = f"user://{idp_domain}/{sub}", sub
        name = claims.get("name")
        return Identity(
            user_id=user_id,
            idp_domain=idp_domain,
            method="oidc",
            authenticated=True,
            username=username,
            display_name=name if isinstance(name, str) else None,
            expires_at=expires_at,
            claims=MappingProxyType(claims),
            # pyjwt checked that `iss` is the configured issuer: the key is (issuer, subject).
            issuer=self._issuer,
            subject=sub,
        )


def _fits(jwk: Mapping[str, Any], alg: str) -> bool:
    """Whether a published key may verify a token signed with ``alg``."""
    if jwk.get("kty") != _KEY_TYPES[alg]:
        return False
    if "alg" in jwk and jwk["alg"] != alg:
        return False
    return alg not in _EC_CURVES or jwk.get("crv") == _EC_CURVES[alg]

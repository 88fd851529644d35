"""OpenID Connect ID tokens verified against a JWKS served by aiohttp on 127.0.0.1, with keys
generated per test session."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from adapter.identity import IdentityRejected, IdentityUnavailable
from adapter.identity.oidc import OidcConfigError, OidcVerifier

from ..support.fake_idp import AUDIENCE, FakeIdp, idp, rsa_key

__all__ = ["idp"]  # the fixture, used by name

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier(http: aiohttp.ClientSession, idp: FakeIdp, **kwargs: Any) -> OidcVerifier:
    return OidcVerifier(http, issuer=idp.url, audience=AUDIENCE, **kwargs)


async def test_valid_token_is_accepted_and_bound_to_the_email(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k1", key)
    identity = await verifier(http, idp).verify(idp.token(key, "k1"))
    assert identity.user_id == "user://gmail.com/alice"
    assert identity.username == "alice@gmail.com"
    assert identity.idp_domain == "127.0.0.1"
    assert identity.method == "oidc" and identity.authenticated
    assert identity.display_name == "Alice Liddell"
    assert identity.expires_at is not None and identity.expires_at > time.time()
    assert identity.claims["sub"] == "248289761001"
    shaped = identity.to_rethink()
    assert shaped["userProfile"]["userURL"] == "user://gmail.com/alice"
    assert shaped["userProfile"]["username"] == "alice@gmail.com"
    assert shaped["idp"] == {"domain": "127.0.0.1", "protocol": "OIDC"}


async def test_es256_key_and_discovery_without_kid(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    idp.publish("ec1", key)
    check = verifier(http, idp, algorithms=["ES256"])
    identity = await check.verify(idp.token(key, "ec1", alg="ES256"))
    assert identity.user_id == "user://gmail.com/alice"
    # No kid: the only ES256 key published is the one to use.
    assert (await check.verify(idp.token(key, None, alg="ES256"))).username == "alice@gmail.com"


async def test_unverified_email_falls_back_to_the_subject(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k-sub", key)
    token = idp.token(key, "k-sub", email="mallory@gmail.com", email_verified=False)
    identity = await verifier(http, idp).verify(token)
    assert identity.user_id == "user://127.0.0.1/248289761001"
    assert identity.username == "248289761001"


async def test_forged_and_tampered_tokens_are_refused(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k-real", key)
    check = verifier(http, idp)
    forged = idp.token(rsa_key(), "k-real")  # another key, claiming the real key's kid
    with pytest.raises(IdentityRejected, match="signature"):
        await check.verify(forged)
    header, payload, signature = idp.token(key, "k-real").split(".")
    other_payload = idp.token(key, "k-real", email="mallory@gmail.com").split(".")[1]
    with pytest.raises(IdentityRejected, match="signature"):
        await check.verify(f"{header}.{other_payload}.{signature}")
    assert (await check.verify(f"{header}.{payload}.{signature}")).username == "alice@gmail.com"


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"aud": "another-client"}, "another audience"),
        ({"iss": "https://accounts.example.org"}, "another issuer"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "expired"),
        ({"sub": None}, "sub"),
        ({"exp": None}, "exp"),
    ],
)
async def test_claims_are_checked(
    http: aiohttp.ClientSession, idp: FakeIdp, claims: dict[str, Any], reason: str
) -> None:
    key = rsa_key()
    kid = f"k-claims-{reason}"
    idp.publish(kid, key)
    with pytest.raises(IdentityRejected, match=reason):
        await verifier(http, idp).verify(idp.token(key, kid, **claims))


async def test_none_and_hmac_with_the_public_key_are_refused(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k-alg", key)
    check = verifier(http, idp)
    unsigned = jwt.encode(
        {"iss": idp.url, "aud": AUDIENCE, "sub": "x", "exp": int(time.time()) + 60},
        None,
        algorithm="none",
        headers={"kid": "k-alg"},
    )
    with pytest.raises(IdentityRejected, match="'none'"):
        await check.verify(unsigned)
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The classic confusion attack: the public key used as an HMAC secret. pyjwt refuses to sign
    # with a PEM key, so the token is assembled by hand.
    import base64
    import hashlib
    import hmac
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k-alg"}).encode())
    body = b64(
        json.dumps(
            {"iss": idp.url, "aud": AUDIENCE, "sub": "x", "exp": int(time.time()) + 60}
        ).encode()
    )
    mac = hmac.new(public_pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    with pytest.raises(IdentityRejected, match="HS256"):
        await check.verify(f"{head}.{body}.{b64(mac)}")
    for garbage in ("", "not-a-jwt", "a.b.c", "x" * 20000):
        with pytest.raises(IdentityRejected):
            await check.verify(garbage)


async def test_unsafe_algorithm_configuration_is_refused() -> None:
    for algorithms in (["none"], ["HS256"], ["RS256", "HS512"], []):
        with pytest.raises(OidcConfigError):
            OidcVerifier(None, issuer="https://idp", audience="a", algorithms=algorithms)  # type: ignore[arg-type]


async def test_unknown_kid_refused_after_one_refresh_and_refreshes_are_rate_limited(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k-known", key)
    clock = Clock()
    check = verifier(http, idp, min_refresh_seconds=60, clock=clock)
    await check.verify(idp.token(key, "k-known"))
    assert check.fetches == 1
    # The first unknown kid costs one refresh (the IdP might have rotated) ...
    with pytest.raises(IdentityRejected, match="no key 'bogus-0'"):
        await check.verify(idp.token(rsa_key(), "bogus-0"))
    assert check.fetches == 2
    # ... a flood of them within the interval costs nothing more.
    for i in range(1, 50):
        with pytest.raises(IdentityRejected, match="no key"):
            await check.verify(idp.token(rsa_key(), f"bogus-{i}"))
    assert check.fetches == 2
    clock.now += 61
    with pytest.raises(IdentityRejected, match="no key"):
        await check.verify(idp.token(rsa_key(), "bogus-late"))
    assert check.fetches == 3


async def test_key_rotation_is_picked_up(http: aiohttp.ClientSession, idp: FakeIdp) -> None:
    old, new = rsa_key(), rsa_key()
    idp.publish("rot-old", old)
    clock = Clock()
    check = verifier(http, idp, min_refresh_seconds=60, clock=clock)
    await check.verify(idp.token(old, "rot-old"))
    # The IdP rotates: the new key appears, the old one is withdrawn.
    idp.keys = [k for k in idp.keys if k["kid"] != "rot-old"]
    idp.publish("rot-new", new)
    clock.now += 61
    identity = await check.verify(idp.token(new, "rot-new"))
    assert identity.username == "alice@gmail.com"
    # The withdrawn key is gone with the refresh.
    with pytest.raises(IdentityRejected, match="no key 'rot-old'"):
        await check.verify(idp.token(old, "rot-old"))


async def test_discovery_and_idp_failures(http: aiohttp.ClientSession, idp: FakeIdp) -> None:
    key = rsa_key()
    idp.publish("k-disc", key)
    idp.discovery_issuer = "https://impostor.example"
    try:
        with pytest.raises(IdentityUnavailable, match="impostor"):
            await verifier(http, idp).verify(idp.token(key, "k-disc"))
    finally:
        idp.discovery_issuer = None
    idp.up = False
    try:
        with pytest.raises(IdentityUnavailable, match="503"):
            await verifier(http, idp).verify(idp.token(key, "k-disc"))
    finally:
        idp.up = True
    closed = OidcVerifier(
        http, issuer="http://127.0.0.1:9", audience=AUDIENCE, jwks_uri="http://127.0.0.1:9/jwks"
    )
    with pytest.raises(IdentityUnavailable, match="did not answer"):
        await closed.verify(idp.token(key, "k-disc"))


async def test_keys_held_survive_an_idp_outage(http: aiohttp.ClientSession, idp: FakeIdp) -> None:
    key = rsa_key()
    idp.publish("k-out", key)
    clock = Clock()
    check = verifier(http, idp, max_key_age_seconds=100, min_refresh_seconds=10, clock=clock)
    await check.verify(idp.token(key, "k-out"))
    idp.up = False
    try:
        clock.now += 101  # keys are due for a refresh, which fails
        assert (await check.verify(idp.token(key, "k-out"))).username == "alice@gmail.com"
    finally:
        idp.up = True

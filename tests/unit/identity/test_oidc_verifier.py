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

from adapter.identity import Identity, IdentityRejected, IdentityUnavailable
from adapter.identity.oidc import OidcConfigError, OidcVerifier
from tests.support.fake_idp import AUDIENCE, FakeIdp, idp, rsa_key

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


# -- who a token proves: (iss, sub); e-mail only when the IdP verified it ------------------------


@pytest.mark.parametrize(
    ("email_verified", "uses_email"),
    [
        (None, False),  # the claim is missing
        ("false", False),
        (False, False),
        ("true", False),  # only the boolean true says the IdP verified the address
        (True, True),
    ],
)
async def test_email_is_used_only_when_verified_and_is_never_the_key(
    http: aiohttp.ClientSession, idp: FakeIdp, email_verified: Any, uses_email: bool
) -> None:
    key = rsa_key()
    kid = f"k-ev-{email_verified!r}"
    idp.publish(kid, key)
    # None leaves the claim out of the token.
    token = idp.token(
        key, kid, sub="sub-42", email="victim@gmail.com", email_verified=email_verified
    )
    identity = await verifier(http, idp).verify(token)
    assert identity.key == ("oidc", idp.url, "sub-42")
    assert (identity.issuer, identity.subject) == (idp.url, "sub-42")
    if uses_email:
        assert identity.user_id == "user://gmail.com/victim"
        assert identity.username == "victim@gmail.com"
        assert "victim@gmail.com" in identity.aliases()
    else:
        assert identity.user_id == "user://127.0.0.1/sub-42"
        assert identity.username == "sub-42"
        assert "victim@gmail.com" not in identity.aliases()
        assert identity.to_rethink()["userProfile"]["userURL"] == "user://127.0.0.1/sub-42"
    assert "user://127.0.0.1/sub-42" in identity.aliases()


async def test_the_same_email_for_another_subject_is_another_identity(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k-same-email", key)
    check = verifier(http, idp)
    victim = await check.verify(idp.token(key, "k-same-email", sub="victim"))
    # An attacker's own valid token naming the victim's address, not verified ...
    for verified in (None, "false"):
        attacker = await check.verify(
            idp.token(key, "k-same-email", sub="attacker", email_verified=verified)
        )
        assert attacker.user_id != victim.user_id
        assert not victim.same_as(attacker) and not attacker.same_as(victim)
    # ... or even verified: the address is an attribute, the subject is who it is.
    verified_too = await check.verify(idp.token(key, "k-same-email", sub="attacker"))
    assert verified_too.user_id == victim.user_id == "user://gmail.com/alice"
    assert verified_too.key != victim.key and not victim.same_as(verified_too)
    # The victim's own next token is the victim.
    again = await check.verify(idp.token(key, "k-same-email", sub="victim", name="Alice L."))
    assert victim.same_as(again)


async def test_the_issuer_is_part_of_the_key(http: aiohttp.ClientSession, idp: FakeIdp) -> None:
    key = rsa_key()
    idp.publish("k-iss", key)
    ours = verifier(http, idp)
    # A token of another issuer (signed with a key the verifier knows) is refused ...
    with pytest.raises(IdentityRejected, match="another issuer"):
        await ours.verify(idp.token(key, "k-iss", iss="https://other.example"))
    # ... and the same subject at another issuer is another identity.
    other = OidcVerifier(
        http, issuer="https://other.example", audience=AUDIENCE, jwks_uri=f"{idp.url}/jwks"
    )
    here = await ours.verify(idp.token(key, "k-iss", sub="s1"))
    there = await other.verify(idp.token(key, "k-iss", sub="s1", iss="https://other.example"))
    assert here.key == ("oidc", idp.url, "s1")
    assert there.key == ("oidc", "https://other.example", "s1")
    assert not here.same_as(there)


async def test_exp_is_kept_and_enforced_without_leeway(
    http: aiohttp.ClientSession, idp: FakeIdp
) -> None:
    key = rsa_key()
    idp.publish("k-exp", key)
    check = verifier(http, idp)  # 30 s of leeway for clock skew on nbf/iat
    now = int(time.time())
    # The node vouches until exp, not a moment longer: a token 5 s past it proves nothing.
    with pytest.raises(IdentityRejected, match="expired"):
        await check.verify(idp.token(key, "k-exp", exp=now - 5, iat=now - 60))
    # A numeric string exp is an end too, not "no end".
    identity = await check.verify(idp.token(key, "k-exp", exp=str(now + 120)))
    assert identity.expires_at == float(now + 120)


async def test_identity_records_keep_the_key_and_older_records_load() -> None:
    identity = Identity(
        "user://gmail.com/alice",
        "idp.example",
        "oidc",
        True,
        "alice@gmail.com",
        expires_at=2_000_000_000.0,
        issuer="https://idp.example",
        subject="s-1",
    )
    again = Identity.from_record(identity.to_record())
    assert again == identity and again.key == ("oidc", "https://idp.example", "s-1")
    assert again.same_as(identity)
    # A record kept before the key was: loadable, but nothing proves to be it any more (its
    # user URL may have come from an unverified address).
    older = Identity.from_record(
        '{"user_id": "user://gmail.com/alice", "idp_domain": "idp.example", "method": "oidc",'
        ' "authenticated": true, "username": "alice@gmail.com", "display_name": null,'
        ' "expires_at": 2000000000.0, "some_later_field": 1}'
    )
    assert older.user_id == "user://gmail.com/alice" and older.key is None
    assert not older.same_as(identity) and not identity.same_as(older)
    assert not older.same_as(older)
    matrix = Identity("@a:hs", "hs", "matrix", True, "@a:hs")
    assert Identity.from_record(matrix.to_record()).same_as(matrix)

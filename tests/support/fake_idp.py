"""A fake OpenID Connect identity provider on 127.0.0.1: discovery document and JWKS served by
aiohttp, keys generated per test, ID tokens signed with them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jwt
import pytest_asyncio
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

AUDIENCE = "rethink-mn-test"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class FakeIdp:
    """An IdP's discovery document and JWKS; ``keys`` is what it publishes right now."""

    url: str = ""
    keys: list[dict[str, Any]] = field(default_factory=list)
    jwks_requests: int = 0
    discovery_issuer: str | None = None  # None: its own URL
    up: bool = True

    def publish(self, kid: str, private: Any, **extra: Any) -> None:
        public = private.public_key()
        algo = RSAAlgorithm if isinstance(public, rsa.RSAPublicKey) else ECAlgorithm
        jwk = algo.to_jwk(public, as_dict=True)
        self.keys.append({**jwk, "kid": kid, "use": "sig", **extra})

    def token(self, private: Any, kid: str | None, alg: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        payload = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": "248289761001",
            "email": "alice@gmail.com",
            "email_verified": True,
            "name": "Alice Liddell",
            "iat": now,
            "exp": now + 300,
            **claims,
        }
        payload = {k: v for k, v in payload.items() if v is not None}
        headers = {"kid": kid} if kid is not None else {}
        return jwt.encode(payload, private, algorithm=alg, headers=headers)


@pytest_asyncio.fixture(loop_scope="session")
async def idp() -> AsyncIterator[FakeIdp]:
    state = FakeIdp()

    async def discovery(request: web.Request) -> web.Response:
        if not state.up:
            return web.Response(status=503)
        return web.json_response(
            {"issuer": state.discovery_issuer or state.url, "jwks_uri": f"{state.url}/jwks"}
        )

    async def jwks(request: web.Request) -> web.Response:
        state.jwks_requests += 1
        if not state.up:
            return web.Response(status=503)
        return web.json_response({"keys": state.keys})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_get("/jwks", jwks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield state
    await runner.cleanup()

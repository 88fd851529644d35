"""Matrix access tokens verified against the session's real Synapse."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from adapter.identity import IdentityRejected, IdentityUnavailable
from adapter.identity.matrix import MatrixTokenVerifier

from ..conftest import Homeserver
from ..support.matrix_users import deactivate, login, logout, register_user

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def test_tokens_are_bound_to_their_users(
    homeserver: Homeserver, http: aiohttp.ClientSession
) -> None:
    alice = await register_user(http, homeserver, unique("alice"))
    bob = await register_user(http, homeserver, unique("bob"))
    verifier = MatrixTokenVerifier(http, homeserver.url, cache_seconds=0)

    identity = await verifier.verify(alice.access_token)
    assert identity.user_id == alice.user_id
    assert identity.method == "matrix" and identity.authenticated
    assert identity.idp_domain == homeserver.server_name
    localpart = alice.user_id[1:].split(":")[0]
    assert identity.user_url == f"user://{homeserver.server_name}/{localpart}"
    assert identity.to_rethink()["userProfile"]["username"] == alice.user_id

    other = await verifier.verify(bob.access_token)
    assert other.user_id == bob.user_id != identity.user_id

    for wrong in (alice.access_token + "x", "syt_not_a_token", "   "):
        with pytest.raises(IdentityRejected) as refused:
            await verifier.verify(wrong)
        assert refused.value.code == 401


async def test_logged_out_and_deactivated_tokens_are_refused(
    homeserver: Homeserver, http: aiohttp.ClientSession
) -> None:
    carol = await register_user(http, homeserver, unique("carol"))
    admin = await register_user(http, homeserver, unique("admin"), admin=True)
    session_token = await login(http, homeserver, carol)
    verifier = MatrixTokenVerifier(http, homeserver.url, cache_seconds=0)
    assert (await verifier.verify(session_token)).user_id == carol.user_id

    await logout(http, homeserver, session_token)
    with pytest.raises(IdentityRejected, match="M_UNKNOWN_TOKEN"):
        await verifier.verify(session_token)
    # Her other device is still logged in ...
    assert (await verifier.verify(carol.access_token)).user_id == carol.user_id
    # ... until the account is deactivated.
    await deactivate(http, homeserver, admin, carol.user_id)
    with pytest.raises(IdentityRejected):
        await verifier.verify(carol.access_token)


async def test_answers_are_cached_briefly_and_refusals_barely(homeserver: Homeserver) -> None:
    requests = 0

    async def count(*_: object) -> None:
        nonlocal requests
        requests += 1

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(count)
    async with aiohttp.ClientSession(trace_configs=[trace]) as http:
        dave = await register_user(http, homeserver, unique("dave"))
        token = await login(http, homeserver, dave)
        now = [0.0]
        verifier = MatrixTokenVerifier(http, homeserver.url, cache_seconds=30, clock=lambda: now[0])
        requests = 0
        assert (await verifier.verify(token)).user_id == dave.user_id
        assert requests == 1
        await logout(http, homeserver, token)
        requests = 0
        # Within the positive cache the homeserver is not asked again ...
        now[0] = 29.0
        assert (await verifier.verify(token)).user_id == dave.user_id
        assert requests == 0
        # ... beyond it, the logout shows.
        now[0] = 31.0
        with pytest.raises(IdentityRejected):
            await verifier.verify(token)
        assert requests == 1
        # A refusal is remembered for a second at most, then the homeserver is asked again.
        now[0] = 31.9
        with pytest.raises(IdentityRejected):
            await verifier.verify(token)
        assert requests == 1
        now[0] = 32.1
        with pytest.raises(IdentityRejected):
            await verifier.verify(token)
        assert requests == 2


async def test_unreachable_homeserver_is_not_a_refusal(http: aiohttp.ClientSession) -> None:
    verifier = MatrixTokenVerifier(http, "http://127.0.0.1:9", timeout_seconds=2)
    with pytest.raises(IdentityUnavailable) as unavailable:
        await verifier.verify("syt_whatever")
    assert unavailable.value.code == 503

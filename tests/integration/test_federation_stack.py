"""The two-domain stack: two Synapses federating over loopback (TLS with the local CA, IP-literal
server names), driven with plain client-server calls made as each domain's appservice."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio

from adapter.config import parse_config
from adapter.configfile import write_registration
from adapter.localstack.federation import server_name_for, start_homeservers
from adapter.localstack.synapse import FederationSettings, SynapseSettings, free_port
from adapter.localstack.tls import KeyPair, ensure_server_certificate
from adapter.localstack.up import start_two_homeservers
from adapter.private_files import dump_private_yaml
from appservice.registration import build_registration

from ..conftest import APPSERVICE_ID, FederatedHomeserver, Federation
from ..support.appservice_listener import AppserviceListener, Event, appservice_listener

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CUSTOM = "org.rethink.test"


@dataclass
class Side:
    hs: FederatedHomeserver
    pushed: AppserviceListener


@dataclass
class Domains:
    a: Side
    b: Side
    http: aiohttp.ClientSession


def listen_as(hs: FederatedHomeserver) -> AbstractAsyncContextManager[AppserviceListener]:
    return appservice_listener(
        hs.appservice_port,
        hs.hs_token,
        homeserver_url=hs.url,
        as_token=hs.as_token,
        appservice_id=APPSERVICE_ID,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def domains(federation: Federation) -> AsyncIterator[Domains]:
    # Up for the whole module: a homeserver whose push fails backs the appservice off for
    # minutes, so the listeners must not come and go between tests.
    a, b = federation.a, federation.b
    async with (
        listen_as(a) as pushed_a,
        listen_as(b) as pushed_b,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
    ):
        yield Domains(Side(a, pushed_a), Side(b, pushed_b), http)


@asynccontextmanager
async def stranger_homeserver(
    federation: Federation, python: Path, data_dir: Path
) -> AsyncIterator[FederatedHomeserver]:
    """A third homeserver, certified by the same CA and willing to federate with A and B,
    which are not willing to federate with it."""
    ca = KeyPair(federation.ca_certificate, federation.ca_certificate.with_name("ca.key"))
    leaf = ensure_server_certificate(ca, data_dir, "federation", ip_addresses=["127.0.0.1"])
    fed_port, as_port = free_port(), free_port()
    server_name = server_name_for(fed_port)
    as_token = secrets.token_urlsafe(24)
    registration = data_dir / "registration.yaml"
    dump_private_yaml(
        build_registration(
            appservice_id="stranger",
            url=f"http://127.0.0.1:{as_port}",
            as_token=as_token,
            hs_token=secrets.token_urlsafe(24),
            sender_localpart="_rethink_bot",
            user_prefix="_rethink_",
            alias_prefix="_rethink_",
            server_name=server_name,
        ),
        registration,
    )
    settings = SynapseSettings(
        data_dir,
        server_name,
        free_port(),
        registration,
        federation=FederationSettings(
            port=fed_port,
            certificate=leaf.certificate,
            private_key=leaf.private_key,
            ca_certificates=(ca.certificate,),
            peers=(federation.a.server_name, federation.b.server_name),
        ),
    )
    (process,) = await start_homeservers(python, [settings])
    try:
        yield FederatedHomeserver(
            settings.url, server_name, as_token, "", as_port, process, fed_port, "c.mn.test"
        )
    finally:
        await process.stop_async()


async def call(
    http: aiohttp.ClientSession,
    hs: FederatedHomeserver,
    method: str,
    path: str,
    body: Any = None,
    **params: str,
) -> tuple[int, dict[str, Any]]:
    """A client-server call as ``hs``'s appservice (its bot unless ``user_id`` masquerades)."""
    async with http.request(
        method,
        hs.url + path,
        json=body,
        params=params,
        headers={"Authorization": f"Bearer {hs.as_token}"},
    ) as resp:
        return resp.status, await resp.json()


def room_path(room_id: str) -> str:
    return f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}"


def membership(room_id: str, user: str, state: str) -> Any:
    def match(event: Event) -> bool:
        return (
            event.get("room_id") == room_id
            and event.get("type") == "m.room.member"
            and event.get("state_key") == user
            and event.get("content", {}).get("membership") == state
        )

    return match


def event_id_is(event_id: str) -> Any:
    return lambda event: event.get("event_id") == event_id


async def send(d: Domains, hs: FederatedHomeserver, room_id: str, content: Any) -> str:
    status, answer = await call(
        d.http, hs, "PUT", f"{room_path(room_id)}/send/{CUSTOM}/{secrets.token_hex(8)}", content
    )
    assert status == 200, answer
    return str(answer["event_id"])


async def create_room(d: Domains, hs: FederatedHomeserver) -> str:
    status, answer = await call(
        d.http,
        hs,
        "POST",
        "/_matrix/client/v3/createRoom",
        {"preset": "private_chat", "creation_content": {"m.federate": True}},
    )
    assert status == 200, answer
    return str(answer["room_id"])


async def shared_room(d: Domains) -> str:
    """A room created by A's bot that B's bot joined over federation after an invite."""
    a, b = d.a.hs, d.b.hs
    room_id = await create_room(d, a)
    status, answer = await call(
        d.http, a, "POST", f"{room_path(room_id)}/invite", {"user_id": b.bot}
    )
    assert status == 200, answer
    await d.b.pushed.wait_for(membership(room_id, b.bot, "invite"))
    status, answer = await call(d.http, b, "POST", f"{room_path(room_id)}/join", {})
    assert status == 200, answer
    # A's appservice hears of the remote join: it sees every event of rooms its users are in.
    await d.a.pushed.wait_for(membership(room_id, b.bot, "join"))
    return room_id


async def test_bots_of_two_domains_talk_in_a_federated_room(domains: Domains) -> None:
    d = domains
    room_id = await shared_room(d)

    nonce = secrets.token_hex(8)
    sent = await send(d, d.a.hs, room_id, {"from": "a", "nonce": nonce})
    got = await d.b.pushed.wait_for(event_id_is(sent))
    assert got["type"] == CUSTOM and got["sender"] == d.a.hs.bot
    assert got["content"] == {"from": "a", "nonce": nonce}

    reply = await send(d, d.b.hs, room_id, {"from": "b", "nonce": nonce})
    got = await d.a.pushed.wait_for(event_id_is(reply))
    assert got["sender"] == d.b.hs.bot


async def test_media_uploaded_on_a_is_downloaded_through_b(domains: Domains) -> None:
    d = domains
    payload = secrets.token_bytes(4096)
    async with d.http.post(
        f"{d.a.hs.url}/_matrix/media/v3/upload",
        params={"filename": "blob.bin"},
        data=payload,
        headers={
            "Authorization": f"Bearer {d.a.hs.as_token}",
            "Content-Type": "application/octet-stream",
        },
    ) as resp:
        answer = await resp.json()
        assert resp.status == 200, answer
    server, media_id = answer["content_uri"].removeprefix("mxc://").split("/", 1)
    assert server == d.a.hs.server_name

    # Authenticated media: B's homeserver fetches it from A over federation for B's bot.
    async with d.http.get(
        f"{d.b.hs.url}/_matrix/client/v1/media/download/{server}/{media_id}",
        headers={"Authorization": f"Bearer {d.b.hs.as_token}"},
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert await resp.read() == payload


async def test_a_server_off_the_whitelist_is_refused_both_ways(
    domains: Domains, federation: Federation, synapse_python: Path, tmp_path: Path
) -> None:
    d = domains
    async with stranger_homeserver(federation, synapse_python, tmp_path) as stranger:
        room_id = await create_room(d, d.a.hs)
        # Outbound: A does not even contact a server off its whitelist.
        status, answer = await call(
            d.http, d.a.hs, "POST", f"{room_path(room_id)}/invite", {"user_id": stranger.bot}
        )
        assert status == 403 and "Federation denied" in answer.get("error", ""), (status, answer)

        # Inbound: the stranger trusts A, but A refuses its requests.
        own_room = await create_room(d, stranger)
        status, answer = await call(
            d.http, stranger, "POST", f"{room_path(own_room)}/invite", {"user_id": d.a.hs.bot}
        )
        assert status == 403 and "Federation denied" in answer.get("error", ""), (status, answer)
        status, answer = await call(
            d.http,
            stranger,
            "POST",
            f"/_matrix/client/v3/join/{quote(room_id, safe='')}",
            {},
            server_name=d.a.hs.server_name,
        )
        assert status == 403, (status, answer)
    assert not any(e.get("sender") == stranger.bot for e in d.a.pushed.events)


async def test_a_restarted_peer_receives_what_was_sent_while_it_was_down(
    domains: Domains,
) -> None:
    d = domains
    room_id = await shared_room(d)
    await d.b.hs.process.stop_async()
    try:
        missed = await send(d, d.a.hs, room_id, {"while": "down"})
    finally:
        d.b.hs.process.start()
        await d.b.hs.process.wait_ready()
    started = time.monotonic()
    await d.b.pushed.wait_for(event_id_is(missed), timeout=90)
    print(f"delivered {time.monotonic() - started:.1f}s after B was back")


async def test_up_starts_two_federating_homeservers_and_keeps_their_certificates(
    tmp_path: Path,
) -> None:
    configs = []
    for name, client_port, fed_port in (
        ("domain-a", free_port(), free_port()),
        ("domain-b", free_port(), free_port()),
    ):
        config = parse_config(
            {
                "domain": f"{name}.test",
                "homeserver": {
                    "url": f"http://127.0.0.1:{client_port}",
                    "server_name": server_name_for(fed_port),
                },
                "appservice": {
                    "as_token": f"{name}-as-token-0000000000",
                    "hs_token": f"{name}-hs-token-0000000000",
                },
            },
            environ={},
        )
        write_registration(config, tmp_path / name / "registration.yaml")
        configs.append(config)
    pair = (configs[0], configs[1])
    certificates: list[bytes] = []
    for _ in range(2):
        a, b = await start_two_homeservers(tmp_path, pair, lambda _msg: None)
        try:
            # A asks B for its bot's device keys: a federation request, listed under
            # `failures` when B cannot be reached or is refused.
            bot_b = f"@_rethink_bot:{b.settings.server_name}"
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    f"{a.settings.url}/_matrix/client/v3/keys/query",
                    json={"device_keys": {bot_b: []}},
                    headers={"Authorization": "Bearer domain-a-as-token-0000000000"},
                ) as resp,
            ):
                answer = await resp.json()
                assert resp.status == 200 and answer["failures"] == {}, answer
                assert bot_b in answer["device_keys"], answer
        finally:
            await a.stop_async()
            await b.stop_async()
        certificates.append(_certificates(tmp_path))
    assert certificates[0] == certificates[1]


def _certificates(state_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(state_dir.glob("**/*.crt")))

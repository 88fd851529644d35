"""Real Matrix users on the test session's Synapse: the admin register API with the shared secret
(HMAC nonce flow), then the ordinary client API."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

import aiohttp
from ruamel.yaml import YAML

from ..conftest import Homeserver


@dataclass(frozen=True)
class MatrixUser:
    user_id: str
    password: str
    access_token: str


def _shared_secret(homeserver: Homeserver) -> str:
    config = YAML(typ="safe", pure=True).load(homeserver.process.settings.config_file.read_text())
    return str(config["registration_shared_secret"])


async def register_user(
    http: aiohttp.ClientSession, homeserver: Homeserver, localpart: str, *, admin: bool = False
) -> MatrixUser:
    url = f"{homeserver.url}/_synapse/admin/v1/register"
    async with http.get(url) as resp:
        resp.raise_for_status()
        nonce = (await resp.json())["nonce"]
    password = secrets.token_urlsafe(16)
    body = {
        "nonce": nonce,
        "username": localpart,
        "password": password,
        "admin": admin,
        "mac": _mac(_shared_secret(homeserver), nonce, localpart, password, admin),
    }
    async with http.post(url, json=body) as resp:
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
    return MatrixUser(answer["user_id"], password, answer["access_token"])


def _mac(secret: str, nonce: str, user: str, password: str, admin: bool) -> str:
    # Synapse's shared-secret registration: HMAC-SHA1 over the fields joined by NUL bytes.
    message = b"\x00".join(
        part.encode() for part in (nonce, user, password, "admin" if admin else "notadmin")
    )
    return hmac.new(secret.encode(), message, hashlib.sha1).hexdigest()


async def login(http: aiohttp.ClientSession, homeserver: Homeserver, user: MatrixUser) -> str:
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user.user_id},
        "password": user.password,
    }
    async with http.post(f"{homeserver.url}/_matrix/client/v3/login", json=body) as resp:
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
    return str(answer["access_token"])


async def logout(http: aiohttp.ClientSession, homeserver: Homeserver, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(
        f"{homeserver.url}/_matrix/client/v3/logout", headers=headers, json={}
    ) as resp:
        assert resp.status == 200, await resp.text()


async def deactivate(
    http: aiohttp.ClientSession, homeserver: Homeserver, admin: MatrixUser, user_id: str
) -> None:
    headers = {"Authorization": f"Bearer {admin.access_token}"}
    async with http.post(
        f"{homeserver.url}/_synapse/admin/v1/deactivate/{user_id}", headers=headers, json={}
    ) as resp:
        assert resp.status == 200, await resp.text()

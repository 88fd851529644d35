"""Who may see the dashboard's figures: loopback, or the operator token."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from adapter.config import DashboardConfig
from adapter.ops.live_dashboard import DashboardAccess

TOKEN = "t" * 24


def request(peer: str | None, headers: dict[str, str] | None = None, query: str = "") -> Any:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 50000) if name == "peername" and peer else default
    )
    return make_mocked_request(
        "GET", "/dashboard/data.json" + query, headers=headers or {}, transport=transport
    )


@pytest.mark.parametrize("peer", ["127.0.0.1", "::1", "127.8.9.10"])
def test_loopback_needs_no_token(peer: str) -> None:
    DashboardAccess(DashboardConfig()).check(request(peer))


@pytest.mark.parametrize("peer", ["10.0.0.5", "192.0.2.2", "::ffff:10.0.0.5", None])
def test_without_a_token_configured_only_loopback_gets_in(peer: str | None) -> None:
    with pytest.raises(web.HTTPForbidden):
        DashboardAccess(DashboardConfig()).check(request(peer))


def test_elsewhere_the_token_is_needed_as_bearer_or_query() -> None:
    access = DashboardAccess(DashboardConfig(token=TOKEN))
    access.check(request("10.0.0.5", {"Authorization": f"Bearer {TOKEN}"}))
    access.check(request("10.0.0.5", query=f"?token={TOKEN}"))
    for refused in (
        request("10.0.0.5"),
        request("10.0.0.5", {"Authorization": f"Basic {TOKEN}"}),
        request("10.0.0.5", {"Authorization": "Bearer " + "x" * 24}),
        request("10.0.0.5", {"Authorization": f"Bearer {TOKEN[:-1]}"}),
        request("10.0.0.5", query="?token="),
    ):
        with pytest.raises(web.HTTPUnauthorized) as raised:
            access.check(refused)
        assert raised.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_behind_a_local_proxy_loopback_is_not_trusted() -> None:
    access = DashboardAccess(DashboardConfig(token=TOKEN, trust_loopback=False))
    with pytest.raises(web.HTTPUnauthorized):
        access.check(request("127.0.0.1"))
    access.check(request("127.0.0.1", {"Authorization": f"Bearer {TOKEN}"}))


def test_a_short_token_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        DashboardConfig(token="short")

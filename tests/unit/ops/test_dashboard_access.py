"""Who may see the dashboard's figures: loopback, or the operator token."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from adapter.clients import ClientKeys
from adapter.config import DashboardConfig
from adapter.ops.live_dashboard import DashboardAccess

TOKEN = "t" * 24
BEARER = {"Authorization": f"Bearer {TOKEN}"}


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
    DashboardAccess(DashboardConfig(), ClientKeys()).check(request(peer))


@pytest.mark.parametrize("peer", ["10.0.0.5", "192.0.2.2", "::ffff:10.0.0.5", None])
def test_without_a_token_configured_only_loopback_gets_in(peer: str | None) -> None:
    with pytest.raises(web.HTTPForbidden):
        DashboardAccess(DashboardConfig(), ClientKeys()).check(request(peer))


def test_elsewhere_the_token_is_needed_as_bearer_or_query() -> None:
    access = DashboardAccess(DashboardConfig(token=TOKEN), ClientKeys())
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
    access = DashboardAccess(DashboardConfig(token=TOKEN, trust_loopback=False), ClientKeys())
    with pytest.raises(web.HTTPUnauthorized):
        access.check(request("127.0.0.1"))
    access.check(request("127.0.0.1", {"Authorization": f"Bearer {TOKEN}"}))


def test_through_a_trusted_proxy_on_loopback_the_client_is_the_one_it_names() -> None:
    """A reverse proxy on this machine passes on requests from anywhere: its loopback address
    opens nothing, the client it names decides, and a header a client forges from outside the
    trusted proxies gains nothing."""
    access = DashboardAccess(DashboardConfig(token=TOKEN), ClientKeys(["127.0.0.1"]))
    for through_proxy in (
        request("127.0.0.1", {"X-Forwarded-For": "203.0.113.7"}),
        request("127.0.0.1", {"X-Forwarded-For": "127.0.0.1, 203.0.113.7"}),  # forged first hop
        request("127.0.0.1", {"Forwarded": "for=203.0.113.7"}),
        request("127.0.0.1"),  # the proxy naming nobody stands for anybody
    ):
        with pytest.raises(web.HTTPUnauthorized):
            access.check(through_proxy)
    access.check(request("127.0.0.1", {"X-Forwarded-For": "::1"}))  # a browser on this machine
    access.check(request("127.0.0.1", {"X-Forwarded-For": "203.0.113.7", **BEARER}))
    with pytest.raises(web.HTTPUnauthorized):  # from elsewhere, the header is no one's word
        access.check(request("10.0.0.5", {"X-Forwarded-For": "127.0.0.1"}))


def test_a_short_token_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        DashboardConfig(token="short")

"""Which pages may open a stub connection: an Origin header is anybody's text, so every value,
however malformed, gets an answer (allowed or refused), never an error of the node's."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from adapter.stub.origins import OriginCheck


def _refusal(check: OriginCheck, origin: str) -> str | None:
    request = make_mocked_request("GET", "/stub/connect", headers={"Origin": origin})
    return check.refusal(request)


@pytest.mark.parametrize(
    "origin",
    [
        "http://[::ffff:127.0.0.1]",
        "http://[::1]:1",
        "https://xn--localhost-",
        "http://[::1",
        "http://localhost:99999",
        "http://exa mple.org",
        "null",
        "",
        "\x00",
    ],
)
def test_a_malformed_origin_is_answered(origin: str) -> None:
    for check in (OriginCheck(None), OriginCheck(["https://app.example"], ["node.example"])):
        refusal = _refusal(check, origin)
        assert refusal is None or "may not open stub connections" in refusal


def test_listed_origins_and_the_nodes_own_hosts_connect_others_do_not() -> None:
    check = OriginCheck(["https://app.example", "http://[::1]:8080"], ["node.example"])
    assert _refusal(check, "https://app.example") is None
    assert _refusal(check, "https://APP.example:443") is None
    assert _refusal(check, "http://[::1]:8080") is None
    assert _refusal(check, "https://node.example:8443") is None
    assert _refusal(check, "https://evil.example") is not None
    assert _refusal(check, "http://localhost") is not None  # listed origins replace loopback
    loopback_only = OriginCheck(None)
    assert _refusal(loopback_only, "http://localhost:3000") is None
    assert _refusal(loopback_only, "http://[::1]:3000") is None
    assert _refusal(loopback_only, "http://localhost.evil.example") is not None

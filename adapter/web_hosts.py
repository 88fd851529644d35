"""Which ``Host`` names the node's listeners answer to: a guard against DNS rebinding.

A web page on ``http://evil.example`` whose name the attacker then points at 127.0.0.1 (or at
the operator's network) can make a browser send it requests to the node as if to its own site:
the browser believes it is talking to evil.example, sends no credentials of ours, but reads the
answers. Such a request still names ``evil.example`` in its ``Host`` header. So every listener
answers only requests for a name it is known by: an IP address (a page served from an address is
that address's own), a loopback name (``localhost``, ``*.localhost``), or a name the operator
lists as the listener's public name. Anything else gets 421 Misdirected Request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from yarl import URL

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def host_name(host_header: str) -> str:
    """The name in a ``Host`` header (``name[:port]``, ``[v6]:port``), in lower case."""
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")].lower()
    return (
        host_header.rsplit(":", 1)[0].lower()
        if host_header.count(":") == 1
        else host_header.lower()
    )


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class KnownHosts:
    """The names one listener is known by, besides IP addresses and loopback names."""

    def __init__(self, public_hosts: Iterable[str], config_key: str) -> None:
        self._names = frozenset(host_name(h) for h in public_hosts if h)
        self._config_key = config_key

    def knows(self, name: str) -> bool:
        return name in self._names or is_ip_literal(name) or is_loopback_name(name)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        name = host_name(request.host)
        if not self.knows(name):
            raise web.HTTPMisdirectedRequest(
                text=f"this node is not known as {name[:100]!r}: list it in {self._config_key}"
            )
        return await handler(request)


def url_host(url: str) -> str:
    """The host name of a URL, for a listener's names (``appservice.public_url``)."""
    return (URL(url).host or "").lower()

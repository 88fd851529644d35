"""Which web pages may open a stub connection.

A browser sends the page's ``Origin`` with every WebSocket upgrade and lets any page connect
anywhere: without this check, any site a user visits could open a stub connection to a node on
their machine or network and act as a runtime. Runtimes outside browsers (Node.js) send no
``Origin`` and are not affected.

An origin is compared with what the node is configured to be, never with the request's own
``Host`` header, which the page's author chooses (DNS rebinding). Accepted:
- an origin listed in ``stub.allowed_origins`` (``scheme://host[:port]``, or ``*`` for any);
- the node's own pages (such as ``/demo``): an origin whose host is one of ``stub.public_hosts``,
  or the IP address and port the connection arrived at;
- when ``stub.allowed_origins`` is unset, pages served from loopback.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from yarl import URL

from ..web_hosts import host_name, is_ip_literal, is_loopback_name

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


Origin = tuple[str, str, int | None]  # scheme, host (lower case, IPv6 without brackets), port


def _parse(origin: str) -> Origin | None:
    """An origin's scheme, host and port (spelled out), in lower case; None if unparseable.
    A header is anybody's text: whatever yarl cannot read (an IDNA error, a bad port) is an
    origin that may not connect, never an error of the node's."""
    try:
        url = URL(origin.strip())
        host = url.host
        port = url.port or _DEFAULT_PORTS.get(url.scheme)
    except (ValueError, UnicodeError):
        return None
    if not url.scheme or not host:
        return None
    return url.scheme.lower(), host.lower(), port


class OriginCheck:
    def __init__(self, allowed: list[str] | None, public_hosts: Iterable[str] = ()) -> None:
        self._any = allowed is not None and "*" in allowed
        self._allowed = None if allowed is None else {_parse(o) for o in allowed} - {None}
        self._own_names = frozenset(host_name(h) for h in public_hosts if h)

    def refusal(self, request: web.Request) -> str | None:
        """Why this upgrade's origin may not connect, or None when it may."""
        origin = request.headers.get("Origin")
        if origin is None or self._any:
            return None
        parsed = _parse(origin)
        if parsed is None:
            return f"origin {origin[:100]!r} may not open stub connections"
        _, host, port = parsed
        if host in self._own_names or self._arrived_at(host, port, request):
            return None
        if self._allowed is not None:
            if parsed in self._allowed:
                return None
        elif is_loopback_name(host):
            return None
        return (
            f"origin {origin[:100]!r} may not open stub connections "
            "(the operator lists allowed origins in stub.allowed_origins)"
        )

    @staticmethod
    def _arrived_at(host: str, port: int | None, request: web.Request) -> bool:
        """Whether the origin is the address and port this connection arrived at: a page the
        node served from that address (the socket says so, not a header)."""
        if not is_ip_literal(host) or request.transport is None:
            return False
        local = request.transport.get_extra_info("sockname")
        if not isinstance(local, tuple) or len(local) < 2:
            return False
        return bool(str(local[0]).lower() == host and local[1] == port)

"""Which web pages may open a stub connection.

A browser sends the page's ``Origin`` with every WebSocket upgrade and lets any page connect
anywhere: without this check, any site a user visits could open a stub connection to a node on
their machine or network and act as a runtime. Runtimes outside browsers (Node.js) send no
``Origin`` and are not affected.

``stub.allowed_origins`` lists the origins accepted (``scheme://host[:port]``, or ``*`` for any);
the node's own origin (a page it serves itself, such as ``/demo``) is always accepted, and when
the list is unset so are pages served from loopback.
"""

from __future__ import annotations

import ipaddress

from aiohttp import web
from yarl import URL

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _normal(origin: str) -> str | None:
    """``scheme://host:port`` in lower case with the port spelled out; None if unparseable."""
    try:
        url = URL(origin.strip())
    except ValueError:
        return None
    if not url.scheme or not url.host:
        return None
    port = url.port or _DEFAULT_PORTS.get(url.scheme)
    return f"{url.scheme.lower()}://{url.host.lower()}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class OriginCheck:
    def __init__(self, allowed: list[str] | None) -> None:
        self._any = allowed is not None and "*" in allowed
        self._allowed = None if allowed is None else {_normal(o) for o in allowed} - {None}

    def refusal(self, request: web.Request) -> str | None:
        """Why this upgrade's origin may not connect, or None when it may."""
        origin = request.headers.get("Origin")
        if origin is None or self._any:
            return None
        normal = _normal(origin)
        if normal is None:
            return f"origin {origin[:100]!r} may not open stub connections"
        if self._same_origin(normal, request):
            return None
        if self._allowed is not None:
            if normal in self._allowed:
                return None
        elif _is_loopback(URL(normal).host or ""):
            return None
        return (
            f"origin {origin[:100]!r} may not open stub connections "
            "(the operator lists allowed origins in stub.allowed_origins)"
        )

    @staticmethod
    def _same_origin(normal: str, request: web.Request) -> bool:
        # Scheme aside: behind a TLS proxy the page is https and the upgrade reaches us as http.
        host = URL(normal)
        served = URL(f"http://{request.host}")
        served_port = served.port if served.explicit_port else host.port
        return host.host == (served.host or "").lower() and host.port == served_port

"""Who a client is, for the bounds one client may take of the node's resources (bounds.py).

A client is the identity the node verified for it where there is one (``id:<method>:<key>``);
otherwise the host it connects from (``ip:<address>``). An IPv6 host is its /64 network: one
subscriber line gets a whole /64 and can pick a fresh address from it for every connection.

Behind a reverse proxy every connection comes from the proxy, so the client's own address is the
one the proxy adds (``X-Forwarded-For``, or ``Forwarded: for=``). That header is believed only
when the connection comes from a proxy the operator listed (``stub.trusted_proxies``); from
anyone else it is a claim the client makes about itself, and ignored. Behind a chain of proxies
the client is the nearest address that is not a trusted proxy, read from the right.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# The client key of a connection whose remote address is not known (a Unix socket, a test).
UNKNOWN_HOST = "ip:unknown"


def parse_networks(values: Iterable[str]) -> list[IPNetwork]:
    """``stub.trusted_proxies``: addresses or networks (``10.0.0.0/8``). Raises ValueError."""
    return [ipaddress.ip_network(value.strip(), strict=False) for value in values]


def _address(text: str) -> IPAddress | None:
    text = text.strip().strip('"')
    if text.startswith("["):  # Forwarded: for="[2001:db8::1]:4711"
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:  # an IPv4 address with a port
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def host_key(address: IPAddress) -> str:
    """The client key of a host: its address, an IPv6 host's /64 network."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is not None:
            return f"ip:{mapped}"
        return f"ip:{ipaddress.IPv6Network((address, 64), strict=False)}"
    return f"ip:{address}"


class ClientKeys:
    """Names the client of a connection (see the module's docstring)."""

    def __init__(self, trusted_proxies: Iterable[str] = ()) -> None:
        self._trusted = parse_networks(trusted_proxies)

    def _is_proxy(self, address: IPAddress) -> bool:
        return any(address in network for network in self._trusted)

    def host(self, remote: str | None, headers: Mapping[str, str]) -> str:
        """The client key of a connection from ``remote`` carrying ``headers``."""
        peer = _address(remote) if remote else None
        if peer is None:
            return UNKNOWN_HOST
        if not self._trusted or not self._is_proxy(peer):
            return host_key(peer)
        for hop in reversed(_forwarded_hops(headers)):
            address = _address(hop)
            if address is None:
                # What the proxy passed on is not an address: the proxy is the client we know.
                return host_key(peer)
            if not self._is_proxy(address):
                return host_key(address)
        return host_key(peer)

    @staticmethod
    def of(host: str, identity_key: tuple[str, ...] | None) -> str:
        """The client key: the verified identity's where there is one, else the host's."""
        if identity_key is not None:
            return "id:" + ":".join(identity_key)
        return host


def _forwarded_hops(headers: Mapping[str, str]) -> list[str]:
    """The addresses the proxies recorded, the client's first (RFC 7239, or X-Forwarded-For)."""
    forwarded = headers.get("Forwarded")
    if forwarded:
        hops = []
        for element in forwarded.split(","):
            for pair in element.split(";"):
                name, _, value = pair.strip().partition("=")
                if name.lower() == "for":
                    hops.append(value)
        if hops:
            return hops
    legacy = headers.get("X-Forwarded-For")
    return [hop for hop in legacy.split(",") if hop.strip()] if legacy else []

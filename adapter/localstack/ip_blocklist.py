"""Synapse's outbound IP blocklist with exactly the local federation peers let through.

Synapse refuses outbound federation to loopback and private ranges. `ip_range_whitelist` does
not help peers named by IP literals: Synapse 1.163 checks an IP-literal destination against the
blocklist alone (the BlocklistingAgentWrapper around its federation agent gets no allowlist), so
the peers' addresses have to be cut out of the blocklist itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

# Synapse 1.163's default `ip_range_blacklist` (DEFAULT_IP_RANGE_BLOCKLIST in
# synapse/config/server.py); setting the option replaces the default, so it is restated here.
SYNAPSE_DEFAULT_BLOCKLIST = (
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "169.254.0.0/16",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "192.0.2.0/24",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "::1/128",
    "fe80::/10",
    "fc00::/7",
    "2001:db8::/32",
    "ff00::/8",
    "fec0::/10",
)


def blocklist_except(addresses: Iterable[str]) -> list[str]:
    """The default blocklist minus ``addresses`` (single hosts), as CIDR strings."""
    networks = [ipaddress.ip_network(n) for n in SYNAPSE_DEFAULT_BLOCKLIST]
    for address in addresses:
        host = ipaddress.ip_network(address)
        remaining: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for net in networks:
            remaining.extend(_exclude(net, host))
        networks = remaining
    return [str(n) for n in networks]


def _exclude(
    net: ipaddress.IPv4Network | ipaddress.IPv6Network,
    host: ipaddress.IPv4Network | ipaddress.IPv6Network,
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    if isinstance(net, ipaddress.IPv4Network) and isinstance(host, ipaddress.IPv4Network):
        return list(net.address_exclude(host)) if host.subnet_of(net) else [net]
    if isinstance(net, ipaddress.IPv6Network) and isinstance(host, ipaddress.IPv6Network):
        return list(net.address_exclude(host)) if host.subnet_of(net) else [net]
    return [net]

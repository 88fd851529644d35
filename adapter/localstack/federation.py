"""Local homeservers that federate with each other over loopback, for two-domain stacks.

Each homeserver's server name is its federation address, an IP literal with a port
(`127.0.0.1:8448`): Matrix then connects straight to it, with no `.well-known` or SRV lookup and
no DNS, and checks the certificate's IP SubjectAltName. Every homeserver trusts one local CA and
federates only with the others of the group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path

from .synapse import (
    FederationSettings,
    LocalStackError,
    SynapseProcess,
    SynapseSettings,
    write_homeserver_config,
)
from .tls import ensure_ca, ensure_server_certificate


def server_name_for(port: int, host: str = "127.0.0.1") -> str:
    """The server name of a homeserver whose federation listener is ``host:port``."""
    return f"{host}:{port}"


def federation_address(server_name: str) -> tuple[str, int]:
    """The (IPv4 address, port) a server name like `127.0.0.1:8448` designates."""
    host, sep, port = server_name.rpartition(":")
    try:
        address = ipaddress.IPv4Address(host)
        number = int(port)
    except ValueError:
        address, number = None, 0
    if not sep or address is None or not 0 < number < 65536:
        raise LocalStackError(
            f"server name {server_name!r}: homeservers that federate locally are named by their "
            "federation address, an IPv4 literal with a port such as 127.0.0.1:8448"
        )
    return str(address), number


def federating(group: Sequence[SynapseSettings], tls_dir: Path) -> list[SynapseSettings]:
    """``group`` with federation turned on: each homeserver listens for federation on the port its
    server name says, with a certificate from the local CA in ``tls_dir`` (kept in its own data
    directory), and federates with the others of the group only."""
    names = [s.server_name for s in group]
    if len(set(names)) != len(names):
        raise LocalStackError(f"the homeservers need distinct server names, not {names}")
    ca = ensure_ca(tls_dir)
    result = []
    for settings in group:
        host, port = federation_address(settings.server_name)
        if host != settings.host:
            raise LocalStackError(
                f"server name {settings.server_name} names {host}, but the homeserver listens on "
                f"{settings.host}"
            )
        leaf = ensure_server_certificate(ca, settings.data_dir, "federation", ip_addresses=[host])
        peers = tuple(n for n in names if n != settings.server_name)
        federation = FederationSettings(
            port=port,
            certificate=leaf.certificate,
            private_key=leaf.private_key,
            ca_certificates=(ca.certificate,),
            peers=peers,
            peer_addresses=tuple(sorted({federation_address(n)[0] for n in peers})),
        )
        result.append(dataclasses.replace(settings, federation=federation))
    ports = [p for s in result for p in s.ports]
    if len(set(ports)) != len(ports):
        raise LocalStackError(f"the homeservers' listeners need distinct ports, not {ports}")
    return result


async def start_homeservers(
    python: Path, group: Sequence[SynapseSettings], say: Callable[[str], None] = lambda _m: None
) -> list[SynapseProcess]:
    """Configure and start every homeserver of ``group`` and wait until all answer; if one fails,
    those already started are stopped before the error is raised."""
    processes = []
    try:
        for settings in group:
            write_homeserver_config(settings)
            process = SynapseProcess(python, settings)
            process.generate_keys()
            say(
                f"starting Synapse {settings.server_name} on {settings.url} "
                f"(log: {settings.log_file})"
            )
            process.start()
            processes.append(process)
        # They all start at once; waiting for one after the other costs no time.
        for process in processes:
            await process.wait_ready()
    except BaseException:
        await asyncio.gather(*(p.stop_async() for p in processes))
        raise
    return processes

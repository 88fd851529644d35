"""`rethink-mn up`: the whole local stack in one command.

Creates a configuration on first use, installs and starts a loopback-only Synapse with our
registration, applies migrations, runs the node, and on Ctrl-C / SIGTERM stops the node and then
Synapse, leaving no process behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..config import NodeConfig, load_config
from ..configfile import generate_registration, write_registration
from ..heap import freeze_start_up_objects
from ..node import Node
from ..private_files import describe, private_dir, tighten_all, tighten_tree
from ..storage import migrate
from ..storage.database import sqlite_files
from .federation import federating, start_homeservers
from .homeserver_database import ensure_homeserver_database, without_password
from .synapse import (
    LocalStackError,
    SynapseProcess,
    SynapseSettings,
    ensure_synapse_installed,
    free_port,
    write_homeserver_config,
)
from .workers import WorkerLayout

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Two-domain mode: each domain's state (registration, Synapse data, node database) in its own
# directory under the state directory, and the local federation CA beside them.
DOMAIN_DIRS = ("domain-a", "domain-b")
TLS_DIR = "federation-tls"
# Worker mode: its own configuration, node database and Synapse data under this directory (its
# rooms live in another homeserver database than the single process's).
WORKERS_DIR = "workers"
DEFAULT_PERSISTERS = 2


@dataclass(frozen=True)
class WorkerOptions:
    """`up --workers`: Synapse on this PostgreSQL database (created on first use) and Redis."""

    database_url: str = "postgresql://postgres@127.0.0.1:5432/rethink_mn_synapse"
    redis_host: str = "127.0.0.1"
    redis_port: int = 6379


def make_state_private(state_dir: Path, say: Callable[[str], None], *files: Path) -> None:
    """The state directory (created when missing) and everything in it, and ``files`` (the
    configuration, with its tokens), owner-only: directories 0700, files 0600 at most.

    What this stack writes is created so; this fixes an install from before that, or a file
    someone else put there, and says what it changed."""
    changed, problems = tighten_tree(state_dir)
    _report(changed, problems, say)
    make_files_private(say, *files)


def make_files_private(say: Callable[[str], None], *files: Path) -> None:
    """``files`` owner-only where they exist, saying what changed."""
    _report(*tighten_all(files), say)


def _report(changed: list[Path], problems: list[str], say: Callable[[str], None]) -> None:
    if changed:
        say(
            f"made {len(changed)} path(s) that other users could read owner-only: "
            f"{describe(changed)}"
        )
    for problem in problems:
        say(f"warning: could not make this owner-only: {problem}")


def ensure_config(
    config_path: Path,
    state_dir: Path,
    say: Callable[[str], None],
    settings: dict[str, Any] | None = None,
) -> NodeConfig:
    """The configuration at ``config_path``, created with fresh tokens (and ``settings``) on
    first use; its registration written beside the state."""
    registration = state_dir / "registration.yaml"
    if not config_path.exists():
        say(f"creating {config_path} with fresh tokens")
        config, _ = generate_registration(
            config_path,
            registration,
            {
                "database.url": f"sqlite:///{(state_dir / 'rethink-mn.db').as_posix()}",
                "dashboard.state_dir": (state_dir / "dashboard").as_posix(),
                # A development node: reTHINK's own stubs and tools connect NoMatrix-style
                # (v2 without hello) and must work; a production config chooses `refuse`.
                "stub.tokenless_sessions": "allow",
                **(settings or {}),
            },
        )
        return config
    config = load_config(config_path)
    write_registration(config, registration)
    return config


def homeserver_settings(config: NodeConfig, state_dir: Path) -> SynapseSettings:
    url = urlsplit(config.homeserver.url)
    if url.hostname not in LOOPBACK:
        raise LocalStackError(
            f"homeserver.url is {config.homeserver.url}: `up` runs a local homeserver on loopback. "
            "To use an existing homeserver, register the appservice with it and use `run`."
        )
    return SynapseSettings(
        data_dir=state_dir / "synapse",
        server_name=config.homeserver.server_name,
        host="127.0.0.1",
        port=url.port or 8008,
        registration_file=state_dir / "registration.yaml",
    )


def two_domain_settings(
    configs: tuple[NodeConfig, NodeConfig], state_dir: Path
) -> tuple[SynapseSettings, SynapseSettings]:
    """The two homeservers of a two-domain stack, federating with each other only.

    Each domain's `homeserver.server_name` must be its federation address, `127.0.0.1:<port>`
    (distinct from the client port of `homeserver.url`); its registration is expected at
    `<state_dir>/domain-a|b/registration.yaml`, where `ensure_config(…, <that dir>, …)` writes it.
    """
    plain = [
        homeserver_settings(config, state_dir / name)
        for config, name in zip(configs, DOMAIN_DIRS, strict=True)
    ]
    a, b = federating(plain, state_dir / TLS_DIR)
    return a, b


async def start_two_homeservers(
    state_dir: Path, configs: tuple[NodeConfig, NodeConfig], say: Callable[[str], None]
) -> tuple[SynapseProcess, SynapseProcess]:
    """Install Synapse if needed, then configure and start both domains' homeservers and wait
    until both answer. The caller stops them (`stop_async`) when done; their settings are on
    the processes (`.settings`)."""
    settings = two_domain_settings(configs, state_dir)
    python = await asyncio.to_thread(ensure_synapse_installed, None, say)
    a, b = await start_homeservers(python, settings, say)
    for process in (a, b):
        say(f"Synapse {process.settings.server_name} is up (pid {process.pid})")
    return a, b


def _check_redis(options: WorkerOptions) -> None:
    try:
        socket.create_connection((options.redis_host, options.redis_port), timeout=3).close()
    except OSError as exc:
        raise LocalStackError(
            f"Synapse's workers talk over Redis, and none answers at {options.redis_host}:"
            f"{options.redis_port} ({exc}): start one or give --redis HOST:PORT"
        ) from exc


async def with_workers(
    settings: SynapseSettings, config: NodeConfig, options: WorkerOptions
) -> SynapseSettings:
    """``settings`` in worker mode: as many event persisters as the node's configuration says
    (`homeserver.event_persisters`), the appservice push on a worker, PostgreSQL and Redis."""
    await asyncio.to_thread(_check_redis, options)
    database = await ensure_homeserver_database(options.database_url)
    layout = WorkerLayout.plan(
        config.homeserver.event_persisters,
        free_port,
        redis_host=options.redis_host,
        redis_port=options.redis_port,
    )
    return dataclasses.replace(settings, database_url=database, workers=layout)


def say_workers_up(
    synapse: SynapseProcess,
    settings: SynapseSettings,
    config: NodeConfig,
    say: Callable[[str], None],
) -> None:
    if settings.workers is None:
        return
    pids = ", ".join(f"{name} pid {pid}" for name, pid in synapse.worker_pids.items())
    say(
        f"Synapse workers are up ({pids}) on {without_password(settings.database_url or '')}; "
        f"each node process writes {config.routing.lanes} lane(s) over "
        f"{config.homeserver.event_persisters} event persister(s)"
    )


async def prepared_synapse(settings: SynapseSettings, say: Callable[[str], None]) -> SynapseProcess:
    """Synapse installed (once), configured and keyed for ``settings``; not started."""
    python = await asyncio.to_thread(ensure_synapse_installed, None, say)
    write_homeserver_config(settings)
    synapse = SynapseProcess(python, settings)
    synapse.generate_keys()
    return synapse


def stop_on_signals() -> asyncio.Event:
    """Set on SIGINT or SIGTERM (the caller removes the handlers when done)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def forget_signals() -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


async def up(
    config_path: Path,
    state_dir: Path,
    say: Callable[[str], None],
    workers: WorkerOptions | None = None,
) -> int:
    """The local stack; with ``workers``, Synapse in worker mode, its configuration and state
    under `<state_dir>/workers/` (``config_path`` is then `<state_dir>/workers/config.yaml`)."""
    extra: dict[str, Any] = {}
    if workers is not None:
        state_dir = state_dir / WORKERS_DIR
        config_path = state_dir / "config.yaml"
        extra = {
            "homeserver.event_persisters": DEFAULT_PERSISTERS,
            "routing.lanes": DEFAULT_PERSISTERS,
        }
    await asyncio.to_thread(make_state_private, state_dir, say, config_path)
    config = ensure_config(config_path, state_dir, say, extra)
    # A database configured outside the state directory holds the same secret.
    await asyncio.to_thread(make_files_private, say, *sqlite_files(config.database.url))
    settings = homeserver_settings(config, state_dir)
    if workers is not None:
        settings = await with_workers(settings, config, workers)

    synapse = await prepared_synapse(settings, say)
    stop = stop_on_signals()

    node: Node | None = None
    try:
        say(f"starting Synapse on {settings.url} (log: {settings.log_file})")
        synapse.start()
        await synapse.wait_ready()
        say(f"Synapse is up (pid {synapse.pid})")
        say_workers_up(synapse, settings, config, say)
        say("applying database migrations")
        await migrate.upgrade(config.database.url)
        node = Node(config)
        await node.start()
        freeze_start_up_objects()
        say(
            "ready:\n"
            f"  runtimes connect to  ws://{config.stub.listen.host}:{node.stub_port}/stub/connect\n"
            f"  health               http://{config.appservice.listen.host}:"
            f"{node.appservice_port}/health\n"
            f"  metrics              http://{config.appservice.listen.host}:"
            f"{node.appservice_port}/metrics\n"
            f"  homeserver           {settings.url}  (server name {settings.server_name})\n"
            "press Ctrl-C to stop"
        )
        exit_code = await _wait_for_stop_or_crash(stop, synapse)
    finally:
        forget_signals()
        if node is not None:
            await node.stop()
        say("stopping Synapse")
        await synapse.stop_async()
    return exit_code


async def _wait_for_stop_or_crash(stop: asyncio.Event, *synapses: SynapseProcess) -> int:
    while not stop.is_set():
        for synapse in synapses:
            code = synapse.exit_code()
            if code is not None:
                raise LocalStackError(
                    f"Synapse exited unexpectedly (code {code}); last log lines:\n"
                    f"{synapse.log_tail()}"
                )
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            continue
    return 0


@dataclass(frozen=True)
class LocalDomain:
    """One domain of the two-domain stack: its name and where its parts listen."""

    domain: str
    client_port: int  # Synapse's client API
    federation_port: int  # Synapse's federation listener; its server name is 127.0.0.1:<this>
    appservice_port: int
    stub_port: int


LOCAL_DOMAINS = (
    LocalDomain("a.localhost", 8008, 8448, 8009, 9090),
    LocalDomain("b.localhost", 8018, 8449, 8019, 9091),
)


def two_domain_config(
    state_dir: Path,
    index: int,
    say: Callable[[str], None],
    domains: tuple[LocalDomain, LocalDomain] = LOCAL_DOMAINS,
) -> NodeConfig:
    """The configuration of one domain of the two-domain stack, created on first use (kept
    under its own directory, so editing it changes that domain)."""
    here, peer = domains[index], domains[1 - index]
    directory = state_dir / DOMAIN_DIRS[index]
    private_dir(directory)
    path = directory / "config.yaml"
    if path.exists():
        config = load_config(path)
        write_registration(config, directory / "registration.yaml")
        return config
    say(f"creating {path} for {here.domain} with fresh tokens")
    config, _ = generate_registration(
        path,
        directory / "registration.yaml",
        {
            "domain": here.domain,
            "homeserver.url": f"http://127.0.0.1:{here.client_port}",
            "homeserver.server_name": f"127.0.0.1:{here.federation_port}",
            "appservice.listen.port": here.appservice_port,
            "appservice.public_url": f"http://127.0.0.1:{here.appservice_port}",
            "stub.listen.port": here.stub_port,
            "stub.tokenless_sessions": "allow",
            "database.url": f"sqlite:///{(directory / 'rethink-mn.db').as_posix()}",
            "dashboard.state_dir": (directory / "dashboard").as_posix(),
            "federation.peers": {peer.domain: {"server_name": f"127.0.0.1:{peer.federation_port}"}},
        },
    )
    return config


async def up_two_domains(state_dir: Path, say: Callable[[str], None]) -> int:
    """Two reTHINK domains on this machine: two Synapses federating over loopback (a local CA
    signs their certificates) and a node for each."""
    await asyncio.to_thread(make_state_private, state_dir, say)
    configs = (two_domain_config(state_dir, 0, say), two_domain_config(state_dir, 1, say))
    stop = stop_on_signals()
    synapses: tuple[SynapseProcess, ...] = ()
    nodes: list[Node] = []
    try:
        synapses = await start_two_homeservers(state_dir, configs, say)
        for config in configs:
            await migrate.upgrade(config.database.url)
            node = Node(config)
            await node.start()
            nodes.append(node)
        freeze_start_up_objects()
        a, b = nodes
        demo = (
            f"http://127.0.0.1:{a.stub_port}/demo?peer="
            f"ws://127.0.0.1:{b.stub_port}/stub/connect&peerDomain={configs[1].domain}"
        )
        lines = [
            f"  {config.domain}: runtimes connect to ws://127.0.0.1:{node.stub_port}/stub/connect"
            f" (homeserver {config.homeserver.server_name})"
            for config, node in zip(configs, nodes, strict=True)
        ]
        say(
            "ready, two domains:\n" + "\n".join(lines) + f"\n  demo across domains: {demo}\n"
            "press Ctrl-C to stop"
        )
        exit_code = await _wait_for_stop_or_crash(stop, *synapses)
    finally:
        forget_signals()
        for node in nodes:
            await node.stop()
        if synapses:
            say("stopping Synapse")
        for synapse in synapses:
            await synapse.stop_async()
    return exit_code

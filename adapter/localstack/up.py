"""`rethink-mn up`: the whole local stack in one command.

Creates a configuration on first use, installs and starts a loopback-only Synapse with our
registration, applies migrations, runs the node, and on Ctrl-C / SIGTERM stops the node and then
Synapse, leaving no process behind.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from ..config import NodeConfig, load_config
from ..configfile import generate_registration, write_registration
from ..node import Node
from ..storage import migrate
from .synapse import (
    LocalStackError,
    SynapseProcess,
    SynapseSettings,
    ensure_synapse_installed,
    write_homeserver_config,
)

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def ensure_config(config_path: Path, state_dir: Path, say: Callable[[str], None]) -> NodeConfig:
    registration = state_dir / "registration.yaml"
    if not config_path.exists():
        say(f"creating {config_path} with fresh tokens")
        config, _ = generate_registration(
            config_path,
            registration,
            {"database.url": f"sqlite:///{(state_dir / 'rethink-mn.db').as_posix()}"},
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


async def up(config_path: Path, state_dir: Path, say: Callable[[str], None]) -> int:
    await asyncio.to_thread(state_dir.mkdir, parents=True, exist_ok=True)
    config = ensure_config(config_path, state_dir, say)
    settings = homeserver_settings(config, state_dir)

    python = await asyncio.to_thread(ensure_synapse_installed, None, say)
    write_homeserver_config(settings)
    synapse = SynapseProcess(python, settings)
    await asyncio.to_thread(synapse.generate_keys)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    node: Node | None = None
    try:
        say(f"starting Synapse on {settings.url} (log: {settings.log_file})")
        synapse.start()
        await synapse.wait_ready()
        say(f"Synapse is up (pid {synapse.pid})")
        say("applying database migrations")
        await migrate.upgrade(config.database.url)
        node = Node(config)
        await node.start()
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
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if node is not None:
            await node.stop()
        say("stopping Synapse")
        await synapse.stop_async()
    return exit_code


async def _wait_for_stop_or_crash(stop: asyncio.Event, synapse: SynapseProcess) -> int:
    while not stop.is_set():
        code = synapse.exit_code()
        if code is not None:
            raise LocalStackError(
                f"Synapse exited unexpectedly (code {code}); last log lines:\n{synapse.log_tail()}"
            )
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            continue
    return 0

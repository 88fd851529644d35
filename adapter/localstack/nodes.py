"""`rethink-mn up --nodes N`: one domain on N node processes on this machine.

Each process is `rethink-mn run --process pK` on one configuration (under
`<state-dir>/nodes/`), with the node database on the local PostgreSQL. They share the stub and
appservice ports (SO_REUSEPORT: the kernel spreads the connections), read each other's lanes
and take over each other's sessions (adapter/cluster/). A process that exits unexpectedly is
started again; Ctrl-C or SIGTERM stops them all, then Synapse. With `--workers`, Synapse runs
in worker mode as under `up --workers`, and everything lives under `<state-dir>/nodes-workers/`
with databases of its own (its rooms are another homeserver's).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..storage import migrate
from .homeserver_database import ensure_homeserver_database, without_password
from .synapse import (
    LocalStackError,
)
from .up import (
    DEFAULT_PERSISTERS,
    WorkerOptions,
    ensure_config,
    forget_signals,
    homeserver_settings,
    make_state_private,
    prepared_synapse,
    say_workers_up,
    stop_on_signals,
    with_workers,
)

NODES_DIR = "nodes"
NODES_WORKERS_DIR = "nodes-workers"
NODES_DATABASE = "postgresql://postgres@127.0.0.1:5432/rethink_mn_nodes"
# With --workers: the node database and Synapse's, apart from those of `up --nodes` and
# `up --workers` (each pair belongs to one homeserver's rooms and keys).
NODES_WORKERS_DATABASE = "postgresql://postgres@127.0.0.1:5432/rethink_mn_nodes_workers"
NODES_WORKERS_HOMESERVER_DATABASE = "postgresql://postgres@127.0.0.1:5432/rethink_mn_synapse_nodes"
# How long a process gets to start, and to stop cleanly before it is killed.
START_SECONDS = 120.0
STOP_SECONDS = 30.0
# Before a process that exited is started again (the others hold its runtimes meanwhile).
RESTART_DELAY = 1.0
STARTED = "node started"


@dataclass(frozen=True)
class NodesOptions:
    count: int
    database_url: str = NODES_DATABASE


class NodeProcess:
    """One node process of the domain, its output prefixed with its name."""

    def __init__(self, name: str, config_path: Path, say: Callable[[str], None]) -> None:
        self.name = name
        self._config_path = config_path
        self._say = say
        self.process: asyncio.subprocess.Process | None = None
        self.started = asyncio.Event()
        self._relay: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def start(self) -> None:
        self.started.clear()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "adapter.cli",
            "--config",
            str(self._config_path),
            "run",
            "--process",
            self.name,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._relay = asyncio.create_task(self._relay_output(self.process), name=f"{self.name}-out")

    async def _relay_output(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            if STARTED in line:
                self.started.set()
            print(f"[{self.name}] {line}", flush=True)

    async def stop(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_SECONDS)
        except TimeoutError:
            self._say(f"node process {self.name} did not stop in {STOP_SECONDS:.0f} s; killing it")
            process.kill()
            await process.wait()
        if self._relay is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._relay


class NodeProcesses:
    def __init__(self, config_path: Path, count: int, say: Callable[[str], None]) -> None:
        self.members = [NodeProcess(f"p{i}", config_path, say) for i in range(1, count + 1)]
        self._say = say

    async def start(self) -> None:
        for member in self.members:
            await member.start()
        try:
            async with asyncio.timeout(START_SECONDS):
                for member in self.members:
                    await _started_or_exited(member)
        except TimeoutError:
            raise LocalStackError(
                f"the node processes did not start within {START_SECONDS:.0f} s"
            ) from None

    async def watch(self) -> None:
        """Start again, after a moment, a process that exited (killed, or struck off by the
        others for being silent too long)."""
        while True:
            await asyncio.sleep(0.5)
            for member in self.members:
                process = member.process
                if process is not None and process.returncode is not None:
                    self._say(
                        f"node process {member.name} exited (status {process.returncode}); "
                        f"starting it again in {RESTART_DELAY:.0f} s"
                    )
                    member.process = None
                    await asyncio.sleep(RESTART_DELAY)
                    await member.start()

    async def stop(self) -> None:
        await asyncio.gather(*(member.stop() for member in self.members))


async def _started_or_exited(member: NodeProcess) -> None:
    assert member.process is not None
    started = asyncio.ensure_future(member.started.wait())
    exited = asyncio.ensure_future(member.process.wait())
    await asyncio.wait({started, exited}, return_when=asyncio.FIRST_COMPLETED)
    started.cancel()
    exited.cancel()
    if not member.started.is_set():
        raise LocalStackError(
            f"node process {member.name} exited while starting (status "
            f"{member.process.returncode}); its output is above"
        )


async def up_nodes(
    state_dir: Path,
    say: Callable[[str], None],
    options: NodesOptions,
    workers: WorkerOptions | None = None,
) -> int:
    state_dir = state_dir / (NODES_DIR if workers is None else NODES_WORKERS_DIR)
    config_path = state_dir / "config.yaml"
    await asyncio.to_thread(make_state_private, state_dir, say, config_path)
    database = await ensure_homeserver_database(options.database_url, whose="the nodes'")
    # One dashboard worker (a Spark job) per process would be N of them: off here.
    extra: dict[str, object] = {"database.url": database, "dashboard.enabled": False}
    if workers is not None:
        extra |= {
            "homeserver.event_persisters": DEFAULT_PERSISTERS,
            "routing.lanes": DEFAULT_PERSISTERS,
        }
    config = ensure_config(config_path, state_dir, say, extra)
    if not config.database.url.startswith(("postgresql", "postgres")):
        raise LocalStackError(
            f"{config_path}: database.url must be PostgreSQL for --nodes (the processes share it)"
        )
    settings = homeserver_settings(config, state_dir)
    if workers is not None:
        settings = await with_workers(settings, config, workers)
    synapse = await prepared_synapse(settings, say)
    stop = stop_on_signals()
    nodes = NodeProcesses(config_path, options.count, say)
    watcher: asyncio.Task[None] | None = None
    try:
        say(f"starting Synapse on {settings.url} (log: {settings.log_file})")
        synapse.start()
        await synapse.wait_ready()
        say(f"Synapse is up (pid {synapse.pid})")
        say_workers_up(synapse, settings, config, say)
        say(f"applying database migrations to {without_password(config.database.url)}")
        await migrate.upgrade(config.database.url)
        await nodes.start()
        watcher = asyncio.create_task(nodes.watch(), name="node-processes")
        pids = ", ".join(f"{m.name} pid {m.pid}" for m in nodes.members)
        say(
            f"ready, {options.count} node processes ({pids}):\n"
            f"  runtimes connect to  ws://{config.stub.listen.host}:{config.stub.listen.port}"
            "/stub/connect\n"
            f"  health               http://{config.appservice.listen.host}:"
            f"{config.appservice.listen.port}/health  (answered by any of them)\n"
            f"  homeserver           {settings.url}  (server name {settings.server_name})\n"
            "press Ctrl-C to stop"
        )
        while not stop.is_set():
            code = synapse.exit_code()
            if code is not None:
                raise LocalStackError(
                    f"Synapse exited unexpectedly (code {code}); last log lines:\n"
                    f"{synapse.log_tail()}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    finally:
        forget_signals()
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        say("stopping the node processes")
        await nodes.stop()
        say("stopping Synapse")
        await synapse.stop_async()
    return 0

"""The fault-injection suite: zero loss, zero duplicates, order kept, under every fault?

    .venv/bin/python -m bench.faults                       # every scenario, SQLite (~9 min)
    .venv/bin/python -m bench.faults --database postgresql
    .venv/bin/python -m bench.faults --quick               # every scenario, smaller (what CI runs)
    .venv/bin/python -m bench.faults --scenario node-sigkill,monkey --seed 7
    .venv/bin/python -m bench.faults --stub plain          # what a third-party stub's runtime gets

Every scenario runs on a fresh stack of real processes: Synapse (its own data dir), the node
(``rethink-mn run``, generated config, fresh database), and a TCP proxy (in this process) in
front of the node's stub port. Runtimes are Node.js processes (bench/fault_runtime.mjs) using the
bundled stub (stub_js/src/index.js) through the proxy. Senders stream numbered messages while a
fault is injected; receivers report every arrival; after a full drain the checker
(bench/fault_check.py) counts what was lost, duplicated, reordered or unexpected.

Scenarios: none; network (every stub connection cut twice, new ones refused for a while);
network-blackhole (the same, but for a moment before each cut the proxy forwards nothing and
closes nothing, as when a link dies and neither end has noticed yet); node-sigterm,
node-sigkill, synapse-sigterm, synapse-sigkill (the process signalled, then restarted at once);
database-outage (PostgreSQL: every connection of the node's database ended by the server, as in a
restart, and new ones refused for 5 s; SQLite: another process holding the write lock for 10 s,
twice the node's busy timeout; every 25th message comes from a fresh address, whose learned
route the node writes to its database); synapse-errors (a proxy in front of Synapse's client
API answers every request of the node with 500 for 10 s, then with 429 for 10 s); monkey (the
node or Synapse, SIGKILL or SIGTERM at random, after every 5-10 s of uptime for a minute, while
4 senders, 4 receivers, a reporter and 3 observers exchange 42,000 messages).

Across domains (a second domain, its own Synapse and node, federating with the first; the
receiver is that domain's runtime, so every message travels sender → node A → A's homeserver →
federation → B's homeserver → node B → receiver): peer-synapse-sigkill (B's homeserver killed,
kept down for a minute, restarted); peer-node-sigkill (B's node killed, restarted at once);
peer-link-blackhole (the link between the two homeservers drops everything for 30 s: each
homeserver's federation listener sits behind a proxy that stalls, in both directions).

With --homeserver-workers P (Synapse in worker mode, as `rethink-mn up --workers`): a Synapse
fault signals the main process and every worker; persister-sigkill kills the first event
persister alone and starts it again (the node then has one lane, whose room is on it).

With --database postgresql, the domain also runs on two node processes (p1, p2, as `rethink-mn
up --nodes 2`; three senders and three receivers, spread over both by the kernel):
node-process-sigkill (the process holding the most runtimes killed, kept down until the other
has taken its sessions over, then started again); node-process-moves (every stub connection cut
twice, as network: each stub comes back to whichever process it reaches, and its session moves
there); node-process-moves-3 (the same on three processes, where a sender's receiver may be
held by neither the process it left nor the one it reached); federation-process-sigkill (across
domains: the receivers are the second domain's, and p1, the federation process, which sends on
to the peer what both processes' lanes carry for it, is killed, kept down until p2 has taken its
sessions over, then started again); node-process-added (the domain runs on p1 alone until p2, a
process new to it, starts mid-stream; then every stub connection is cut once, and the stubs
connect again to whichever process the kernel picks: p2 takes its first runtimes under load).

"Acknowledged": the prefix of a stub's messages its ``instance.stats.acknowledged`` covers, once
the stub has acknowledgements; until then every message handed to the stub (said in the output).
Either way less the messages the node answered with an error (a definite failure).

Every attempted message counts: it must arrive once, in order, where it was sent, or be refused
(answered with an error code its sender saw) in a scenario that expects that refusal
(EXPECTED_REFUSALS: only a plain stub's, during a fault of the database or the homeserver); any
other refusal fails the scenario. Latency percentiles are taken over every expected delivery,
with what never arrived as infinitely late ("never").

Prints a table, writes bench/results/faults-*.json. Exit 0 when every scenario is clean (nothing
lost, duplicated, reordered, unexpected, unaccounted for or refused unexpectedly, every planned
message attempted, a full drain, every fault recovered from within --recovery-limit seconds), 1
otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import uvloop
from rich.console import Console
from rich.table import Table
from ruamel.yaml import YAML

from adapter.localstack.federation import server_name_for
from adapter.localstack.synapse import ensure_synapse_installed, free_port
from adapter.private_files import dump_private_yaml
from bench.fault_check import (
    FAILURES,
    Arrival,
    Attempt,
    Window,
    check,
    latencies,
    longest_gap,
    percentile,
    recovery_times,
)
from bench.fault_stack import (
    DOMAIN,
    Database,
    Homeserver,
    HomeserverProxy,
    NodeProcess,
    Proxy,
    SynapseWorker,
    Tokens,
    federated_pair,
    postgres_reachable,
    write_node_config,
)
from bench.provenance import Source, write_results

ROOT = Path(__file__).resolve().parents[1]

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)

SCENARIOS = (
    "none",
    "network",
    "network-blackhole",
    "node-sigterm",
    "node-sigkill",
    "synapse-sigterm",
    "synapse-sigkill",
    "database-outage",
    "synapse-errors",
    "monkey",
    "peer-synapse-sigkill",
    "peer-node-sigkill",
    "peer-link-blackhole",
    "persister-sigkill",
    "node-process-sigkill",
    "node-process-moves",
    "node-process-moves-3",
    "federation-process-sigkill",
    "node-process-added",
)
# Scenarios for a homeserver in worker mode only (--homeserver-workers).
WORKER_SCENARIOS = frozenset({"persister-sigkill"})
# Scenarios for a domain on two node processes, which share a PostgreSQL database.
CLUSTER_SCENARIOS = frozenset(
    {
        "node-process-sigkill",
        "node-process-moves",
        "node-process-moves-3",
        "federation-process-sigkill",
        "node-process-added",
    }
)
# Scenarios across domains: a second domain, whose runtimes are the receivers.
ACROSS_SCENARIOS = frozenset(
    {
        "peer-synapse-sigkill",
        "peer-node-sigkill",
        "peer-link-blackhole",
        "federation-process-sigkill",
    }
)
# The two processes' heartbeat, and how long one is silent before the other takes it for gone.
CLUSTER = {"heartbeat_seconds": 0.5, "gone_after_seconds": 2.0}
# node-process-added: when the new process starts, as a fraction of the stream.
ADD_PROCESS_AT = 0.1
RUNTIME_SCRIPT = ROOT / "bench" / "fault_runtime.mjs"
PEER_DOMAIN = "peer.faults.local"


@dataclass(frozen=True)
class Plan:
    count: int  # single-fault scenarios: messages from A to B
    rate: float  # messages/s
    fault_at: float  # fraction of the stream after which the fault is injected
    refuse_s: float  # network drop: how long new connections are refused after a cut
    blackhole_s: float  # network-blackhole: how long nothing is forwarded before the cut
    monkey_s: float  # how long the monkey keeps killing
    monkey_interval: tuple[float, float]  # uptime between two kills, seconds
    monkey_senders: int
    monkey_receivers: int
    monkey_observers: int
    monkey_count: int  # per sender, and for the reporter
    monkey_rate: float  # per sender, and for the reporter
    sqlite_lock_s: float  # database-outage on SQLite: how long another process holds the lock
    postgres_down_s: float  # database-outage on PostgreSQL: how long new connections are refused
    synapse_errors_s: float  # synapse-errors: half of it 500, then half 429
    quiet_s: float  # drained = nothing new arrived (or was acknowledged) for this long
    drain_cap_s: float
    peer_down_s: float = 60.0  # peer-synapse-sigkill: how long B's homeserver stays down
    link_stall_s: float = 30.0  # peer-link-blackhole: how long the link drops everything
    # node-process-sigkill: how long the killed process stays down (the other takes its
    # sessions over after CLUSTER's gone_after_seconds and a heartbeat)
    process_down_s: float = 4.0


FULL = Plan(3000, 500, 1 / 3, 1.0, 0.5, 60, (5, 10), 4, 4, 3, 6000, 100, 10, 5, 20, 8, 180)
# The outages stay longer than what they must defeat (SQLite's 5 s busy timeout, the homeserver
# client's first retries; for the peer's homeserver and the link, the federation sender's).
QUICK = Plan(600, 200, 1 / 3, 0.5, 0.3, 20, (5, 8), 3, 3, 2, 800, 50, 6, 3, 8, 5, 60, 15.0, 10.0)


# -- runtimes ----------------------------------------------------------------------------------


class Collector:
    """Every arrival at every runtime, in the order each runtime saw them."""

    def __init__(self) -> None:
        self.arrivals: list[Arrival] = []
        self.other: list[dict[str, Any]] = []


class Runtime:
    """One fault_runtime.mjs process."""

    def __init__(
        self, name: str, role: str, spec: dict[str, Any], collector: Collector, work: Path
    ) -> None:
        self.name = name
        self.role = role
        self.spec = {**spec, "name": name, "role": role}
        self.collector = collector
        self.work = work
        self.proc: asyncio.subprocess.Process | None = None
        self.address = ""
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.sent: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.final: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.stats: dict[str, Any] | None = None
        self.statuses: list[tuple[float, str, str | None]] = []
        self.last_status: str | None = None
        self.progress: list[tuple[float, int]] = []  # (t, messages handed to the stub so far)
        self._reader: asyncio.Task[None] | None = None
        self._stderr = (work / f"runtime-{name}.stderr").open("wb")

    async def start(self, timeout: float = 90) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            "node",
            str(RUNTIME_SCRIPT),
            json.dumps(self.spec),
            cwd=ROOT / "bench",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
            limit=4 * 1024 * 1024,
        )
        self._reader = asyncio.create_task(self._read())
        self.address = await asyncio.wait_for(self.ready, timeout)
        return self.address

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        name = self.name
        arrivals = self.collector.arrivals
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except ValueError:
                self.collector.other.append({"runtime": name, "line": line[:500]})
                continue
            if isinstance(value, list):  # ["r", sender, seq, t, toOk, sentT]
                _, sender, seq, t, to_ok, sent_t = value
                arrivals.append(
                    Arrival(
                        name,
                        sender,
                        seq,
                        t / 1000,
                        bool(to_ok),
                        None if sent_t is None else sent_t / 1000,
                    )
                )
                continue
            event = value.get("ev")
            if event == "ready":
                self.ready.set_result(value["address"])
            elif event == "status":
                self.statuses.append((value["t"] / 1000, value["value"], value.get("desc")))
                self.last_status = value["value"]
            elif event == "stats":
                self.stats = value
            elif event == "progress":
                self.progress.append((value["t"] / 1000, value["n"]))
            elif event == "sent":
                self.progress.append((value["t"] / 1000, value["count"]))
                self.sent.set_result(value)
            elif event == "final":
                self.final.set_result(value)
            elif event == "error":
                error = RuntimeError(f"runtime {name}: {value['error']}")
                for fut in (self.ready, self.sent, self.final):
                    if not fut.done():
                        fut.set_exception(error)
            else:
                self.collector.other.append({"runtime": name, **value})
        # The process ended: whoever still waits learns it.
        error = RuntimeError(f"runtime {name} exited; stderr:\n{self.stderr_tail()}")
        for fut in (self.ready, self.sent, self.final):
            if not fut.done():
                fut.set_exception(error)

    async def command(self, **command: Any) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())
        await self.proc.stdin.drain()

    async def finish(self, timeout: float = 30) -> dict[str, Any]:
        await self.command(cmd="final")
        return await asyncio.wait_for(self.final, timeout)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        for fut in (self.ready, self.sent, self.final):
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" warnings
        self._stderr.close()

    def stderr_tail(self, lines: int = 15) -> str:
        self._stderr.flush()
        path = self.work / f"runtime-{self.name}.stderr"
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])

    def acknowledged_total(self) -> int:
        value = (self.stats or {}).get("acknowledged")
        return value if isinstance(value, int) else 0


# -- one scenario ------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str  # network-drop, network-blackhole, node, synapse, database, synapse-errors
    signal: str | None
    start: float
    end: float = 0.0  # the process answering again / the proxy accepting again
    exited: float | None = None
    restarted: float | None = None  # the new process launched
    exit_code: int | None = None
    forced_kill: bool = False  # SIGTERM did not stop it within 30 s: SIGKILL followed
    cut: int | None = None  # network drop: connections cut
    refused: int | None = None  # network drop: connection attempts refused meanwhile
    effective: bool = False  # evidence that the fault happened
    recovery_s: float | None = None
    # Expected deliveries of messages handed to stubs before the fault's end and not delivered
    # by then: with none, there is nothing to recover and no recovery time (not a failure).
    outstanding_at_end: int | None = None
    error: str | None = None
    detail: str | None = None  # database outage, homeserver errors: what happened

    def as_dict(self, t0: float) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("start", "end", "exited", "restarted"):
            if d[key] is not None:
                d[key] = round(d[key] - t0, 3)  # seconds since the stream started
        d["downtime_s"] = round(self.end - self.start, 3)
        return d


@dataclass
class PeerDomain:
    """The other domain of the scenarios across domains: the receivers are its runtimes."""

    homeserver: Homeserver
    node: NodeProcess
    proxy: Proxy  # in front of its node's stub listener
    database: Database
    tokens: Tokens
    # In front of each homeserver's federation listener (the first domain's, this one's): the
    # link between the two.
    links: tuple[Proxy, Proxy]

    @classmethod
    def create(
        cls, work: Path, synapse_python: Path, database: str, links: tuple[Proxy, Proxy]
    ) -> PeerDomain:
        work.mkdir()
        tokens = Tokens()
        as_port, stub_port = free_port(), free_port()
        homeserver = Homeserver(
            synapse_python, work, tokens, as_port, server_name_for(links[1].port)
        )
        node = NodeProcess(work / "node.yaml", work / "node.log", as_port, stub_port)
        return cls(homeserver, node, Proxy(stub_port), Database(database, work), tokens, links)

    async def prepare(self, peer_domain: str, peer_server_name: str) -> None:
        """Its database, its node's configuration, its homeserver started, its schema."""
        db_url = await self.database.create()
        write_node_config(
            self.node.config,
            self.homeserver.url,
            self.node.as_port,
            self.node.stub_port,
            db_url,
            self.tokens,
            PEER_DOMAIN,
            self.homeserver.settings.server_name,
            {peer_domain: peer_server_name},
        )
        await asyncio.gather(self.homeserver.start(), self.node.migrate())

    @property
    def stub_url(self) -> str:
        return f"ws://127.0.0.1:{self.proxy.port}/stub/connect"


@dataclass
class Stack:
    work: Path
    homeserver: Homeserver
    node: NodeProcess
    proxy: Proxy
    database: Database
    homeserver_proxy: HomeserverProxy | None = None  # only where Synapse is to answer errors
    peer: PeerDomain | None = None  # only for the scenarios across domains
    # The domain's other node processes (p2, p3; `node` is p1), for the scenarios of a cluster.
    siblings: list[NodeProcess] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    @property
    def stub_url(self) -> str:
        return f"ws://127.0.0.1:{self.proxy.port}/stub/connect"

    async def network_drop(self, refuse_s: float, blackhole_s: float = 0.0) -> Fault:
        fault = Fault("network-drop" if not blackhole_s else "network-blackhole", None, time.time())
        if blackhole_s:
            self.proxy.blackhole = True
            await asyncio.sleep(blackhole_s)
        self.proxy.refusing = True
        self.proxy.blackhole = False
        refused_before = self.proxy.refused
        fault.cut = self.proxy.cut()
        await asyncio.sleep(refuse_s)
        self.proxy.refusing = False
        fault.end = time.time()
        fault.refused = self.proxy.refused - refused_before
        fault.effective = fault.cut > 0
        self.faults.append(fault)
        return fault

    async def stall_link(self, seconds: float) -> Fault:
        """The link between the two domains' homeservers drops everything for ``seconds``."""
        assert self.peer is not None
        fault = Fault("link-blackhole", None, time.time())
        self.faults.append(fault)
        links = self.peer.links
        open_before = sum(link.open_connections for link in links)
        for link in links:
            link.stalled = True
        await asyncio.sleep(seconds)
        for link in links:
            link.stalled = False
        fault.end = time.time()
        fault.effective = open_before > 0
        fault.detail = f"{open_before} federation connections open as it began"
        return fault

    async def restart(self, target: str, sig: signal.Signals, down_s: float = 0.0) -> Fault:
        """Signal ``target`` (node, synapse, peer-node, peer-synapse), wait for it to exit,
        keep it down ``down_s`` seconds and start it again."""
        procs: dict[str, Homeserver | NodeProcess | SynapseWorker] = {
            "node": self.node,
            "synapse": self.homeserver,
        }
        if self.homeserver.workers:
            procs["persister1"] = SynapseWorker(self.homeserver, "persister1")
        if self.siblings:
            procs["node-process"] = await self._busiest_process()
            # p1: with a peer domain, the federation process (only its runtimes' stubs notice).
            procs["federation-process"] = self.node
        if self.peer is not None:
            procs |= {"peer-node": self.peer.node, "peer-synapse": self.peer.homeserver}
        proc = procs[target]
        fault = Fault(target, sig.name, time.time())
        self.faults.append(fault)
        proc.signal(sig)
        code = await proc.wait_exit(30)
        if code is None:
            fault.forced_kill = True
            proc.signal(signal.SIGKILL)
            code = await proc.wait_exit(10)
        fault.exited = time.time()
        fault.exit_code = code
        fault.effective = code is not None and (sig != signal.SIGKILL or code == -signal.SIGKILL)
        if code is None:
            raise RuntimeError(f"{target} did not exit after {sig.name} and SIGKILL")
        await asyncio.sleep(down_s)
        fault.restarted = time.time()
        if isinstance(proc, NodeProcess):
            proc.start()
            await proc.wait_answering(90)
        else:
            await proc.start()
        fault.end = time.time()
        return fault

    async def _busiest_process(self) -> NodeProcess:
        """Of the domain's node processes, the one holding the most runtimes (the kernel
        spreads connections as it likes), so that the fault meets as many as it can."""
        held = await self._held()
        console.print(f"  runtimes held: {held}")
        processes = [self.node, *self.siblings]
        return max(processes, key=lambda proc: held.get(proc.process or "", 0))

    async def _held(self) -> dict[str, int]:
        """How many runtime sessions each node process holds."""
        async with await psycopg.AsyncConnection.connect(self.database.url) as conn:
            found = await conn.execute(
                "SELECT holder, count(*) FROM runtime_sessions GROUP BY holder"
            )
            rows = await found.fetchall()
        return {str(holder): int(count) for holder, count in rows}

    async def _wait_held(self, name: str, timeout: float) -> dict[str, int]:
        """The sessions each process holds, once process ``name`` holds one (or after
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            held = await self._held()
            if held.get(name) or time.monotonic() > deadline:
                return held
            await asyncio.sleep(0.2)

    async def add_process(self, arrivals: list[Arrival]) -> Fault:
        """Start p2, a process new to the domain, while p1 carries the stream; once it has
        started, cut every stub connection (as many times as it takes, at most five, for the
        kernel to hand p2 at least one of the connections that come back). ``arrivals``: what
        the receivers got so far (the longest stretch without a delivery while p2 started is
        reported)."""
        added = self.siblings[0]
        fault = Fault("process-added", None, time.time())
        self.faults.append(fault)
        added.start()
        await added.wait_answering(90)
        answering = time.time()
        during = sorted(a.t for a in arrivals if fault.start <= a.t <= answering)
        edges = [fault.start, *during, answering]
        pause = max(b - a for a, b in itertools.pairwise(edges))
        name = added.process or ""
        fault.cut = 0
        held: dict[str, int] = {}
        for _ in range(5):
            fault.cut += self.proxy.cut()
            fault.end = time.time()
            held = await self._wait_held(name, 10)
            if held.get(name):
                break
        fault.effective = bool(held.get(name))
        fault.detail = (
            f"{added.process} answering {answering - fault.start:.2f}s after its start; the "
            f"longest stretch without a delivery meanwhile {pause * 1000:.0f} ms; runtimes "
            f"held after {fault.cut} connections were cut: {held}"
        )
        return fault

    async def database_outage(self, seconds: float) -> Fault:
        fault = Fault("database", None, time.time())
        self.faults.append(fault)
        fault.effective, fault.detail = await self.database.outage(seconds)
        fault.end = time.time()
        return fault

    async def synapse_errors(self, seconds: float) -> Fault:
        """Half of ``seconds`` 500 for every request of the node, then half 429."""
        assert self.homeserver_proxy is not None
        fault = Fault("synapse-errors", None, time.time())
        self.faults.append(fault)
        answered = {}
        try:
            for status in (500, 429):
                before = self.homeserver_proxy.failed
                self.homeserver_proxy.failing = status
                await asyncio.sleep(seconds / 2)
                answered[status] = self.homeserver_proxy.failed - before
        finally:
            self.homeserver_proxy.failing = None
        fault.end = time.time()
        fault.effective = all(answered.values())
        fault.detail = ", ".join(f"{n} requests answered {code}" for code, n in answered.items())
        return fault

    async def close(self) -> None:
        await self.proxy.close()
        await self.node.stop()
        for sibling in self.siblings:
            await sibling.stop()
        if self.peer is not None:
            await self.peer.proxy.close()
            await self.peer.node.stop()
        await self.homeserver.stop()
        if self.peer is not None:
            await self.peer.homeserver.stop()
            for link in self.peer.links:
                await link.close()
            await self.peer.database.drop()
        if self.homeserver_proxy is not None:
            await self.homeserver_proxy.close()
        await self.database.drop()
        await self.homeserver.drop_database()


async def start_stack(
    work: Path, synapse_python: Path, database: str, scenario: str, workers: int = 0
) -> Stack:
    """``workers``: this domain's Synapse in worker mode with that many event persisters."""
    tokens = Tokens()
    as_port, stub_port = free_port(), free_port()
    links: tuple[Proxy, Proxy] | None = None
    server_name: dict[str, str] = {}
    if scenario in ACROSS_SCENARIOS:
        links = (Proxy(free_port()), Proxy(free_port()))
        for link in links:
            await link.start()  # its address is the homeserver's server name
        server_name["server_name"] = server_name_for(links[0].port)
    homeserver = Homeserver(synapse_python, work, tokens, as_port, workers=workers, **server_name)
    db = Database(database, work, outages=scenario == "database-outage")
    proxy = Proxy(stub_port)
    cluster = scenario in CLUSTER_SCENARIOS
    processes = 3 if scenario == "node-process-moves-3" else 2
    node = NodeProcess(
        work / "node.yaml", work / "node.log", as_port, stub_port, "p1" if cluster else None
    )
    hs_proxy = HomeserverProxy(homeserver.url) if scenario == "synapse-errors" else None
    stack = Stack(work, homeserver, node, proxy, db, hs_proxy)
    # Across domains, the homeserver's push must reach the federation process (p1) alone: the
    # others listen for the appservice API on a port of their own, in a configuration of their
    # own.
    sibling_as_port = free_port() if cluster and links is not None else as_port
    sibling_config = work / ("node-siblings.yaml" if sibling_as_port != as_port else "node.yaml")
    if cluster:
        # The same stub port (SO_REUSEPORT): the proxy's connections reach any of the processes.
        stack.siblings = [
            NodeProcess(
                sibling_config, work / f"node-p{i}.log", sibling_as_port, stub_port, f"p{i}"
            )
            for i in range(2, processes + 1)
        ]
    try:
        peers: dict[str, str] = {}
        if links is not None:
            stack.peer = PeerDomain.create(work / "peer", synapse_python, database, links)
            federated_pair(homeserver, stack.peer.homeserver, *links, work / "tls")
            peers[PEER_DOMAIN] = stack.peer.homeserver.settings.server_name
        db_url = await db.create()
        await homeserver.prepare_database()
        hs_url = await hs_proxy.start() if hs_proxy is not None else homeserver.url
        cluster_settings = None
        if cluster:
            cluster_settings = {**CLUSTER, **({"federation_process": "p1"} if peers else {})}
        write_node_config(
            node.config,
            hs_url,
            as_port,
            stub_port,
            db_url,
            tokens,
            server_name=homeserver.settings.server_name,
            peers=peers,
            persisters=workers,
            # One lane, on the first persister: every message meets the persister fault.
            lanes=1 if scenario == "persister-sigkill" else None,
            cluster=cluster_settings,
        )
        if sibling_config != node.config:
            settings = YAML(typ="safe", pure=True).load(node.config.read_text())
            settings["appservice"]["listen"]["port"] = sibling_as_port
            dump_private_yaml(settings, sibling_config)
        starting = [homeserver.start(), node.migrate()]
        if stack.peer is not None:
            starting.append(stack.peer.prepare(DOMAIN, homeserver.settings.server_name))
        await asyncio.gather(*starting)
        nodes = [node] if stack.peer is None else [node, stack.peer.node]
        if scenario != "node-process-added":  # there p2 starts mid-stream
            nodes.extend(stack.siblings)
        for each in nodes:
            each.start()
        for each in nodes:
            await each.wait_answering(90)
            await each.wait_healthy(60)
        await proxy.start()
        if stack.peer is not None:
            await stack.peer.proxy.start()
    except BaseException:
        await stack.close()
        raise
    return stack


@dataclass
class Layout:
    """Who sends what to whom."""

    senders: dict[str, list[str]]  # sender -> receivers, round-robin by seq
    receivers: list[str]
    count: int
    rate: float
    reporter: str | None = None
    observers: list[str] = field(default_factory=list)
    reporter_count: int = 0
    reporter_rate: float = 0.0
    learn_every: int = 0  # every nth message of a sender from a fresh, unallocated address

    def destinations(self, sender: str, seq: int) -> tuple[str, ...]:
        if sender == self.reporter:
            return tuple(self.observers)
        targets = self.senders[sender]
        return (targets[(seq - 1) % len(targets)],)

    @property
    def messages(self) -> int:
        """How many numbered messages the runtimes are to hand their stubs."""
        return self.count * len(self.senders) + (self.reporter_count if self.reporter else 0)

    @property
    def stream_s(self) -> float:
        spans = [self.count / self.rate]
        if self.reporter:
            spans.append(self.reporter_count / self.reporter_rate)
        return max(spans)


@dataclass
class Run:
    """What a fault driver sees: the stack, when the stream started, how long it lasts, the
    runtimes."""

    stack: Stack
    t0: float
    stream_s: float
    runtimes: list[Runtime]
    collector: Collector

    async def recovered(self, since: float, timeout: float) -> bool:
        """Every stub live again and something delivered after ``since``."""
        deadline = time.monotonic() + timeout
        arrivals = self.collector.arrivals
        while time.monotonic() < deadline:
            if all(rt.last_status == "live" for rt in self.runtimes) and (
                arrivals and arrivals[-1].t > since
            ):
                return True
            await asyncio.sleep(0.02)
        return False


FaultDriver = Callable[[Run], Coroutine[Any, Any, None]]


async def run_scenario(
    name: str,
    database: str,
    plan: Plan,
    args: argparse.Namespace,
    synapse_python: Path,
    rng: random.Random,
) -> dict[str, Any]:
    layout, driver = scenario_setup(name, plan, args, rng)
    work = Path(tempfile.mkdtemp(prefix=f"rethink-faults-{name}-{database}-", dir=args.work_root))
    result: dict[str, Any] = {"scenario": name, "database": database, "work_dir": str(work)}
    started = time.monotonic()
    console.rule(f"[bold]{name}[/] on {database}")
    stack: Stack | None = None
    runtimes: list[Runtime] = []
    collector = Collector()
    t0 = time.time()
    try:
        stack = await start_stack(
            work, synapse_python, database, name, workers=args.homeserver_workers
        )
        common = {
            "domain": DOMAIN,
            "url": stack.stub_url,
            "tag": secrets.token_hex(3),
            "reconnect": {"initialDelay": 500, "maxDelay": args.stub_max_delay_ms},
            "plain": args.stub == "plain",
        }
        by_name: dict[str, Runtime] = {}

        async def spawn(rname: str, role: str, **extra: Any) -> Runtime:
            rt = Runtime(rname, role, {**common, **extra}, collector, work)
            runtimes.append(rt)
            by_name[rname] = rt
            await rt.start()
            return rt

        # Across domains, the receivers are the other domain's runtimes.
        far = {} if stack.peer is None else {"domain": PEER_DOMAIN, "url": stack.peer.stub_url}
        await asyncio.gather(*(spawn(r, "receiver", **far) for r in layout.receivers))
        learning = {"learnEvery": layout.learn_every} if layout.learn_every else {}
        if layout.reporter:
            reporter = await spawn(
                layout.reporter,
                "reporter",
                count=layout.reporter_count,
                rate=layout.reporter_rate,
            )
            await asyncio.gather(
                *(spawn(o, "observer", object=reporter.address) for o in layout.observers)
            )
        await asyncio.gather(
            *(
                spawn(s, "sender", count=layout.count, rate=layout.rate, **learning)
                for s in layout.senders
            )
        )
        streaming = [by_name[s] for s in layout.senders]
        if layout.reporter:
            streaming.append(by_name[layout.reporter])
        console.print(f"  {len(runtimes)} runtimes ready; streaming {layout.messages} messages")
        targets = {
            rt.name: [by_name[r].address for r in layout.senders.get(rt.name, [])]
            for rt in streaming
        }
        await warm_up(layout, streaming, targets, collector)
        t0 = time.time()
        await asyncio.gather(*(rt.command(cmd="go", targets=targets[rt.name]) for rt in streaming))
        fault_task = asyncio.create_task(
            driver(Run(stack, t0, layout.stream_s, runtimes, collector))
        )
        try:
            await asyncio.wait_for(
                asyncio.gather(*(rt.sent for rt in streaming)), layout.stream_s + 300
            )
            await fault_task
        finally:
            if not fault_task.done():
                fault_task.cancel()
                with contextlib.suppress(BaseException):
                    await fault_task
        result["drained"], result["drain_s"] = await drain(
            lambda: (len(collector.arrivals), sum(rt.acknowledged_total() for rt in runtimes)),
            plan.quiet_s,
            plan.drain_cap_s,
        )
        finals = {
            rt.name: await rt.finish() for rt in runtimes if rt.role in ("sender", "reporter")
        }
        for rt in runtimes:
            if rt.role not in ("sender", "reporter"):
                await rt.finish()
        evaluate(result, layout, finals, collector, stack, runtimes, t0, args)
    except Exception as exc:  # noqa: BLE001 - recorded: the scenario failed to run
        result["error"] = f"{type(exc).__name__}: {exc}"
        console.print(f"  [red]error[/]: {result['error']}")
    finally:
        for rt in runtimes:
            await rt.stop()
        if stack is not None:
            result["faults"] = result.get("faults") or [f.as_dict(t0) for f in stack.faults]
            result["node_log_tail"] = stack.node.log_tail(15) if result.get("error") else None
            await stack.close()
    result["duration_s"] = round(time.monotonic() - started, 1)
    result["ok"] = verdict_ok(result, args.recovery_limit)
    if result["ok"] and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        result["work_dir"] = None
    print_scenario(result)
    return result


async def warm_up(
    layout: Layout, streaming: list[Runtime], targets: dict[str, list[str]], collector: Collector
) -> None:
    """Each sender's first message to each destination (seq 0, not counted) provisions its room
    in Matrix; the stream starts once every one of them arrived."""
    expected = {
        (rt.name, dest)
        for rt in streaming
        for dest in (layout.observers if rt.name == layout.reporter else layout.senders[rt.name])
    }
    await asyncio.gather(*(rt.command(cmd="warmup", targets=targets[rt.name]) for rt in streaming))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        arrived = {(a.sender, a.receiver) for a in collector.arrivals if a.seq == 0}
        if expected <= arrived:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"warm-up messages did not arrive: {sorted(expected - arrived)}")


async def drain(
    progress: Callable[[], tuple[int, int]], quiet_s: float, cap_s: float
) -> tuple[bool, float]:
    """Wait until neither arrivals nor acknowledgements grow for ``quiet_s`` (drained), or
    ``cap_s`` passed (not drained: the counts are not final)."""
    start = last_change = time.monotonic()
    last = progress()
    while time.monotonic() - start < cap_s:
        await asyncio.sleep(0.25)
        now = progress()
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            return True, round(time.monotonic() - start, 1)
    return False, round(time.monotonic() - start, 1)


# Which error answers to a numbered message a scenario expects, by the runtimes' stub: every
# other refusal is a failure, counted like a loss (fault_check.FAILURES), and an expected one
# counts only when it was answered while such a fault was on (from its start to
# --recovery-limit seconds after its end).
# - The bundled stub (acknowledged): none. A numbered message the node cannot decide while its
#   database is away is given back to the stub (closed 1011, sent again) for a minute before it
#   is answered 503, and one waiting for a full lane waits as long as its session lives
#   (adapter/routing/ingress.py): every fault here is shorter than that.
# - A plain stub sends nothing again, so the node answers at once what it cannot take: 503 for
#   a message whose learned route cannot be written while the database is away, and 503 when a
#   lane stays full past routing.backpressure_seconds while the homeserver is away or failing.
HOMESERVER_FAULTS = ("synapse-sigterm", "synapse-sigkill", "synapse-errors", "persister-sigkill")
EXPECTED_REFUSALS: dict[str, dict[str, frozenset[int]]] = {
    "acknowledged": {},
    "plain": {
        "database-outage": frozenset({503}),
        "monkey": frozenset({503}),
        **dict.fromkeys(HOMESERVER_FAULTS, frozenset({503})),
    },
}


def excused(
    scenario: str, stub: str, code: int, t: float, faults: list[Fault], grace_s: float
) -> bool:
    """Whether a refusal with ``code`` answered at ``t`` is one the scenario expects."""
    if code not in EXPECTED_REFUSALS[stub].get(scenario, frozenset()):
        return False
    return any(f.start <= t <= (f.end or t) + grace_s for f in faults)


def grade(
    scenario: str,
    stub: str,
    layout: Layout,
    finals: dict[str, dict[str, Any]],
    arrivals: list[Arrival],
    faults: list[Fault],
    progress: dict[str, list[tuple[float, int]]],
    t0: float,
    recovery_limit: float,
) -> dict[str, Any]:
    """What a run came to, from what the runtimes reported (``finals``: each streaming runtime's
    final report; ``arrivals``: every arrival; ``progress``: per runtime, (t, messages handed to
    its stub so far)). Pure: tests/integration/test_faults.py grades synthetic runs with it."""
    result: dict[str, Any] = {}
    # A refusal is an answer with an error code (fault_runtime.mjs): [seq, code, t].
    refusals = {
        sender: {seq: (code, t / 1000) for seq, code, t in final["refusals"]}
        for sender, final in finals.items()
    }
    # Acknowledged: the prefix the stub acknowledged, less what the node refused (a definite
    # failure, as Jepsen's :fail).
    attempts = []
    for sender, final in finals.items():
        for seq in range(1, final["attempted"] + 1):
            refusal = refusals[sender].get(seq)
            attempts.append(
                Attempt(
                    sender,
                    seq,
                    layout.destinations(sender, seq),
                    seq <= final["acked_through"] and refusal is None,
                    refusal is not None,
                    refusal is not None
                    and excused(scenario, stub, refusal[0], refusal[1], faults, recovery_limit),
                )
            )
    counted = [a for a in arrivals if a.seq != 0]  # seq 0: the warm-up
    verdict = check(attempts, counted)
    result["counts"] = verdict.as_dict()
    result["messages_planned"] = layout.messages
    sources = {f["ack_source"] for f in finals.values()}
    result["ack_source"] = sources.pop() if len(sources) == 1 else sorted(sources)
    times = [a.t for a in counted]
    windows = [
        Window(f.end, search_from(f), faults[i + 1].start if i + 1 < len(faults) else None)
        for i, f in enumerate(faults)
    ]
    for fault, recovery in zip(faults, recovery_times(windows, times), strict=True):
        fault.recovery_s = None if recovery is None else round(recovery, 3)
        fault.outstanding_at_end = outstanding(fault.end, attempts, counted, progress)
    result["faults"] = [f.as_dict(t0) for f in faults]
    recoveries = [f.recovery_s for f in faults]
    result["recovery_max_s"] = max((r for r in recoveries if r is not None), default=None)
    result["unrecovered"] = sum(f.recovery_s is None and f.outstanding_at_end != 0 for f in faults)
    timeline = [0] * (int(max(times, default=t0) - t0) + 1)
    for t in times:
        timeline[max(0, int(t - t0))] += 1
    result["delivered_per_s"] = timeline
    gap = longest_gap(times, since=t0)
    result["max_gap_s"] = None if gap is None else round(gap, 3)
    # Taken over all receivers together, the gap misses one receiver left waiting while the
    # others go on (a session's move that waited for its lane to go idle did just that).
    by_receiver: dict[str, list[float]] = {}
    for arrival in counted:
        by_receiver.setdefault(arrival.receiver, []).append(arrival.t)
    gaps = [(g, r) for r, ts in by_receiver.items() if (g := longest_gap(ts, since=t0))]
    worst = max(gaps, default=None)
    result["max_gap_one_receiver"] = (
        None if worst is None else {"s": round(worst[0], 3), "receiver": worst[1]}
    )
    # Over every expected delivery: what never arrived is infinitely late ("never").
    waits = [seconds * 1000 for seconds in latencies(attempts, counted)]
    result["latency_ms"] = {
        "p50": _ms(percentile(waits, 50)),
        "p99": _ms(percentile(waits, 99)),
        "max": _ms(max(waits, default=None)),
        "never_arrived": sum(w == math.inf for w in waits),
    }
    refused: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    for final in finals.values():
        for _, code, _ in final["refusals"]:
            refused[str(code)] += 1
        for code, seqs in final.get("answered", {}).items():
            answered[code] += len(seqs)
    result["refused_by_node"] = dict(refused)
    result["answered_not_refused"] = dict(answered)
    return result


def evaluate(
    result: dict[str, Any],
    layout: Layout,
    finals: dict[str, dict[str, Any]],
    collector: Collector,
    stack: Stack,
    runtimes: list[Runtime],
    t0: float,
    args: argparse.Namespace,
) -> None:
    faults = stack.faults
    progress = {rt.name: rt.progress for rt in runtimes}
    result |= grade(
        result["scenario"],
        args.stub,
        layout,
        finals,
        collector.arrivals,
        faults,
        progress,
        t0,
        args.recovery_limit,
    )
    write_raw(stack.work, collector, runtimes, t0)
    result["stub_disconnects"] = {
        rt.name: sum(1 for _, value, _ in rt.statuses if value == "disconnected") for rt in runtimes
    }
    result["stub_failed"] = {
        rt.name: [desc for _, value, desc in rt.statuses if value == "failed"]
        for rt in runtimes
        if any(value == "failed" for _, value, _ in rt.statuses)
    }
    result["other_frames"] = collector.other[:10]
    result["node_starts"] = stack.node.starts
    result["proxy"] = {
        "accepted": stack.proxy.accepted,
        "cut": stack.proxy.cut_connections,
        "refused": stack.proxy.refused,
        "upstream_failed": stack.proxy.upstream_failed,
    }
    result["stats"] = {name: final.get("stats") for name, final in finals.items()}
    # Evidence that the faults happened: a process exited, connections were cut, requests were
    # answered with errors, and every stub noticed each network drop and each restart of the node
    # (an outage of the database or errors of Synapse need not cost a stub its connection).
    problems = [f"{f.kind} {f.signal or ''} had no effect" for f in faults if not f.effective]
    dropping = sum(f.kind in ("network-drop", "network-blackhole", "node") for f in faults)
    problems += [
        f"stub {rt} saw {n} disconnects, expected at least {dropping}"
        for rt, n in result["stub_disconnects"].items()
        if n < dropping
    ]
    if problems:
        result["error"] = "a fault did not take effect: " + "; ".join(problems)


def outstanding(
    at: float,
    attempts: list[Attempt],
    arrivals: list[Arrival],
    progress: dict[str, list[tuple[float, int]]],
) -> int:
    """Expected deliveries of messages handed to a stub by ``at`` that had not arrived by then."""
    handed = {
        name: max((n for t, n in steps if t <= at), default=0) for name, steps in progress.items()
    }
    arrived = {(a.sender, a.receiver, a.seq) for a in arrivals if a.t <= at}
    return sum(
        (a.sender, dest, a.seq) not in arrived
        for a in attempts
        if a.seq <= handed.get(a.sender, 0)
        for dest in a.destinations
    )


def write_raw(work: Path, collector: Collector, runtimes: list[Runtime], t0: float) -> None:
    """Every arrival and every stub status, for a look at what happened (kept with the work dir
    when a scenario is not clean)."""
    with (work / "arrivals.csv").open("w") as f:
        f.write("receiver,sender,seq,t,sent_t,addressed_ok\n")
        for a in collector.arrivals:
            sent = "" if a.sent_t is None else f"{a.sent_t - t0:.4f}"
            f.write(
                f"{a.receiver},{a.sender},{a.seq},{a.t - t0:.4f},{sent},{int(a.addressed_ok)}\n"
            )
    with (work / "statuses.csv").open("w") as f:
        f.write("runtime,t,status,desc\n")
        for rt in runtimes:
            for t, value, desc in rt.statuses:
                f.write(f"{rt.name},{t - t0:.4f},{value},{json.dumps(desc or '')}\n")


def search_from(fault: Fault) -> float:
    """From when on an arrival shows that delivery resumed after ``fault``."""
    if fault.kind == "node" and fault.exited is not None:
        return fault.exited  # the old node is gone, and only a node delivers
    if fault.kind == "synapse" and fault.restarted is not None:
        # The node may still be delivering the last transaction of the old Synapse for a moment;
        # the new one needs over a second to start.
        return fault.restarted + 0.5
    return fault.end  # a network drop: nothing gets through until the proxy accepts again


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _ms(value: float | None) -> float | str | None:
    """A latency for the report: "never" when it falls on what never arrived."""
    return "never" if value == math.inf else _round(value)


def verdict_ok(result: dict[str, Any], recovery_limit: float) -> bool:
    """Clean: a valid observation (no error, a full drain, every planned message attempted),
    every count of fault_check.FAILURES 0 (every attempted message delivered once, in order, or
    refused as the scenario expects), and delivery resumed within ``recovery_limit`` seconds of
    every fault that left something to deliver."""
    counts = result.get("counts")
    if result.get("error") or not counts or not result.get("drained"):
        return False
    if counts["messages_attempted"] != result.get("messages_planned"):
        return False
    clean = all(counts[k] == 0 for k in FAILURES)
    recovered = all(
        f["recovery_s"] <= recovery_limit
        if f["recovery_s"] is not None
        else f.get("outstanding_at_end") == 0
        for f in result.get("faults", [])
    )
    return clean and recovered


# -- the scenarios -----------------------------------------------------------------------------


async def sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.time()))


def scenario_setup(
    name: str, plan: Plan, args: argparse.Namespace, rng: random.Random
) -> tuple[Layout, FaultDriver]:
    single = Layout({"A": ["B"]}, ["B"], plan.count, plan.rate)
    # Three pairs, so that the kernel puts runtimes on both of a cluster's processes.
    cluster_pairs = Layout(
        {f"S{i}": [f"R{i}"] for i in range(1, 4)},
        [f"R{i}" for i in range(1, 4)],
        plan.count // 3,
        plan.rate / 3,
    )

    async def nothing(run: Run) -> None:
        return None

    def network(blackhole_s: float) -> FaultDriver:
        async def inject(run: Run) -> None:
            for at in (plan.fault_at, 2 * plan.fault_at):
                await sleep_until(run.t0 + at * run.stream_s)
                if run.stack.faults:
                    # Two drops, not one long one: the second once every stub is back and
                    # delivery resumed (or 15 s passed: then the first shows as not recovered).
                    await run.recovered(run.stack.faults[-1].end, 15)
                    await asyncio.sleep(0.2)
                fault = await run.stack.network_drop(plan.refuse_s, blackhole_s)
                console.print(
                    f"  {fault.start - run.t0:5.1f}s {fault.kind}: "
                    + (f"nothing forwarded for {blackhole_s}s, then " if blackhole_s else "")
                    + f"{fault.cut} connections cut, {fault.refused} refused during "
                    f"{plan.refuse_s}s"
                )

        return inject

    def restart(target: str, sig: signal.Signals, down_s: float = 0.0) -> FaultDriver:
        async def inject(run: Run) -> None:
            await sleep_until(run.t0 + plan.fault_at * run.stream_s)
            await report_restart(run.stack, target, sig, run.t0, down_s)

        return inject

    async def link_blackhole(run: Run) -> None:
        await sleep_until(run.t0 + plan.fault_at * run.stream_s)
        fault = await run.stack.stall_link(plan.link_stall_s)
        console.print(
            f"  {fault.start - run.t0:5.1f}s link between the homeservers dropped everything "
            f"for {plan.link_stall_s:g}s ({fault.detail})"
        )

    async def add_process(run: Run) -> None:
        # Early: a process takes about two seconds to start, and its first runtimes should
        # come to it while the stream still runs.
        await sleep_until(run.t0 + ADD_PROCESS_AT * run.stream_s)
        fault = await run.stack.add_process(run.collector.arrivals)
        console.print(f"  {fault.start - run.t0:5.1f}s process added: {fault.detail}")

    async def database_outage(run: Run) -> None:
        await sleep_until(run.t0 + plan.fault_at * run.stream_s)
        sqlite = run.stack.database.kind == "sqlite"
        seconds = plan.sqlite_lock_s if sqlite else plan.postgres_down_s
        fault = await run.stack.database_outage(seconds)
        console.print(f"  {fault.start - run.t0:5.1f}s database outage: {fault.detail}")

    async def synapse_errors(run: Run) -> None:
        await sleep_until(run.t0 + plan.fault_at * run.stream_s)
        fault = await run.stack.synapse_errors(plan.synapse_errors_s)
        console.print(f"  {fault.start - run.t0:5.1f}s Synapse errors: {fault.detail}")

    async def monkey(run: Run) -> None:
        while True:
            await asyncio.sleep(rng.uniform(*plan.monkey_interval))
            if time.time() - run.t0 > plan.monkey_s:
                return
            target = rng.choice(("node", "synapse"))
            sig = rng.choice((signal.SIGKILL, signal.SIGTERM))
            await report_restart(run.stack, target, sig, run.t0)

    if name == "none":
        return single, nothing
    if name == "network":
        return single, network(0.0)
    if name == "network-blackhole":
        return single, network(plan.blackhole_s)
    if name in ("node-sigterm", "node-sigkill", "synapse-sigterm", "synapse-sigkill"):
        target, sig = name.split("-")
        return single, restart(target, signal.Signals[sig.upper()])
    if name == "database-outage":
        # Every 25th message from a fresh address: its learned route is written while the
        # database is away (issue 23's reproduction lost one such message).
        return dataclasses.replace(single, learn_every=25), database_outage
    if name == "synapse-errors":
        return single, synapse_errors
    if name == "peer-synapse-sigkill":
        return single, restart("peer-synapse", signal.SIGKILL, plan.peer_down_s)
    if name == "peer-node-sigkill":
        return single, restart("peer-node", signal.SIGKILL)
    if name == "peer-link-blackhole":
        return single, link_blackhole
    if name == "persister-sigkill":
        # The first event persister, where the one lane's room is (start_stack).
        return single, restart("persister1", signal.SIGKILL)
    if name in ("node-process-moves", "node-process-moves-3"):
        # Every stub connection cut twice: each stub connects again through the proxy to
        # whichever process the kernel picks, and its session moves there when it is another.
        # With three processes a sender's messages before and after a move travel in two
        # lanes that a third process (its receiver's) reads, each on its own.
        return cluster_pairs, network(0.0)
    if name == "node-process-sigkill":
        # The process holding the most runtimes is killed and kept down until the other has
        # taken its sessions over (the runtimes come back through the proxy to it meanwhile),
        # then started again as `up --nodes` would.
        return cluster_pairs, restart("node-process", signal.SIGKILL, plan.process_down_s)
    if name == "federation-process-sigkill":
        # p1 writes the rooms to the peer: what either process's runtimes sent it and p1 had
        # not sent on yet waits in the lanes for p1 to come back and read them again.
        return cluster_pairs, restart("federation-process", signal.SIGKILL, plan.process_down_s)
    if name == "node-process-added":
        return cluster_pairs, add_process
    if name == "monkey":
        receivers = [f"R{i + 1}" for i in range(plan.monkey_receivers)]
        senders = {
            # Each sender starts at a different receiver, then round-robin over all of them.
            f"S{i + 1}": receivers[i % len(receivers) :] + receivers[: i % len(receivers)]
            for i in range(plan.monkey_senders)
        }
        return (
            Layout(
                senders,
                receivers,
                plan.monkey_count,
                plan.monkey_rate,
                reporter="P",
                observers=[f"O{i + 1}" for i in range(plan.monkey_observers)],
                reporter_count=plan.monkey_count,
                reporter_rate=plan.monkey_rate,
            ),
            monkey,
        )
    raise ValueError(name)


async def report_restart(
    stack: Stack, target: str, sig: signal.Signals, t0: float, down_s: float = 0.0
) -> None:
    fault = await stack.restart(target, sig, down_s)
    console.print(
        f"  {fault.start - t0:5.1f}s {target} {sig.name}: exited {fault.exit_code}"
        f"{f', kept down {down_s:g}s' if down_s else ''}"
        f"{' (forced SIGKILL)' if fault.forced_kill else ''}, answering again after "
        f"{fault.end - fault.start:.1f}s"
    )


# -- report ------------------------------------------------------------------------------------

COLUMNS = (
    ("scenario", "scenario"),
    ("db", "database"),
    ("attempted", "attempted"),
    ("ack'd", "acknowledged"),
    ("delivered", "delivered"),
    ("lost", "lost"),
    ("unexpected", "unexpected"),
    ("dup", "duplicated"),
    ("reordered", "reordered"),
    ("refused (expected)", "refused"),
    ("recovery s (max)", "recovery"),
    ("max gap s", "max_gap_s"),
    ("valid", "valid"),
)


def row_cells(r: dict[str, Any]) -> list[str]:
    c = r.get("counts") or {}
    faults = r.get("faults") or []
    if not faults:
        recovery = "n/a"
    else:
        rec = [f["recovery_s"] for f in faults]
        never = sum(f["recovery_s"] is None and f.get("outstanding_at_end") != 0 for f in faults)
        worst = max((x for x in rec if x is not None), default=None)
        recovery = "n/a" if worst is None else f"{worst:.2f}"
        if never:
            recovery = "never" if worst is None else f"{recovery} ({never} never)"
    valid = "error" if r.get("error") else ("yes" if r.get("drained") else "NO (not drained)")
    cells = []
    for _, key in COLUMNS:
        if key in ("scenario", "database"):
            cells.append(str(r[key]))
        elif key == "recovery":
            cells.append(recovery)
        elif key == "max_gap_s":
            cells.append("" if r.get("max_gap_s") is None else f"{r['max_gap_s']:.2f}")
        elif key == "valid":
            cells.append(valid)
        elif key == "refused":
            refused = c.get("refused")
            text = "" if refused is None else f"{refused} ({c['refused_excused']})"
            cells.append(f"[red]{text}" if c.get("refused_unexpected") else text)
        else:
            value = c.get(key)
            text = "" if value is None else str(value)
            if key in ("lost", "unexpected", "duplicated", "reordered") and value:
                text = f"[red]{text}"
            cells.append(text)
    return cells


def print_scenario(r: dict[str, Any]) -> None:
    c = r.get("counts")
    one = r.get("max_gap_one_receiver")
    if c:
        console.print(
            "  "
            + ", ".join(
                f"{k}={c[k]}"
                for k in (
                    "attempted",
                    "acknowledged",
                    "delivered",
                    "lost",
                    "unexpected",
                    "duplicated",
                    "reordered",
                    "unaccounted",
                    "refused",
                    "refused_excused",
                )
            )
            + f"; drained={r.get('drained')} ({r.get('drain_s')}s)"
            + f"; recovery max={r.get('recovery_max_s')}s; max gap={r.get('max_gap_s')}s"
            + (f" ({one['s']}s at {one['receiver']} alone)" if one else "")
        )
        for key in (
            "lost_sample",
            "duplicated_sample",
            "reordered_sample",
            "unexpected_sample",
            "unaccounted_sample",
            "refused_unexpected_sample",
        ):
            if c[key]:
                console.print(f"  {key.removesuffix('_sample')}: {'; '.join(c[key])}")
        for f in r.get("faults") or []:
            rec = f["recovery_s"]
            console.print(
                f"  fault at {f['start']:.1f}s ({f['kind']} {f['signal'] or ''}".rstrip()
                + f"), over at {f['end']:.1f}s: "
                + (
                    f"delivery resumed {rec:.2f}s later"
                    if rec is not None
                    else "nothing outstanding to deliver"
                    if f["outstanding_at_end"] == 0
                    else f"[red]delivery never resumed[/] ({f['outstanding_at_end']} outstanding)"
                )
            )
        if r.get("refused_by_node"):
            console.print(f"  refused by the node (response codes): {r['refused_by_node']}")
        if r.get("answered_not_refused"):
            console.print(
                f"  answered without an error code (no refusals): {r['answered_not_refused']}"
            )
        latency = r.get("latency_ms") or {}
        console.print(
            f"  latency ms over every expected delivery: p50 {latency.get('p50')}, p99 "
            f"{latency.get('p99')}, max {latency.get('max')} (never arrived: "
            f"{latency.get('never_arrived')})"
        )
    console.print(f"  {'[green]clean' if r['ok'] else '[red]NOT clean'}[/] ({r['duration_s']}s)")


def print_table(results: list[dict[str, Any]]) -> None:
    table = Table(title="fault suite (counts per message and destination)")
    for header, _ in COLUMNS:
        table.add_column(header, justify="left" if header in ("scenario", "db") else "right")
    for r in results:
        table.add_row(*row_cells(r))
    console.print(table)
    sources = {str(r.get("ack_source")) for r in results if r.get("ack_source")}
    for source in sorted(sources):
        console.print(f"ack'd: {source}")
    console.print(
        "lost = acknowledged, never delivered; unexpected = delivered, never sent (there); dup ="
        " extra copies; reordered = arrived after a later message of the same sender to the same"
        " destination; refused = answered with an error code (in brackets: those the scenario"
        " expects; any other is a failure); recovery = from the process answering again (or the"
        " proxy accepting again) to the next delivery (n/a: nothing outstanding); valid ="
        " counted after a full drain"
    )


# -- main --------------------------------------------------------------------------------------


def ensure_node_packages() -> None:
    for folder in ("stub_js", "bench"):
        if not (ROOT / folder / "node_modules" / "ws").is_dir():
            console.print(f"installing {folder}'s packages (npm ci)")
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=ROOT / folder,
                check=True,
            )


async def main(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    scenarios = args.scenario or [
        s
        for s in SCENARIOS
        if (args.homeserver_workers or s not in WORKER_SCENARIOS)
        and ("postgresql" in args.database or s not in CLUSTER_SCENARIOS)
    ]
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    if "postgresql" in args.database and (why := await postgres_reachable()):
        console.print(f"[red]PostgreSQL not reachable[/]: {why}")
        return 2
    await asyncio.to_thread(ensure_node_packages)
    synapse_python = await asyncio.to_thread(ensure_synapse_installed, None, console.print)
    console.print(
        f"scenarios {', '.join(scenarios)} on {', '.join(args.database)}"
        f"{' (quick)' if args.quick else ''}; {args.stub} stubs; seed {seed}"
        + (
            f"; Synapse in worker mode, {args.homeserver_workers} event persisters"
            if args.homeserver_workers
            else ""
        )
    )
    source = Source.begin()
    results = []
    for database in args.database:
        for name in scenarios:
            if database != "postgresql" and name in CLUSTER_SCENARIOS:
                continue
            # A fresh generator per scenario: the same seed, the same faults on either database.
            rng = random.Random(seed)
            results.append(await run_scenario(name, database, plan, args, synapse_python, rng))
    print_table(results)
    out = args.out or (ROOT / "bench" / "results" / f"faults-{time.strftime('%Y%m%dT%H%M%S')}.json")
    write_results(
        out,
        {
            "seed": seed,
            "quick": args.quick,
            "stub": args.stub,
            "homeserver_workers": args.homeserver_workers,
            "plan": dataclasses.asdict(plan),
            "recovery_limit_s": args.recovery_limit,
            "results": results,
        },
        source,
    )
    console.print(f"results written to {out}")
    return 0 if all(r["ok"] for r in results) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="rethink-mn fault-injection suite")
    parser.add_argument(
        "--scenario",
        type=lambda s: s.split(","),
        help=f"comma-separated, from: {','.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument(
        "--database",
        type=lambda s: s.split(","),
        default=["sqlite"],
        help="the node's database: sqlite, postgresql, or both comma-separated (default sqlite)",
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts and shorter faults")
    parser.add_argument("--seed", type=int, help="the monkey's random seed")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument(
        "--recovery-limit",
        type=float,
        default=5.0,
        help="seconds after a fault's end within which delivery must resume (default 5)",
    )
    parser.add_argument(
        "--stub-max-delay-ms",
        type=int,
        default=2000,
        help="the stubs' reconnect.maxDelay (the stub's default is 30000: a recovery time would "
        "then measure the stub's back-off, not the node)",
    )
    parser.add_argument(
        "--stub",
        choices=("acknowledged", "plain"),
        default="acknowledged",
        help="the runtimes' protocol: the bundled stub's acknowledged one (default), or plain, as "
        "a third-party stub speaks it (every message handed to the stub counts as acknowledged: "
        "what such a stub's runtime loses is counted as lost)",
    )
    parser.add_argument(
        "--homeserver-workers",
        type=int,
        default=0,
        metavar="PERSISTERS",
        help="this domain's Synapse in worker mode (as `rethink-mn up --workers`) with this many "
        "event persisters, on PostgreSQL and the local Redis; a Synapse fault signals every "
        "one of its processes",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dirs of clean runs")
    parser.add_argument(
        "--work-root",
        type=Path,
        help="where the scenarios' work dirs (Synapse data, node log and database, raw arrivals) "
        "go; default the system's temp dir. Kept for scenarios that are not clean",
    )
    args = parser.parse_args(argv)
    if args.scenario and not set(args.scenario) <= set(SCENARIOS):
        parser.error(f"--scenario takes {', '.join(SCENARIOS)}")
    if not args.homeserver_workers and set(args.scenario or ()) & WORKER_SCENARIOS:
        parser.error(f"{', '.join(sorted(WORKER_SCENARIOS))} need --homeserver-workers")
    if set(args.scenario or ()) & CLUSTER_SCENARIOS and args.database != ["postgresql"]:
        parser.error(f"{', '.join(sorted(CLUSTER_SCENARIOS))} need --database postgresql")
    if not set(args.database) <= {"sqlite", "postgresql"}:
        parser.error("--database takes sqlite, postgresql")
    return args


if __name__ == "__main__":
    sys.exit(uvloop.run(main(parse_args())))

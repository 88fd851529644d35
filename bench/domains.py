"""Between domains: bench/run.py's ``federation`` group.

Two reTHINK domains on loopback, each with its own Synapse (SQLite) and its own node (a separate
process, ``python -m adapter.cli -c <config> run``, with a database of its own): a.bench.local and
b.bench.local. The two homeservers federate with each other only, over TLS from a local CA, named
by their federation addresses (``127.0.0.1:<port>``; adapter/localstack/federation.py), and each
node lists the other domain in ``federation.peers``. A message from a runtime on node A to
``hyperty://b.bench.local/…`` travels node A → A's room for B → federation → node B → runtime B.

Every figure is measured across (``target=cross``: sender on A, receiver on B; or for publication,
reporter on B and subscribers on A) and, in the same run on the same stack, inside one domain
(``target=intra``: both ends on node A), by the same driver scenario (bench/driver.mjs with
``peer``), so every timestamp of a figure is taken in one process:

- ``fed_latency``: light-load latency, send → receive, p50 / p99;
- ``fed_msg_<size>_<count>``: a burst from one runtime to another, first send → last receive,
  every message checked for arrival and order (median of the runs);
- ``fed_crowd_<senders>x<rate>``: a crowd (bench/crowd.py's driver, raw v2 runtimes): senders on
  A, each sending to its partner at a fixed rate, the partners on B (cross) or on A (intra), one
  after the other on the same stack; delivered against offered, p50 / p99, CPU of every process;
- ``fed_pub_<size>_<subscribers>``: one update to many subscribers, until every subscriber has it
  (median of the measured rounds). Across domains the subscription reaches node B through Matrix
  after node A answered it: updates are sent, one a second, until one reaches every subscriber
  (``ready_after_updates``), then the two unmeasured warm-up rounds and the measured ones.

The bare homeserver pipeline (bench/bare.py: one event per message, an appservice receiving the
push, nothing of ours in between) is measured on the same two homeservers, before the node's
scenarios: within homeserver A (``target=bare_intra``) and from A to an appservice on B through a
federated room (``target=bare_cross``): the light-load latency and a single 10 kB event (a
publication's share). It says what Matrix federation itself adds. Last of all, the bare pipeline
across at the first crowd's rate (one event per message, ``fed_crowd_…`` with
``target=bare_cross``), for what federation does with the crowd's traffic when nothing coalesces
it; before it, the paced floor within A and across (``target=bare_{intra,cross}_paced_w<W>``,
bench/bare.py ``paced_batches``): the crowd's messages gathered into events, at most W unarrived,
the least any design carrying them through these homeservers could take; and across, paced by
the receiver's read receipts (``bare_cross_receipts_w<W>``), the least for a sender that learns
of the far side's progress through Matrix.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from adapter.localstack.federation import federating, server_name_for, start_homeservers
from adapter.localstack.synapse import SynapseProcess, SynapseSettings, free_port
from adapter.private_files import dump_private_yaml, private_dir
from appservice.registration import build_registration
from bench.bare import BarePipeline
from bench.crowd import Cell, carrier_figures, node_counters, run_cell, tree_cpu_seconds
from bench.databases import fresh_database

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ("a.bench.local", "b.bench.local")
# The targets: across domains at most this many times the same figure inside one domain.
LATENCY_FACTOR = 2.0
MESSAGING_FACTOR = 2.0
# Light load across: at most this many times the bare pipeline's p50 across (same run).
BARE_LATENCY_FACTOR = 1.25
# A crowd across: every message delivered, p99 at most this many times the same crowd within A.
CROWD_P99_FACTOR = 2.0
# The bare pipeline at a crowd's rate sends this long (one event per message).
BARE_CROWD_SECONDS = 10.0
# The paced bare floor (bench/bare.py paced_batches) with this many events unarrived at most;
# paced by read receipts (across only), unconfirmed at most.
PACED_WINDOWS = (1, 2)
RECEIPT_WINDOWS = (1, 2)
PACING_TARGETS = {"arrival": "paced", "receipt": "receipts"}


@dataclass(frozen=True)
class Plan:
    latency_count: int = 500
    latency_rate: float = 20.0
    latency_size: int = 100
    msg_count: int = 10_000
    msg_size: int = 1000
    msg_repeats: int = 3
    pub_subscribers: int = 1000
    pub_size: int = 10_000
    pub_rounds: int = 3
    crowd: tuple[Cell, ...] = (Cell(200, 5.0, size=200), Cell(1000, 1.0, size=200))
    # The light-load latency, publication and burst scenarios (and their bare baselines);
    # without them, only the crowds (bench/run.py --only federation-crowd).
    classic: bool = True
    # The bare pipeline across at the first crowd's rate, one event per message (not in the
    # smoke run: ~40 s).
    bare_crowd: bool = True
    # The paced bare floor (bench/bare.py paced_batches) at the first crowd's rate, within A
    # and across, before that.
    paced_floor: bool = True

    @property
    def msg_test(self) -> str:
        return f"fed_msg_{self.msg_size}_{self.msg_count}"

    @property
    def pub_test(self) -> str:
        return f"fed_pub_{self.pub_size}_{self.pub_subscribers}"


FULL = Plan()
QUICK = Plan(
    latency_count=60,
    msg_count=1000,
    msg_repeats=1,
    pub_subscribers=20,
    pub_rounds=1,
    crowd=(Cell(10, 2.0, duration=3, warmup=1, drain=20, size=200),),
    bare_crowd=False,
)


class ServiceLike(Protocol):
    proc: subprocess.Popen[bytes]

    async def wait_healthy(self, timeout: float = 60) -> None: ...

    def stop(self) -> None: ...


class ResultsLike(Protocol):
    rows: list[dict[str, Any]]

    def add(self, test: str, **values: Any) -> None: ...


Drive = Callable[..., Awaitable[dict[str, Any]]]
StartService = Callable[[str, list[str], str, Path], ServiceLike]


@dataclass
class Domain:
    """One domain of the stack: its homeserver's settings and where its node listens."""

    name: str
    server_name: str  # 127.0.0.1:<federation port>
    client_port: int
    as_port: int
    stub_port: int
    directory: Path
    bare: BarePipeline
    # Set once started: for the CPU each process uses during the light-load latency.
    pids: dict[str, int | None] = field(default_factory=dict)
    as_token: str = ""
    hs_token: str = ""

    @property
    def bare_registration(self) -> Path:
        return self.directory / "bare-registration.yaml"

    @property
    def registration(self) -> Path:
        return self.directory / "registration.yaml"

    @property
    def stub_url(self) -> str:
        return f"ws://127.0.0.1:{self.stub_port}/stub/connect"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.as_port}/health"

    def synapse(self) -> SynapseSettings:
        return SynapseSettings(
            data_dir=self.directory / "synapse",
            server_name=self.server_name,
            port=self.client_port,
            registration_file=self.registration,
            extra_registrations=(self.bare_registration,),
        )

    def write_registration(self) -> None:
        self.as_token, self.hs_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        private_dir(self.directory)
        dump_private_yaml(
            build_registration(
                appservice_id="rethink-mn",
                url=f"http://127.0.0.1:{self.as_port}",
                as_token=self.as_token,
                hs_token=self.hs_token,
                sender_localpart="_rethink_bot",
                user_prefix="_rethink_",
                alias_prefix="_rethink_",
                server_name=self.server_name,
            ),
            self.registration,
        )
        dump_private_yaml(self.bare.registration(), self.bare_registration)

    def config(self, peer: Domain, db_url: str) -> dict[str, Any]:
        return {
            "domain": self.name,
            "homeserver": {
                "url": f"http://127.0.0.1:{self.client_port}",
                "server_name": self.server_name,
            },
            "appservice": {
                "as_token": self.as_token,
                "hs_token": self.hs_token,
                "listen": {"host": "127.0.0.1", "port": self.as_port},
            },
            "stub": {
                "listen": {"host": "127.0.0.1", "port": self.stub_port},
                "max_frame_bytes": 1024 * 1024,
                "max_connections": 20000,
                # The load driver connects NoMatrix-style (v2 without hello).
                "tokenless_sessions": "allow",
                # Its runtimes are all one client (loopback) standing for many hosts: no
                # per-client rate (bench/run.py's write_config says why).
                "client_messages_per_second": 0,
                "client_bytes_per_second": 0,
            },
            "federation": {"peers": {peer.name: {"server_name": peer.server_name}}},
            "database": {"url": db_url},
            "dashboard": {"worker": False},
            "logging": {"level": "WARNING", "format": "json"},
        }


def _domain(name: str, directory: Path) -> Domain:
    server_name, client_port = server_name_for(free_port()), free_port()
    return Domain(
        name=name,
        server_name=server_name,
        client_port=client_port,
        as_port=free_port(),
        stub_port=free_port(),
        directory=directory,
        bare=BarePipeline(server_name, f"http://127.0.0.1:{client_port}", free_port()),
    )


@contextlib.asynccontextmanager
async def _two_domains(
    python: Path,
    work: Path,
    database: str,
    start_service: StartService,
    configure: Callable[[dict[str, Any]], dict[str, Any]],
    say: Callable[[str], None],
) -> Any:
    """Both homeservers, federating, then both nodes, each healthy; everything stopped after."""
    root = work / "federation"
    a, b = (_domain(name, root / name.split(".")[0]) for name in DOMAINS)
    for side in (a, b):
        side.write_registration()
    group = federating([a.synapse(), b.synapse()], root / "tls")
    async with contextlib.AsyncExitStack() as stack:
        processes: list[SynapseProcess] = await start_homeservers(python, group, say)
        for process in processes:
            stack.push_async_callback(process.stop_async)
        a.pids["synapse"], b.pids["synapse"] = (p.pid for p in processes)
        for side, peer in ((a, b), (b, a)):
            db_url = await stack.enter_async_context(
                fresh_database(database, work, f"fed-{side.name.split('.')[0]}")
            )
            config = side.directory / "node.yaml"
            dump_private_yaml(configure(side.config(peer, db_url)), config)
            cli = [sys.executable, "-m", "adapter.cli", "-c", str(config)]
            await asyncio.to_thread(
                subprocess.run, [*cli, "db", "upgrade"], cwd=ROOT, check=True, capture_output=True
            )
            service = start_service(
                f"node {side.name}", [*cli, "run"], side.health_url, side.directory / "node.log"
            )
            stack.callback(service.stop)
            side.pids["node"] = service.proc.pid
            await service.wait_healthy()
        say(
            f"  two domains up: {a.name} (homeserver {a.server_name}, stub {a.stub_url}) and "
            f"{b.name} (homeserver {b.server_name}, stub {b.stub_url}); logs in {root}"
        )
        yield a, b


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class CpuUse:
    """CPU seconds used by named processes between ``start()`` and ``stop()``: both domains'
    homeservers and nodes (and this process alone, its children not counted: the bare
    pipeline's sender and appservices, if asked)."""

    def __init__(self, a: Domain, b: Domain, bench: bool = False) -> None:
        self.roots = {
            f"{kind}_{side}": pid
            for d, side in ((a, "a"), (b, "b"))
            for kind, pid in d.pids.items()
            if pid is not None
        }
        self.bench = bench
        self.seconds: dict[str, float] = {}
        self.elapsed = 0.0

    def _read(self) -> dict[str, float]:
        used = {k: tree_cpu_seconds(pid) for k, pid in self.roots.items()}
        if self.bench:
            times = os.times()  # this process only (the nodes and homeservers are its children)
            used["bench"] = times.user + times.system
        return used

    def start(self) -> None:
        self._t0 = time.monotonic()
        self.seconds = self._read()

    def stop(self) -> None:
        self.elapsed = time.monotonic() - self._t0
        self.seconds = {k: v - self.seconds[k] for k, v in self._read().items()}

    def figures(self, messages: int) -> dict[str, Any]:
        """% of one core over the scenario, and CPU milliseconds per message."""
        return {
            "cpu_pct": {k: round(100 * v / self.elapsed, 1) for k, v in self.seconds.items()},
            "cpu_ms_per_msg": {k: round(1000 * v / messages, 1) for k, v in self.seconds.items()},
        }


async def run_group(
    python: Path,
    work: Path,
    plan: Plan,
    results: ResultsLike,
    say: Callable[[str], None],
    database: str,
    drive: Drive,
    start_service: StartService,
    configure: Callable[[dict[str, Any]], dict[str, Any]] = lambda c: c,
) -> None:
    say(f"[bold]federation: {DOMAINS[0]} and {DOMAINS[1]}, each its Synapse and node")
    try:
        async with _two_domains(python, work, database, start_service, configure, say) as (a, b):
            if plan.classic:
                # The baseline first, on quiet homeservers: measured right after the node's
                # 1,000-subscriber publication and bursts, it once had a p50 of 315 ms across
                # (~40 ms on quiet homeservers).
                await _bare(a, b, plan, results, say)
                await _scenarios(a, b, plan, results, say, drive)
            await _crowds(a, b, plan, results, say, work)
    except Exception as exc:  # noqa: BLE001 - report it like a failed scenario, keep the run
        say(f"  [red]federation group failed: {exc!r} (logs in {work / 'federation'})")
        results.add("fed_stack", target="cross", error=repr(exc))


async def _scenarios(
    a: Domain,
    b: Domain,
    plan: Plan,
    results: ResultsLike,
    say: Callable[[str], None],
    drive: Drive,
) -> None:
    tag = secrets.token_hex(3)
    here = {"url": a.stub_url, "domain": a.name}
    # Cross: the far end on B. Intra: the far end on A too (the same scenario, same driver).
    far = {"cross": {"url": b.stub_url, "domain": b.name}, "intra": here}

    async def attempt(test: str, target: str, spec: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return await drive({**spec, "url": a.stub_url, "domain": a.name, "peer": far[target]})
        except Exception as exc:  # noqa: BLE001 - one failed scenario must not lose the others
            say(f"  [red]{test} ({target}) failed: {exc!r}")
            results.add(test, target=target, error=repr(exc), load1=_load())
            return None

    # A short unmeasured round each way first: the first message across creates A's room for B
    # (B's node joins it over federation), which is not what the light-load figure is about.
    for target in ("intra", "cross"):
        warm = {"scenario": "latency", "count": 10, "rate": 20.0, "tag": f"fw-{target}-{tag}"}
        await attempt("fed_warm_up", target, warm)
    # Light-load latency first, while both homeservers are fresh.
    metrics = a.health_url.replace("/health", "/metrics")
    for target in ("intra", "cross"):
        counters = await node_counters(metrics)
        cpu = CpuUse(a, b)
        cpu.start()
        r = await attempt(
            "fed_latency",
            target,
            {
                "scenario": "latency",
                "count": plan.latency_count,
                "rate": plan.latency_rate,
                "size": plan.latency_size,
                "tag": f"fl-{target}-{tag}",
            },
        )
        cpu.stop()
        # Node A's events, and how often flow control held one (it should not at light load).
        carrier = carrier_figures(counters, await node_counters(metrics), cpu.elapsed)
        if r is not None:
            results.add(
                "fed_latency",
                carrier=carrier,
                target=target,
                p50_ms=r["p50_ms"],
                p99_ms=r["p99_ms"],
                max_ms=r["max_ms"],
                received=r["received"],
                lost=plan.latency_count - r["received"],
                duplicates=r["duplicates"],
                count=plan.latency_count,
                rate=plan.latency_rate,
                size=plan.latency_size,
                load1=_load(),
                **cpu.figures(plan.latency_count),
            )

    for target in ("intra", "cross"):
        r = await attempt(
            plan.pub_test,
            target,
            {
                "scenario": "publication",
                "subscribers": plan.pub_subscribers,
                "size": plan.pub_size,
                "rounds": plan.pub_rounds,
                "objectEndpoint": "address-allocation",
                "tag": f"fp-{target}-{tag}",
            },
        )
        if r is not None:
            rounds = [x["ms"] for x in r["rounds"] if x["ms"] is not None]
            results.add(
                plan.pub_test,
                target=target,
                ms=statistics.median(rounds) if rounds else None,
                rounds_ms=[None if x["ms"] is None else round(x["ms"], 1) for x in r["rounds"]],
                lost=sum(plan.pub_subscribers - x["received"] for x in r["rounds"]),
                duplicates=sum(x["duplicates"] for x in r["rounds"]),
                ready_after_updates=r["ready_after_updates"],
                setup_ms=r["setup_ms"],
                subscribe_ms=r["subscribe_ms"],
                load1=_load(),
            )

    # The bursts alternate which target goes first, so neither always meets the fuller
    # homeserver.
    runs: dict[str, list[dict[str, Any]]] = {"intra": [], "cross": []}
    failed: set[str] = set()
    for i in range(plan.msg_repeats):
        for target in ("intra", "cross") if i % 2 == 0 else ("cross", "intra"):
            if target in failed:
                continue
            r = await attempt(
                plan.msg_test,
                target,
                {
                    "scenario": "messaging",
                    "count": plan.msg_count,
                    "size": plan.msg_size,
                    "tag": f"fm-{target}-{i}-{tag}",
                },
            )
            if r is None:
                failed.add(target)
            else:
                runs[target].append(r)
    for target in ("intra", "cross"):
        if target in failed:
            continue
        done = [r["ms"] for r in runs[target] if r["ms"] is not None]
        results.add(
            plan.msg_test,
            target=target,
            ms=statistics.median(done) if done else None,
            runs_ms=[None if r["ms"] is None else round(r["ms"], 1) for r in runs[target]],
            lost=sum(r["lost"] for r in runs[target]),
            out_of_order=sum(r["out_of_order"] for r in runs[target]),
            duplicates=sum(r["duplicates"] for r in runs[target]),
            load1=_load(),
        )


async def _crowds(
    a: Domain,
    b: Domain,
    plan: Plan,
    results: ResultsLike,
    say: Callable[[str], None],
    work: Path,
) -> None:
    """Each crowd within A, then across to B, on the same stack; then the bare homeservers at
    the first crowd's rate (once: one event per message leaves the far homeserver busy for
    minutes after, too busy to take a second one's warm-up event within 30 s)."""
    pids = {
        f"{kind}_{side}": pid for d, side in ((a, "a"), (b, "b")) for kind, pid in d.pids.items()
    }
    metrics = a.health_url.replace("/health", "/metrics")
    far_metrics = b.health_url.replace("/health", "/metrics")
    far = {"url": b.stub_url, "domain": b.name, "metrics": far_metrics}
    for cell in plan.crowd:
        test = f"fed_{cell.label}"
        for target, peer in (("intra", None), ("cross", far)):
            say(
                f"[bold]{test} {target}: {cell.senders} senders on {a.name} x {cell.rate:g} msg/s "
                f"of {cell.size} B to partners on {(b if peer else a).name}, {cell.duration:g} s"
            )
            try:
                await run_cell(
                    cell,
                    target,
                    a.stub_url,
                    a.name,
                    pids,
                    results,
                    work,
                    say,
                    metrics,
                    test,
                    peer=peer,
                )
            except Exception as exc:  # noqa: BLE001 - one failed cell must not lose the others
                say(f"  [red]{test} ({target}) failed: {exc!r}")
                results.add(test, target=target, error=repr(exc), load1=_load())
    if plan.crowd and (plan.bare_crowd or plan.paced_floor):
        await _bare_at_crowd_rate(a, b, plan.crowd[0], plan, results, say)


async def _bare_at_crowd_rate(
    a: Domain,
    b: Domain,
    cell: Cell,
    plan: Plan,
    results: ResultsLike,
    say: Callable[[str], None],
) -> None:
    """The bare homeservers at a crowd's rate: the paced floor within A and across, then one
    event per message across (last: it leaves B's homeserver busy for minutes)."""
    test = f"fed_{cell.label}"
    try:
        async with a.bare as sender, b.bare as peer_pipeline:
            if plan.paced_floor:
                await _paced_floor(a, b, cell, test, sender, results, say, "intra")
            await sender.federate_to(peer_pipeline)
            await sender.single_event(cell.size, rounds=1)  # joined, warm
            if plan.paced_floor:
                await _paced_floor(a, b, cell, test, sender, results, say, "cross")
            if plan.bare_crowd:
                count = int(cell.offered * BARE_CROWD_SECONDS)
                say(f"  bare pipeline across, one event per message: {count} at {cell.offered:g}/s")
                cpu = CpuUse(a, b, bench=True)
                cpu.start()
                r = await sender.latency(count, cell.offered, cell.size, drain=cell.drain)
                cpu.stop()
                results.add(
                    test,
                    target="bare_cross",
                    p50_ms=r["p50_ms"],
                    p99_ms=r["p99_ms"],
                    max_ms=r["max_ms"],
                    measured=count,
                    lost=count - r["received"],
                    offered_per_s=cell.offered,
                    elapsed_s=round(cpu.elapsed, 1),
                    load1=_load(),
                    **cpu.figures(count),
                )
    except Exception as exc:  # noqa: BLE001 - a baseline failing must not lose the rest
        say(f"  [red]bare pipeline at {test}'s rate failed: {exc!r}")
        results.add(test, target="bare_cross", error=repr(exc))


async def _paced_floor(
    a: Domain,
    b: Domain,
    cell: Cell,
    test: str,
    sender: BarePipeline,
    results: ResultsLike,
    say: Callable[[str], None],
    side: str,
) -> None:
    """The crowd's messages through the bare homeservers, gathered into events and paced
    (bench/bare.py ``paced_batches``): by their arrival, the floor under the node's figure;
    across, also by read receipts, the floor under any pacing that learns through Matrix."""
    runs = [("arrival", w) for w in PACED_WINDOWS]
    if side == "cross":
        runs += [("receipt", w) for w in RECEIPT_WINDOWS]
    for pacing, window in runs:
        target = f"bare_{side}_{PACING_TARGETS[pacing]}_w{window}"
        say(f"  bare pipeline, batches paced by {pacing} ({target}) at {cell.offered:g}/s")
        cpu = CpuUse(a, b, bench=True)
        cpu.start()
        r = await sender.paced_batches(
            cell.offered, cell.duration, cell.size, window, cell.warmup, cell.drain, pacing=pacing
        )
        cpu.stop()
        results.add(
            test,
            target=target,
            offered_per_s=cell.offered,
            lost=r["measured"] - r["received"],
            elapsed_s=round(cpu.elapsed, 1),
            load1=_load(),
            **r,
            **cpu.figures(r["measured"]),
        )


async def _bare(
    a: Domain, b: Domain, plan: Plan, results: ResultsLike, say: Callable[[str], None]
) -> None:
    say("  bare homeserver pipeline (one event per message) within A, then from A to B")
    try:
        async with a.bare as sender, b.bare as peer:
            for target in ("bare_intra", "bare_cross"):
                if target == "bare_cross":
                    await sender.federate_to(peer)
                    await sender.single_event(plan.pub_size, rounds=1)  # joined, warm
                cpu = CpuUse(a, b, bench=True)
                cpu.start()
                r = await sender.latency(plan.latency_count, plan.latency_rate, plan.latency_size)
                cpu.stop()
                results.add(
                    "fed_latency",
                    target=target,
                    p50_ms=r["p50_ms"],
                    p99_ms=r["p99_ms"],
                    max_ms=r["max_ms"],
                    received=r["received"],
                    lost=plan.latency_count - r["received"],
                    load1=_load(),
                    **cpu.figures(plan.latency_count),
                )
                r = await sender.single_event(plan.pub_size)
                rounds = [x["ms"] for x in r["rounds"]]
                results.add(
                    f"fed_pub_{plan.pub_size}_event",
                    target=target,
                    ms=statistics.median(rounds),
                    rounds_ms=[round(x, 1) for x in rounds],
                    load1=_load(),
                )
    except Exception as exc:  # noqa: BLE001 - a baseline failing must not lose the node's figures
        say(f"  [red]bare pipeline failed: {exc!r}")
        results.add("fed_bare", target="bare_cross", error=repr(exc))


# -- report --------------------------------------------------------------------------------------


def is_federation_row(row: dict[str, Any]) -> bool:
    return str(row["test"]).startswith("fed_")


def _find(rows: list[dict[str, Any]], test: str, target: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["test"] == test and r["target"] == target), None)


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target on this run's cross-domain figure against this run's intra-domain one (the
    bare pipeline's figures of the same run beside them, for what federation itself costs)."""
    fed = [r for r in rows if is_federation_row(r)]
    if not fed:
        return []
    out: list[dict[str, Any]] = []

    def get(test: str, target: str, key: str) -> float | None:
        row = _find(fed, test, target)
        return None if row is None else row.get(key)

    def relative(
        test: str, key: str, factor: float, label: str, base_target: str = "intra"
    ) -> None:
        value, base = get(test, "cross", key), get(test, base_target, key)
        limit = None if base is None else factor * base
        out.append(
            {
                "check": f"{test}: {label}",
                "node": value,
                "limit": limit,
                "met": None if limit is None else value is not None and value <= limit,
                "intra_same_run": base,
                "bare_cross_same_run": get(test, "bare_cross", key),
                "bare_intra_same_run": get(test, "bare_intra", key),
            }
        )

    relative(
        "fed_latency", "p50_ms", LATENCY_FACTOR, f"cross p50 <= {LATENCY_FACTOR:g} x intra p50"
    )
    relative(
        "fed_latency",
        "p50_ms",
        BARE_LATENCY_FACTOR,
        f"cross p50 <= {BARE_LATENCY_FACTOR:g} x bare across p50",
        "bare_cross",
    )
    for test in dict.fromkeys(r["test"] for r in fed if str(r["test"]).startswith("fed_msg_")):
        relative(test, "ms", MESSAGING_FACTOR, f"cross <= {MESSAGING_FACTOR:g} x intra")
    for test in dict.fromkeys(r["test"] for r in fed if str(r["test"]).startswith("fed_crowd_")):
        relative(test, "p99_ms", CROWD_P99_FACTOR, f"cross p99 <= {CROWD_P99_FACTOR:g} x intra p99")
        _paced_floor_check(test, get, out)
        undelivered = _undelivered(_find(fed, test, "cross"))
        out.append(
            {
                "check": f"{test}: cross delivered = offered (lost + duplicated + out of order)",
                "node": undelivered,
                "limit": 0,
                "met": undelivered == 0,
                "intra_same_run": _undelivered(_find(fed, test, "intra")),
                "bare_cross_same_run": get(test, "bare_cross", "lost"),
                "bare_intra_same_run": None,
            }
        )
    node = [r for r in fed if r["target"] in ("cross", "intra")]

    def lost(target: str) -> int:
        return sum(_undelivered(r) or 0 for r in node if r["target"] == target)

    complete = any(r["target"] == "cross" for r in node) and all("error" not in r for r in node)
    out.append(
        {
            "check": "federation: zero loss across domains (lost + out of order, all scenarios)",
            "node": lost("cross") if complete else None,
            "limit": 0,
            "met": complete and lost("cross") == 0,
            "intra_same_run": lost("intra"),
            "bare_cross_same_run": None,
            "bare_intra_same_run": None,
        }
    )
    return out


def _paced_floor_check(
    test: str, get: Callable[[str, str, str], float | None], out: list[dict[str, Any]]
) -> None:
    """Whether the crowd target is within reach of the homeservers themselves: the paced bare
    pipeline across (its best window), by arrival and by receipts, against the limit the node's
    figure has."""

    def best(target: str, windows: tuple[int, ...]) -> float | None:
        found = [get(test, f"{target}_w{w}", "p99_ms") for w in windows]
        return min((v for v in found if v is not None), default=None)

    intra = get(test, "intra", "p99_ms")
    limit = None if intra is None else CROWD_P99_FACTOR * intra
    for pacing, windows in (("arrival", PACED_WINDOWS), ("receipt", RECEIPT_WINDOWS)):
        kind = PACING_TARGETS[pacing]
        floor = best(f"bare_cross_{kind}", windows)
        if floor is None:
            continue
        out.append(
            {
                "check": f"{test}: homeservers' floor, bare across paced by {pacing}, p99 <= "
                f"{CROWD_P99_FACTOR:g} x node intra p99 (is the target within reach)",
                "node": floor,
                "limit": limit,
                "met": None if limit is None else floor <= limit,
                "intra_same_run": intra,
                "bare_cross_same_run": floor,
                "bare_intra_same_run": best(f"bare_intra_{kind}", windows),
            }
        )


def _undelivered(row: dict[str, Any] | None) -> int | None:
    if row is None or "error" in row:
        return None
    return int(row.get("lost", 0) + row.get("duplicates", 0) + row.get("out_of_order", 0))


def _ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if "error" in row:
        return f"failed: {row['error'][:60]}"
    loss = _undelivered(row)
    tail = f" LOST/TWICE/OUT OF ORDER {loss}" if loss else ""
    if "p50_ms" in row:
        count = ""
        if "measured" in row:
            count = f" ({row['measured'] - row['lost']:,} of {row['measured']:,})"
        return f"p50 {_ms(row['p50_ms'])}, p99 {_ms(row['p99_ms'])}{count}{tail}"
    runs = row.get("runs_ms") or row.get("rounds_ms") or []
    return f"{_ms(row['ms'])} ({', '.join(_ms(x) for x in runs)}){tail}"


def _ratio(cross: dict[str, Any] | None, intra: dict[str, Any] | None) -> str:
    if not cross or not intra:
        return ""
    key = "p50_ms" if "p50_ms" in cross else "ms"
    if not cross.get(key) or not intra.get(key):
        return ""
    return f"{cross[key] / intra[key]:.2f}"


def print_report(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    fed = [r for r in rows if is_federation_row(r)]
    if not fed:
        return
    table = Table(
        title="federation (ms): cross = runtime on node A → federation → node B; intra = both on "
        "node A; bare = one event per message, nothing of ours"
    )
    for col in (
        "test",
        "cross",
        "intra (same run)",
        "cross / intra",
        "bare across",
        "bare within",
        "bare across / within",
    ):
        table.add_column(col, justify="left" if col == "test" else "right")
    for test in dict.fromkeys(r["test"] for r in fed):
        cross, intra = _find(fed, test, "cross"), _find(fed, test, "intra")
        bare_cross, bare_intra = _find(fed, test, "bare_cross"), _find(fed, test, "bare_intra")
        table.add_row(
            test,
            _cell(cross),
            _cell(intra),
            _ratio(cross, intra),
            _cell(bare_cross),
            _cell(bare_intra),
            _ratio(bare_cross, bare_intra),
        )
    console.print(table)
    cpu = [r for r in fed if r["test"] == "fed_latency" and "cpu_ms_per_msg" in r]
    if cpu:
        names = list(dict.fromkeys(k for r in cpu for k in r["cpu_ms_per_msg"]))
        usage = Table(title="light-load latency: CPU ms per message (% of one core)")
        for col in ("target", *names):
            usage.add_column(col, justify="left" if col == "target" else "right")
        for r in cpu:
            usage.add_row(
                r["target"],
                *(
                    f"{r['cpu_ms_per_msg'][k]:.1f} ({r['cpu_pct'][k]:.0f} %)"
                    if k in r["cpu_ms_per_msg"]
                    else ""
                    for k in names
                ),
            )
        console.print(usage)
    paced = [r for r in fed if str(r["target"]).startswith(("bare_intra_", "bare_cross_"))]
    if paced:
        floor = Table(
            title="bare homeserver floor at a crowd's rate: messages gathered into events, at "
            "most w events unarrived (paced) or unconfirmed (receipts), ms"
        )
        for col in ("test", "target", "p50", "p99", "max", "events/s", "msgs/event", "lost"):
            floor.add_column(col, justify="left" if col in ("test", "target") else "right")
        for r in paced:
            if "error" in r:
                floor.add_row(r["test"], r["target"], f"failed: {r['error'][:60]}")
                continue
            floor.add_row(
                r["test"],
                r["target"],
                _ms(r["p50_ms"]),
                _ms(r["p99_ms"]),
                _ms(r["max_ms"]),
                f"{r['events'] / max(r['elapsed_s'], 0.001):.1f}",
                f"{r['messages_per_event']:g}",
                str(r["lost"]),
            )
        console.print(floor)
    crowds = [r for r in fed if r["test"].startswith("fed_crowd_") and r.get("cpu_us_per_msg")]
    if crowds:
        names = list(dict.fromkeys(k for r in crowds for k in r["cpu_us_per_msg"]))
        usage = Table(title="crowds: CPU µs per message delivered (% of one core)")
        for col in ("test", "target", *names):
            usage.add_column(col, justify="left" if col in ("test", "target") else "right")
        for r in crowds:
            usage.add_row(
                r["test"],
                r["target"],
                *(
                    f"{r['cpu_us_per_msg'][k]:,.0f} ({r['cpu_pct'][k]:.0f} %)"
                    if k in r["cpu_us_per_msg"]
                    else ""
                    for k in names
                ),
            )
        console.print(usage)
    targets = Table(title="federation targets")
    for col in ("check", "cross", "limit", "met", "intra (same run)", "bare across / within"):
        targets.add_column(col)
    for c in verdicts:
        bare = ""
        if c["bare_cross_same_run"] is not None or c["bare_intra_same_run"] is not None:
            bare = f"{_ms(c['bare_cross_same_run'])} / {_ms(c['bare_intra_same_run'])}"
        targets.add_row(
            c["check"],
            _ms(c["node"]),
            _ms(c["limit"]),
            {True: "[green]yes", False: "[red]NO", None: "—"}[c["met"]],
            _ms(c["intra_same_run"]),
            bare,
        )
    console.print(targets)

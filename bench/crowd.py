"""The crowd benchmark: many runtimes talking at once (bench/run.py's ``crowd`` group).

A cell is N sender runtimes and N receiver runtimes on real stub connections (bench/crowd.mjs);
every runtime allocates a hyperty, each sender sends ``size``-byte messages at ``rate`` per second
to its partner's hyperty, the senders' phases spread evenly over the period. All 2N runtimes start
together: the time until every sender's first message arrived is the cell's set-up figure. Then a
warm-up, the measured window, and a drain for the window's messages.

Each cell runs on the node and on the relay (bench/relay.py, the ceiling), each as its own process
against a fresh homeserver, launched as bench/run.py launches them; the bare homeserver pipeline's
light-load latency (bench/bare.py) is measured in the same run as the reference the latency target
compares to. CPU of the node, Synapse (with any child processes) and the driver processes is read
from /proc/<pid>/stat over the measured window, in % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from bench import dashboard_watch

BENCH = Path(__file__).resolve().parent
TICKS = os.sysconf("SC_CLK_TCK")
# One Node.js process sends and receives 5,000 msg/s over 2,000 sockets with ~20 % of a core
# (measured against the relay); above this rate the load is split over two driver processes
# (each owns whole pairs, so every latency is still measured within one process).
SPLIT_ABOVE_MSGS_PER_S = 10_000
DRIVER_BUSY_PCT = 85.0
DRIVER_LATE_MS = 10.0
BARE_LIGHT_LOAD = (400, 20.0)  # messages, per second: the reference latency
BARE_LIGHT_LOAD_QUICK = (60, 20.0)


@dataclass(frozen=True)
class Cell:
    senders: int
    rate: float  # messages per second per sender
    duration: float = 20.0  # measured window, seconds
    warmup: float = 5.0
    drain: float = 30.0  # how long the window's messages may still arrive after it
    size: int = 300  # payload bytes
    drivers: int = 0  # driver processes; 0 = one, two above SPLIT_ABOVE_MSGS_PER_S
    setup_timeout: float = 0.0  # seconds; 0 = 60 + 0.15 per sender (the node took ~17 s for 200)

    @property
    def label(self) -> str:
        return f"crowd_{self.senders}x{self.rate:g}"

    @property
    def offered(self) -> float:
        return self.senders * self.rate

    @property
    def setup_limit(self) -> float:
        return self.setup_timeout or 60 + 0.15 * self.senders

    @property
    def driver_count(self) -> int:
        if self.drivers:
            return self.drivers
        return 2 if self.offered > SPLIT_ABOVE_MSGS_PER_S else 1


FULL_GRID = (Cell(200, 1.0), Cell(200, 5.0), Cell(1000, 1.0), Cell(1000, 5.0))
QUICK_GRID = (Cell(10, 2.0, duration=3, warmup=1, drain=20),)


def parse_cell(text: str) -> Cell:
    """``SENDERS,RATE[,SECONDS[,DRIVERS]]``, e.g. ``500,5,30`` (argparse's type for --crowd)."""
    usage = "takes SENDERS,RATE[,SECONDS[,DRIVERS]], e.g. 500,5,30"
    parts = text.split(",")
    if not 2 <= len(parts) <= 4:
        raise argparse.ArgumentTypeError(usage)
    try:
        cell = Cell(
            int(parts[0]),
            float(parts[1]),
            duration=float(parts[2]) if len(parts) > 2 else Cell.duration,
            drivers=int(parts[3]) if len(parts) > 3 else 0,
        )
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if cell.senders < 1 or cell.rate <= 0 or cell.duration <= 0 or cell.drivers < 0:
        raise argparse.ArgumentTypeError("SENDERS ≥ 1, RATE > 0, SECONDS > 0, DRIVERS ≥ 0")
    return cell


# -- what bench/run.py hands over ----------------------------------------------------------------


Scenarios = Callable[[str, Any], Awaitable[None]]
# Runs beside a cell: (stub URL, when the warm-up starts (epoch s), seconds) -> its report.
Companion = Callable[[str, float, float], Awaitable[dict[str, Any]]]


class StackLike(Protocol):
    """bench/run.py's Stack, as far as this module uses it."""

    synapses: dict[str, Any]

    def homeserver(self, phase: str) -> AbstractAsyncContextManager[str]: ...

    async def run_node_like(
        self,
        name: str,
        command: Callable[[Path], list[str]],
        journal: bool,
        phase: str | None = None,
        scenarios: Scenarios | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None: ...


class ResultsLike(Protocol):
    rows: list[dict[str, Any]]

    def add(self, test: str, **values: Any) -> None: ...


# name -> (command for a config file, journal on)
Launchers = dict[str, tuple[Callable[[Path], list[str]], bool]]


# -- CPU from /proc ------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of one process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    # After the command: state ppid … utime (14th field of the line) stime (15th).
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def listen_overflows() -> int | None:
    """The kernel's count of connections dropped because a listen queue was full (over the whole
    machine): a connection dropped this way is retried by the client's TCP after 1 s, then 3 s."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table["ListenOverflows"]) if "ListenOverflows" in table else None
    return None


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds used so far by a process and every live descendant (threads included)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = stat
    total = 0.0
    for pid, seconds in cpu.items():
        p: int | None = pid
        while p is not None and p > 1:
            if p == root:
                total += seconds
                break
            p = parents.get(p)
    return total


# A named part of the system under test: one process tree, or several (Synapse's main process
# and its workers, each a child of the benchmark).
Roots = dict[str, int | tuple[int, ...] | None]


class CpuWindow:
    """% of one core used by named process trees between ``start()`` and ``stop()``."""

    def __init__(self, roots: Roots) -> None:
        self.roots = {
            k: (v if isinstance(v, tuple) else (v,)) for k, v in roots.items() if v is not None
        }
        self._before: dict[str, float] = {}
        self._t0 = 0.0
        self.pct: dict[str, float] = {}

    def _seconds(self, pids: tuple[int, ...]) -> float:
        return sum(tree_cpu_seconds(pid) for pid in pids)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._before = {k: self._seconds(pids) for k, pids in self.roots.items()}

    def stop(self) -> None:
        elapsed = time.monotonic() - self._t0
        self.pct = {
            k: 100 * (self._seconds(pids) - self._before[k]) / elapsed
            for k, pids in self.roots.items()
        }


# -- one cell against one target -----------------------------------------------------------------


class Drivers:
    """The cell's driver processes (bench/crowd.mjs), each owning whole pairs."""

    def __init__(
        self,
        cell: Cell,
        url: str,
        domain: str,
        tag: str,
        log_dir: Path,
        peer: dict[str, str] | None = None,
    ) -> None:
        self.cell, self.url, self.domain, self.tag, self.log_dir = cell, url, domain, tag, log_dir
        # The receivers' stub URL and domain when they are another domain's runtimes.
        self.peer = peer
        self.procs: list[asyncio.subprocess.Process] = []
        self._logs: list[Any] = []

    async def __aenter__(self) -> Drivers:
        for shard in range(self.cell.driver_count):
            spec = {
                "url": self.url,
                "domain": self.domain,
                "senders": self.cell.senders,
                "shard": shard,
                "shards": self.cell.driver_count,
                "rate": self.cell.rate,
                "size": self.cell.size,
                "warmupS": self.cell.warmup,
                "durationS": self.cell.duration,
                "drainS": self.cell.drain,
                "setupTimeoutS": self.cell.setup_limit,
                "tag": self.tag,
            }
            if self.peer is not None:
                spec["peer"] = self.peer
            log = (self.log_dir / f"crowd-driver-{self.tag}-{shard}.log").open("w")
            self._logs.append(log)
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    "node",
                    str(BENCH / "crowd.mjs"),
                    json.dumps(spec),
                    cwd=BENCH,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    limit=256 * 1024 * 1024,  # a result line carries every latency
                )
            )
        try:
            await self.read("ready", 60)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for log in self._logs:
            log.close()

    def tell(self, line: str) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(line.encode() + b"\n")

    async def read(self, event: str, timeout: float) -> list[dict[str, Any]]:
        async def one(proc: asyncio.subprocess.Process) -> dict[str, Any]:
            assert proc.stdout is not None
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"crowd driver exited ({await proc.wait()}), see {self.log_dir}")
            reply: dict[str, Any] = json.loads(line)
            if "error" in reply:
                raise RuntimeError(f"crowd driver failed: {reply['error']}")
            if reply.get("event") != event:
                raise RuntimeError(f"crowd driver said {reply.get('event')}, expected {event}")
            return reply

        return list(await asyncio.wait_for(asyncio.gather(*(one(p) for p in self.procs)), timeout))


def _pct(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile, None when it falls on a message that never arrived (inf)."""
    if not values:
        return None
    v = values[min(len(values) - 1, int(p / 100 * len(values)))]
    return None if math.isinf(v) else v


async def _sleep_until(wall: float) -> None:
    await asyncio.sleep(max(0.0, wall - time.time()))


async def node_counters(metrics_url: str | None) -> dict[str, float]:
    """The node's own counters that say how the carrier behaved (empty if unavailable)."""
    if metrics_url is None:
        return {}
    from prometheus_client.parser import text_string_to_metric_families

    try:
        async with aiohttp.ClientSession() as http, http.get(metrics_url) as resp:
            text = await resp.text()
    except (aiohttp.ClientError, OSError):
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "rethink_mn_matrix_events_sent_total":
                found[f"events_{labels.get('carrier')}"] = sample.value
            elif (
                sample.name == "rethink_mn_messages_received_total"
                and labels.get("outcome") == "routed"
            ):
                found["routed"] = sample.value
            elif sample.name in (
                "rethink_mn_homeserver_send_seconds_sum",
                "rethink_mn_homeserver_send_seconds_count",
            ):
                found[sample.name.rsplit("_", 1)[-1]] = sample.value
            elif sample.name in (
                "rethink_mn_peer_confirm_seconds_sum",
                "rethink_mn_peer_confirm_seconds_count",
            ):
                found["confirm_" + sample.name.rsplit("_", 1)[-1]] = sample.value
            elif sample.name == "rethink_mn_peer_confirm_seconds_bucket" and labels.get("le") in (
                "0.5",
                "1.0",
            ):
                found[f"confirm_within_{labels['le']}"] = sample.value
            elif sample.name in (
                "rethink_mn_peer_event_age_seconds_sum",
                "rethink_mn_peer_event_age_seconds_count",
            ):
                found["age_" + sample.name.rsplit("_", 1)[-1]] = sample.value
            elif sample.name == "rethink_mn_peer_fell_behind_total":
                found[f"behind_{labels.get('reason')}"] = sample.value
            elif sample.name == "rethink_mn_peer_paced_total":
                key = f"paced_{labels.get('outcome')}"
                found[key] = found.get(key, 0.0) + sample.value
    return found


async def _counters(metrics_url: str | None, far_metrics_url: str | None) -> dict[str, float]:
    """This node's counters, and the far node's (``far_``) for a crowd across domains."""
    found = await node_counters(metrics_url)
    far = await node_counters(far_metrics_url)
    return {**found, **{f"far_{k}": v for k, v in far.items()}}


def carrier_figures(
    before: dict[str, float], after: dict[str, float], window: float
) -> dict[str, Any]:
    """Lane events per second, messages per event and the homeserver's send time over the
    window: what bounds the latency at this load."""
    if not before or not after:
        return {}

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    events = delta("events_inline") + delta("events_packed") + delta("events_media")
    sends = delta("count")
    figures: dict[str, Any] = {
        "events_per_s": round(events / window, 1),
        "packed_events_per_s": round(delta("events_packed") / window, 1),
        "media_events_per_s": round(delta("events_media") / window, 1),
        "messages_per_event": round(delta("routed") / events, 1) if events else None,
        "send_ms_mean": round(1000 * delta("sum") / sends, 1) if sends else None,
    }
    if aged := delta("far_age_count"):
        # The far node's side: how old the events were when it handled them.
        figures["far_event_age_ms_mean"] = round(1000 * delta("far_age_sum") / aged, 1)
    if confirmed := delta("confirm_count"):
        # Toward a peer domain: its node's confirmations, and how often the next event waited.
        figures["peer_confirm_ms_mean"] = round(1000 * delta("confirm_sum") / confirmed, 1)
        figures["peer_confirms_over_s"] = {
            limit: int(confirmed - delta(f"confirm_within_{limit}")) for limit in ("0.5", "1.0")
        }
        figures["peer_fell_behind"] = {
            reason: int(delta(f"behind_{reason}")) for reason in ("round_trip", "overdue", "load")
        }
        figures["peer_paced_per_s"] = {
            outcome: round(delta(f"paced_{outcome}") / window, 1)
            for outcome in ("confirmed", "max_hold")
        }
    return figures


def cpu_per_message(cpu_pct: dict[str, float], delivered_per_s: float) -> dict[str, float]:
    """CPU µs each process spent per message delivered in the window (a message goes in
    through one stub connection and out through another: both ends count)."""
    if delivered_per_s <= 0:
        return {}
    return {
        name: round(pct / 100 * 1e6 / delivered_per_s, 1)
        for name, pct in cpu_pct.items()
        if not name.startswith("driver")
    }


async def run_cell(
    cell: Cell,
    name: str,
    url: str,
    domain: str,
    pids: Roots,
    results: ResultsLike,
    log_dir: Path,
    say: Callable[[str], None],
    metrics_url: str | None = None,
    test: str | None = None,
    companion: Companion | None = None,
    peer: dict[str, str] | None = None,
) -> None:
    """``companion(url, start_at, seconds)``, when given, runs beside the crowd from the start
    of its warm-up to the end of its window; what it returns goes into the row. With ``peer``
    (``url``, ``domain``, and ``metrics``: its node's) the receivers are that domain's
    runtimes."""
    tag = f"{name}-{os.urandom(3).hex()}"
    async with Drivers(cell, url, domain, tag, log_dir, peer) as drivers:
        roots: Roots = {**pids, **{f"driver{i}": p.pid for i, p in enumerate(drivers.procs)}}
        # Everyone starts together: connect, allocate, first message.
        setup_at = time.time() + 0.3
        setup_cpu = CpuWindow(roots)
        drivers.tell(f"setup {int(setup_at * 1000)}")
        await _sleep_until(setup_at)
        setup_cpu.start()
        overflows = listen_overflows()
        setups = await drivers.read("setup", cell.setup_limit + 60)
        setup_cpu.stop()
        after = listen_overflows()
        setup_overflows = None if overflows is None or after is None else after - overflows
        per_runtime = sorted(x for s in setups for x in s["start_to_first_ms"])
        first_msg = sorted(x for s in setups for x in s["first_message_ms"])
        failed = sum(s["failed"] + s["late"] for s in setups)
        missing = sum(s["missing"] for s in setups)
        # Then the crowd: warm-up, measured window (CPU sampled at its edges), drain.
        run_at = time.time() + 0.5
        cpu = CpuWindow(roots)
        beside = None
        if companion is not None:
            beside = asyncio.create_task(companion(url, run_at, cell.warmup + cell.duration))
        drivers.tell(f"run {int(run_at * 1000)}")
        await _sleep_until(run_at + cell.warmup)
        cpu.start()
        far_metrics = (peer or {}).get("metrics")
        counters_before = await _counters(metrics_url, far_metrics)
        await _sleep_until(run_at + cell.warmup + cell.duration)
        cpu.stop()
        counters_after = await _counters(metrics_url, far_metrics)
        runs = await drivers.read("result", cell.drain + 120)
        companion_result = await beside if beside is not None else None

    measured = sum(r["measured"] for r in runs)
    lost = sum(r["lost"] for r in runs)
    latencies = sorted([x for r in runs for x in r["latencies_ms"]] + [math.inf] * lost)
    window = cell.duration
    driver_cpu = [v for k, v in cpu.pct.items() if k.startswith("driver")]
    lag_p99 = max((r["lag_p99_ms"] or 0.0) for r in runs)
    saturated = max(driver_cpu, default=0.0) >= DRIVER_BUSY_PCT
    late = lag_p99 > DRIVER_LATE_MS
    sender_responses: dict[str, int] = {}
    for r in runs:
        for code, count in r["sender_responses"].items():
            sender_responses[code] = sender_responses.get(code, 0) + count
    extra = {} if companion_result is None else {"companion": companion_result}
    delivered_per_s = sum(r["arrived_in_window"] for r in runs) / window
    results.add(
        test or cell.label,
        target=name,
        senders=cell.senders,
        rate=cell.rate,
        size=cell.size,
        window_s=window,
        warmup_s=cell.warmup,
        drain_s=cell.drain,
        setup_limit_s=cell.setup_limit,
        offered_per_s=cell.offered,
        sent_per_s=measured / window,
        delivered_per_s=delivered_per_s,
        measured=measured,
        lost=lost,
        out_of_order=sum(r["out_of_order"] for r in runs),
        duplicates=sum(r["duplicates"] for r in runs),
        p50_ms=_pct(latencies, 50),
        p99_ms=_pct(latencies, 99),
        max_ms=_pct(latencies, 100),
        last_after_window_ms=max((r["last_arrival_after_window_ms"] or 0.0) for r in runs),
        setup_all_ms=per_runtime[-1] if per_runtime and not failed + missing else None,
        setup_p50_ms=_pct(per_runtime, 50),
        setup_first_msg_p50_ms=_pct(first_msg, 50),
        setup_first_msg_max_ms=first_msg[-1] if first_msg else None,
        setup_failed=failed,
        setup_missing=missing,
        setup_cpu_pct={k: round(v, 1) for k, v in setup_cpu.pct.items()},
        setup_listen_overflows=setup_overflows,
        cpu_pct={k: round(v, 1) for k, v in cpu.pct.items()},
        cpu_us_per_msg=cpu_per_message(cpu.pct, delivered_per_s),
        drivers=cell.driver_count,
        driver_lag_p99_ms=lag_p99,
        # The slowest message sent in each quarter second of the window, over the drivers.
        slowest_per_quarter_second_ms=[
            max(q) for q in zip(*(r["slowest_per_quarter_second_ms"] for r in runs), strict=True)
        ],
        driver_saturated=saturated,
        driver_late=late,
        sender_errors=sender_responses,
        closed_by_node=sum(r["closed_by_node"] for r in runs),
        carrier=carrier_figures(counters_before, counters_after, window),
        **extra,
    )
    if saturated or late:
        say(
            f"  [yellow]warning: in {cell.label} on {name} the driver "
            + ("is saturated" if saturated else "sent late (CPU busy elsewhere on the machine)")
            + f": driver CPU {', '.join(f'{v:.0f} %' for v in driver_cpu)}, send lag p99 "
            f"{lag_p99:.1f} ms behind the schedule (latencies are still taken from the actual send)"
        )
    if setups and any(s["failures"] for s in setups):
        say(f"  [yellow]set-up failures: {[f for s in setups for f in s['failures']][:3]}")


# -- the group -----------------------------------------------------------------------------------


async def run_group(
    stack: StackLike,
    cells: Sequence[Cell],
    launchers: Launchers,
    bare: Any,
    results: ResultsLike,
    domain: str,
    work: Path,
    say: Callable[[str], None],
    quick: bool = False,
    dashboard: bool = False,
) -> None:
    """With `dashboard` (the node's dashboard worker is on) the node's cells also measure how
    current its live dashboard stays (bench/dashboard_watch.py)."""
    # The reference: the bare pipeline's light-load latency on a fresh homeserver, same size.
    count, rate = BARE_LIGHT_LOAD_QUICK if quick else BARE_LIGHT_LOAD
    say(f"[bold]crowd: bare pipeline light-load reference ({count} at {rate:g}/s)")
    async with stack.homeserver("crowd-bare") as hs_url:
        bare.homeserver_url = hs_url
        async with bare:
            r = await bare.latency(count, rate, size=cells[0].size if cells else 300)
    results.add(
        "crowd_bare_light_load",
        target="bare",
        p50_ms=r["p50_ms"],
        p99_ms=r["p99_ms"],
        received=r["received"],
        count=count,
        rate=rate,
    )
    for cell in cells:
        for name, (command, journal) in launchers.items():
            phase = f"{name}-{cell.label.replace('.', '_')}"
            say(
                f"[bold]{cell.label} on {name}: {cell.senders} senders + {cell.senders} "
                f"receivers, {cell.rate:g} msg/s each, {cell.size} B, {cell.duration:g} s "
                f"after {cell.warmup:g} s warm-up, {cell.driver_count} driver process(es)"
            )

            async def scenarios(
                url: str, service: Any, phase: str = phase, name: str = name, cell: Cell = cell
            ) -> None:
                synapse = stack.synapses.get(phase)
                pids: Roots = {
                    "node": service.pids,
                    "synapse": synapse.all_pids if synapse else None,
                }
                metrics = service.health_url.replace("/health", "/metrics")
                companion: Companion | None = None
                if dashboard and name == "node":
                    data_url = service.health_url.replace("/health", "/dashboard/data.json")
                    companion = functools.partial(dashboard_watch.watch, data_url=data_url)
                await run_cell(
                    cell, name, url, domain, pids, results, work, say, metrics, companion=companion
                )

            try:
                await stack.run_node_like(name, command, journal, phase=phase, scenarios=scenarios)
            except Exception as exc:  # noqa: BLE001 - one failed cell must not lose the others
                say(f"  [red]{cell.label} on {name} failed: {exc!r} (logs in {work})")
                results.add(
                    cell.label,
                    target=name,
                    senders=cell.senders,
                    rate=cell.rate,
                    error=repr(exc),
                )


# -- report --------------------------------------------------------------------------------------

TARGETS = {
    # (senders, rate): what the issue asks of that cell
    (200, 5.0): {"p50_vs_bare": 1.5, "p99_ms": 100.0},
    (1000, 5.0): {"p99_ms": 250.0},
}
SETUP_SENDERS = 200
SETUP_LIMIT_MS = 1000.0


def _find(rows: list[dict[str, Any]], test: str, target: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["test"] == test and r["target"] == target), None)


def _delivered_all(row: dict[str, Any]) -> bool:
    """Delivered = offered: none of the window's messages lost, and the rate delivered during
    the window within 1 % of the rate offered (so not just delivered late, after the window)."""
    return row["lost"] == 0 and row["delivered_per_s"] >= 0.99 * row["offered_per_s"]


def _check(
    test: str,
    label: str,
    row: dict[str, Any],
    key: str,
    limit: float | None,
    met: bool | None,
    relay: dict[str, Any] | None,
    bare_p50: float | None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "check": f"{test}: {label}",
        "node": row[key],
        "limit": limit,
        "met": met,
        "relay_same_run": None if relay is None else relay[key],
        "bare_light_load_p50_ms": bare_p50,
        **extra,
    }


def _at_most(value: float | None, limit: float | None) -> bool | None:
    if limit is None:
        return None
    return value is not None and value <= limit


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each on this run's figures next to this run's baselines."""
    bare = _find(rows, "crowd_bare_light_load", "bare")
    bare_p50 = bare["p50_ms"] if bare else None
    out: list[dict[str, Any]] = []
    for test in dict.fromkeys(r["test"] for r in rows if is_crowd_row(r) and "senders" in r):
        node, relay = _find(rows, test, "node"), _find(rows, test, "relay")
        if relay is not None and "error" in relay:
            relay = None
        if node is None:
            continue
        if "error" in node:
            out.append(
                {
                    "check": f"{test}: ran",
                    "node": None,
                    "limit": None,
                    "met": False,
                    "relay_same_run": None,
                    "bare_light_load_p50_ms": bare_p50,
                    "error": node["error"],
                }
            )
            continue
        target = TARGETS.get((node["senders"], float(node["rate"])))
        if target is not None:
            out.append(
                _check(
                    test,
                    "delivered = offered (msg/s)",
                    node,
                    "delivered_per_s",
                    node["offered_per_s"],
                    _delivered_all(node),
                    relay,
                    bare_p50,
                    lost=node["lost"],
                    driver_saturated=node["driver_saturated"],
                )
            )
            if "p50_vs_bare" in target:
                limit = None if bare_p50 is None else target["p50_vs_bare"] * bare_p50
                out.append(
                    _check(
                        test,
                        f"p50 <= {target['p50_vs_bare']:g} x bare light-load p50",
                        node,
                        "p50_ms",
                        limit,
                        _at_most(node["p50_ms"], limit),
                        relay,
                        bare_p50,
                    )
                )
            out.append(
                _check(
                    test,
                    f"p99 <= {target['p99_ms']:g} ms",
                    node,
                    "p99_ms",
                    target["p99_ms"],
                    _at_most(node["p99_ms"], target["p99_ms"]),
                    relay,
                    bare_p50,
                )
            )
        if node["senders"] == SETUP_SENDERS:
            out.append(
                _check(
                    test,
                    f"set-up: {SETUP_SENDERS} new runtimes, every first message (ms)",
                    node,
                    "setup_all_ms",
                    SETUP_LIMIT_MS,
                    _at_most(node["setup_all_ms"], SETUP_LIMIT_MS),
                    relay,
                    bare_p50,
                )
            )
    return out


def _ms(v: float | None) -> str:
    if v is None:
        return "never"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _setup_text(row: dict[str, Any]) -> str:
    if row["setup_failed"] or row["setup_missing"]:
        head = (
            f"{row['setup_failed']} pairs failed, {row['setup_missing']} first msgs missing "
            f"after {row['setup_limit_s']:g} s"
        )
    else:
        head = _ms(row["setup_all_ms"])
    return (
        f"{head} (p50 {_ms(row['setup_p50_ms'])}; 1st msg p50 "
        f"{_ms(row['setup_first_msg_p50_ms'])}, max {_ms(row['setup_first_msg_max_ms'])})"
    )


def _per_message_text(per_message: dict[str, float]) -> str:
    if "node" not in per_message:
        return ""
    return f"; µs/msg {per_message['node']:.0f} / {per_message.get('synapse', 0):.0f}"


def cell_text(row: dict[str, Any]) -> list[str]:
    cpu = row["cpu_pct"]
    drivers = "+".join(f"{v:.0f}" for k, v in cpu.items() if k.startswith("driver"))
    loss = f"lost {row['lost']:,}" if row["lost"] else "none lost"
    if row["out_of_order"]:
        loss += f", {row['out_of_order']:,} out of order"
    if row["duplicates"]:
        loss += f", {row['duplicates']:,} duplicated"
    if row["sender_errors"]:
        loss += f", errors {row['sender_errors']}"
    return [
        f"{row['offered_per_s']:,.0f} / {row['sent_per_s']:,.0f} / {row['delivered_per_s']:,.0f}",
        f"{_ms(row['p50_ms'])} / {_ms(row['p99_ms'])} / {_ms(row['max_ms'])}",
        loss,
        _setup_text(row),
        f"{cpu.get('node', 0):.0f} / {cpu.get('synapse', 0):.0f} / {drivers}"
        + _per_message_text(row.get("cpu_us_per_msg") or {})
        + (" SATURATED" if row["driver_saturated"] else "")
        + (f" (late: lag p99 {row['driver_lag_p99_ms']:.0f} ms)" if row.get("driver_late") else ""),
    ]


def print_report(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    crowd = [r for r in rows if is_crowd_row(r) and "senders" in r]
    if not crowd:
        return
    bare = _find(rows, "crowd_bare_light_load", "bare")
    title = "crowd (ms; CPU in % of one core over the window)"
    if bare:
        title += f"; bare pipeline light-load p50 {_ms(bare['p50_ms'])}, p99 {_ms(bare['p99_ms'])}"
    table = Table(title=title)
    for col in (
        "cell",
        "target",
        "msg/s offered / sent / delivered",
        "p50 / p99 / max",
        "loss",
        "set-up: all first msgs delivered",
        "CPU node / synapse / driver; CPU µs per message node / synapse",
    ):
        table.add_column(col)
    for r in crowd:
        if "error" in r:
            table.add_row(r["test"], r["target"], f"[red]failed: {r['error']}")
        else:
            table.add_row(r["test"], r["target"], *cell_text(r))
    console.print(table)
    if not verdicts:
        return
    targets = Table(title="crowd targets")
    for col in ("check", "node", "limit", "met", "relay (same run)"):
        targets.add_column(col)
    for c in verdicts:
        limit = c["limit"]
        targets.add_row(
            c["check"],
            "failed" if "error" in c else "never" if c["node"] is None else f"{c['node']:,.1f}",
            "—" if limit is None else f"{limit:,.1f}",
            {True: "[green]yes", False: "[red]NO", None: "—"}[c["met"]],
            "—" if c["relay_same_run"] is None else f"{c['relay_same_run']:,.1f}",
        )
    console.print(targets)


def is_crowd_row(row: dict[str, Any]) -> bool:
    return str(row["test"]).startswith("crowd_")

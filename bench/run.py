"""The benchmark: the node against reTHINK's evaluation, with same-run baselines.

    .venv/bin/python -m bench.run            # full run (a few minutes)
    .venv/bin/python -m bench.run --quick    # smoke run
    .venv/bin/python -m bench.run --crowd 500,5,30   # one crowd cell (bench/crowd.py)
    .venv/bin/python -m bench.run --database postgresql   # the node on PostgreSQL
    .venv/bin/python -m bench.run --only federation   # two domains (bench/domains.py)
    .venv/bin/python -m bench.run --only federation-crowd   # only its crowds across domains
    .venv/bin/python -m bench.run --only federation-crowd --crowd 1000,1,20   # one of them

It starts its own Synapse (SQLite, loopback) and, as separate processes, the node and the
ceiling baseline (bench/relay.py: the node's code with Matrix taken out). Load comes from
bench/driver.mjs over real WebSocket stub connections; the bare homeserver pipeline
(bench/bare.py) is measured in this process. It prints a table and writes a JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import uvloop
from rich.console import Console
from rich.table import Table
from ruamel.yaml import YAML

from adapter.localstack.homeserver_database import ensure_homeserver_database
from adapter.localstack.synapse import (
    SynapseProcess,
    SynapseSettings,
    ensure_synapse_installed,
    free_port,
    write_homeserver_config,
)
from adapter.localstack.workers import WorkerLayout
from adapter.private_files import dump_private_yaml
from appservice.registration import build_registration
from bench import (
    churn,
    crowd,
    domains,
    hostile,
)
from bench.bare import BarePipeline
from bench.databases import KINDS, fresh_database
from bench.provenance import Source, write_results

ROOT = Path(__file__).resolve().parents[1]

DOMAIN = "bench.local"
SERVER_NAME = "bench.local"
# Wide enough for the tables when the output goes to a file or a pipe (rich assumes 80 there).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)

# reTHINK's NoMatrix node measured on this kind of machine (DESIGN.md §7), and the targets.
REFERENCE = {
    "alloc_hyperty_1_10000": 2894,
    "msg_100_10000": 580,
    "msg_1000_10000": 675,
    "msg_10000_10000": 1970,
    "pub_100_1000": 21,
    "pub_10000_1000": 61,
}
TARGETS = {
    "alloc_hyperty_1_10000": 2900,
    "msg_100_10000": 600,
    "msg_10000_10000": 2000,
    "pub_10000_1000": 60,
}


# Each target's same-size bare-pipeline figure (10 kB messages run 1,000 there, not 10,000).
BARE_BASELINE = {
    "msg_100_10000": "msg_100_10000",
    "msg_10000_10000": "msg_10000_1000",
    "pub_10000_1000": "pub_10000_event",
}
GROUPS = frozenset(
    {
        "latency",
        "publication",
        "messaging",
        "allocation",
        "memory",
        "bare",
        "crowd",
        "federation",
        "federation-crowd",
        "hostile",
        "churn",
        "soak",
    }
)
# Groups with their own stacks and reports (not the node / relay / bare phases).
OWN_STACK = frozenset(
    {"bare", "crowd", "federation", "federation-crowd", "hostile", "churn", "soak"}
)


@dataclass
class Plan:
    alloc_counts: tuple[int, ...]
    msg_counts: tuple[int, ...]
    msg_sizes: tuple[int, ...]
    pub_subscribers: tuple[int, ...]
    pub_sizes: tuple[int, ...]
    latency_count: int
    latency_rate: float
    idle_connections: int
    repeats: int
    bare_msg: tuple[tuple[int, int], ...]  # (payload bytes, messages)
    only: frozenset[str] = GROUPS
    crowd_cells: tuple[crowd.Cell, ...] = crowd.FULL_GRID
    federation: domains.Plan = domains.FULL

    def runs(self, group: str) -> bool:
        return group in self.only


FULL = Plan(
    (100, 1000, 10000),
    (100, 1000, 10000),
    (100, 1000, 10000),
    (100, 200, 1000),
    (100, 10000),
    1000,
    20.0,
    2000,
    3,
    # 10,000 x 10 kB one event per message would take minutes more: 1,000 shows the rate.
    ((100, 100), (100, 1000), (100, 10000), (10000, 100), (10000, 1000)),
)
QUICK = Plan(
    (100,), (100, 1000), (100, 10000), (100,), (100, 10000), 100, 20.0, 200, 1, ((100, 100),)
)
QUICK = dataclasses.replace(QUICK, crowd_cells=crowd.QUICK_GRID, federation=domains.QUICK)
# The 30-minute soak runs only when asked for (--only soak); its quick form is in the smoke run.
# The federation group includes its crowds (federation-crowd alone runs only those).
FULL = dataclasses.replace(FULL, only=GROUPS - {"soak", "federation-crowd"})


@dataclass
class Results:
    started: str
    machine: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, test: str, **values: Any) -> None:
        row = {"test": test, **values}
        self.rows.append(row)
        console.print(f"  {test}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in values.items()))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


# -- processes ---------------------------------------------------------------------------------


# `--homeserver-database postgresql`: Synapse on the machine's PostgreSQL instead of SQLite (the
# homeserver given more room: a connection pool, so several lanes persist at once).
HOMESERVER_DATABASE = "sqlite"
# `--homeserver-workers P`: Synapse with P event persisters (and its appservice push) on workers.
HOMESERVER_WORKERS = 0
# `--nodes N`: the node as N processes of one domain (cluster.process p1..pN), sharing its ports.
NODE_PROCESSES = 1
# An experiment, not the default: Synapse's commits no longer wait for the WAL flush.
HOMESERVER_SYNC_COMMIT_OFF = os.environ.get("RETHINK_MN_BENCH_HS_ASYNC_COMMIT") == "1"
PG_ADMIN = os.environ.get("RETHINK_MN_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


async def fresh_homeserver_database(name: str) -> str:
    import psycopg

    name = "".join(c if c.isalnum() else "_" for c in name.lower())[:60]
    url = await ensure_homeserver_database(PG_ADMIN.rsplit("/", 1)[0] + f"/{name}", fresh=True)
    if HOMESERVER_SYNC_COMMIT_OFF:
        async with await psycopg.AsyncConnection.connect(PG_ADMIN, autocommit=True) as conn:
            await conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    return url


# `--node-setting KEY=VALUE`: configuration the benchmarked node (and relay) get on top of the
# benchmark's own, e.g. routing.lanes=1 (for experiments; the published figures use defaults).
NODE_SETTINGS: dict[str, Any] = {}


def _apply_settings(config: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    for dotted, value in {**NODE_SETTINGS, **(extra or {})}.items():
        node = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def write_config(
    path: Path,
    hs_url: str,
    as_port: int,
    stub_port: int,
    db_url: str,
    as_token: str,
    hs_token: str,
    journal: bool,
    settings: dict[str, Any] | None = None,
) -> None:
    """``settings`` (dotted keys) apply after the command line's --node-setting ones: what a
    group configures for every arm it compares."""
    dump_private_yaml(
        _apply_settings(
            {
                "domain": DOMAIN,
                "homeserver": {"url": hs_url, "server_name": SERVER_NAME},
                "appservice": {
                    "as_token": as_token,
                    "hs_token": hs_token,
                    "listen": {"host": "127.0.0.1", "port": as_port},
                },
                "stub": {
                    "listen": {"host": "127.0.0.1", "port": stub_port},
                    "max_frame_bytes": 1024 * 1024,
                    "max_connections": 20000,
                    # The load driver connects NoMatrix-style (v2 without hello), as reTHINK's own
                    # measurements did.
                    "tokenless_sessions": "allow",
                    # The driver's runtimes all connect from loopback, one client to the node,
                    # where they stand for as many hosts: a crowd cell of 2,000 x 5 msg/s is
                    # twice one client's default rate, which would measure that rate and not the
                    # node. Each socket keeps its own pace; groups that set these (hostile.py)
                    # apply after.
                    "client_messages_per_second": 0,
                    "client_bytes_per_second": 0,
                },
                "database": {"url": db_url},
                "routing": {"journal": journal},
                "dashboard": {"worker": False},
                "logging": {"level": "WARNING", "format": "json"},
            },
            settings,
        ),
        path,
    )


class Service:
    """A node-like process, or a domain's node processes (one command each, sharing the ports):
    started, checked healthy, measured, stopped."""

    def __init__(
        self,
        name: str,
        command: list[str] | list[list[str]],
        health_url: str,
        log: Path,
        database_url: str | None = None,
    ) -> None:
        self.name = name
        commands = command if isinstance(command[0], list) else [command]
        self._logs = [
            (log if len(commands) == 1 else log.with_suffix(f".p{i}.log")).open("w")
            for i in range(1, len(commands) + 1)
        ]
        self.procs = [
            subprocess.Popen(c, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            for c, out in zip(commands, self._logs, strict=True)
        ]
        self.proc = self.procs[0]
        self.health_url = health_url
        self._database_url = database_url

    @property
    def pids(self) -> int | tuple[int, ...]:
        return self.proc.pid if len(self.procs) == 1 else tuple(p.pid for p in self.procs)

    async def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                for proc in self.procs:
                    if proc.poll() is not None:
                        raise RuntimeError(f"{self.name} exited with {proc.returncode}")
                try:
                    async with http.get(self.health_url) as resp:
                        if resp.status == 200 and await self._all_joined():
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.25)
        raise RuntimeError(f"{self.name} not healthy within {timeout}s")

    async def _all_joined(self) -> bool:
        """Every process of several has registered its lanes with the others (any of them
        answers the shared health port)."""
        if len(self.procs) == 1 or self._database_url is None:
            return True
        async with await psycopg.AsyncConnection.connect(self._database_url) as conn:
            found = await conn.execute("SELECT count(*) FROM node_processes")
            row = await found.fetchone()
        return row is not None and row[0] == len(self.procs)

    def rss_mb(self) -> float:
        total = 0.0
        for proc in self.procs:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        return total

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in self._logs:
            log.close()


async def drive(spec: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(ROOT / "bench" / "driver.mjs"),
        json.dumps(spec),
        cwd=ROOT / "bench",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    lines = out.decode().strip().splitlines()
    if not lines:
        raise RuntimeError(f"driver printed nothing: {err.decode()[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    if "error" in result:
        raise RuntimeError(f"driver failed: {result['error']}")
    return result


async def idle_rss(service: Service, url: str, count: int) -> dict[str, Any]:
    before = service.rss_mb()
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(ROOT / "bench" / "driver.mjs"),
        json.dumps(
            {
                "scenario": "idle",
                "url": url,
                "count": count,
                "domain": DOMAIN,
                "tag": secrets.token_hex(3),
            }
        ),
        cwd=ROOT / "bench",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    opened = json.loads(await asyncio.wait_for(proc.stdout.readline(), 300))
    await asyncio.sleep(2)  # let the node settle (buffers, sessions written)
    during = service.rss_mb()
    proc.stdin.write(b"close\n")
    await proc.stdin.drain()
    await asyncio.wait_for(proc.wait(), 120)
    return {
        "connections": opened["open"],
        "rss_before_mb": before,
        "rss_with_idle_mb": during,
        "added_mb": during - before,
    }


# -- scenarios ---------------------------------------------------------------------------------


async def run_scenarios(
    name: str, url: str, plan: Plan, results: Results, service: Service | None
) -> None:
    tag = f"{name}-{secrets.token_hex(3)}"
    console.rule(f"[bold]{name}")
    # Light-load latency and publication first, while the homeserver is as fresh as the bare
    # pipeline's: Synapse's pushes to appservices slow down as a SQLite homeserver fills up
    # (the bare pipeline measured after a full run's traffic had a p50 of 199 ms, fresh 18 ms).
    if plan.runs("latency"):
        await run_latency(name, url, plan, results, tag)
    if plan.runs("publication"):
        await run_publication(name, url, plan, results, tag)
    if plan.runs("messaging"):
        await run_messaging(name, url, plan, results, tag)
    if plan.runs("allocation"):
        await run_allocation(name, url, plan, results, tag)
    if service is not None and plan.runs("memory"):
        results.add(
            "memory_idle", target=name, **await idle_rss(service, url, plan.idle_connections)
        )


async def run_latency(name: str, url: str, plan: Plan, results: Results, tag: str) -> None:
    r = await drive(
        {
            "scenario": "latency",
            "url": url,
            "domain": DOMAIN,
            "count": plan.latency_count,
            "rate": plan.latency_rate,
            "tag": f"{tag}-l",
        }
    )
    results.add(
        "latency",
        target=name,
        p50_ms=r["p50_ms"],
        p99_ms=r["p99_ms"],
        received=r["received"],
        duplicates=r["duplicates"],
    )


async def run_publication(name: str, url: str, plan: Plan, results: Results, tag: str) -> None:
    for size in plan.pub_sizes:
        for subscribers in plan.pub_subscribers:
            r = await drive(
                {
                    "scenario": "publication",
                    "url": url,
                    "domain": DOMAIN,
                    "subscribers": subscribers,
                    "size": size,
                    "rounds": 3,
                    "tag": f"{tag}-p{size}-{subscribers}",
                }
            )
            rounds = [x["ms"] for x in r["rounds"]]
            results.add(
                f"pub_{size}_{subscribers}",
                target=name,
                # A round that never completed is no figure: the median is "never" then.
                ms=statistics.median(rounds) if None not in rounds else None,
                setup_ms=r["setup_ms"],
                connect_ms=r["connect_ms"],
                subscribe_ms=r["subscribe_ms"],
                rounds_ms=[None if x["ms"] is None else round(x["ms"], 1) for x in r["rounds"]],
                lost=sum(subscribers - x["received"] for x in r["rounds"]),
                duplicates=sum(x["duplicates"] for x in r["rounds"]),
            )


async def run_messaging(name: str, url: str, plan: Plan, results: Results, tag: str) -> None:
    for size in plan.msg_sizes:
        for count in plan.msg_counts:
            runs = [
                await drive(
                    {
                        "scenario": "messaging",
                        "url": url,
                        "domain": DOMAIN,
                        "count": count,
                        "size": size,
                        "tag": f"{tag}-m{size}-{count}-{i}",
                    }
                )
                for i in range(plan.repeats if count >= 10000 else 1)
            ]
            done = [r["ms"] for r in runs]
            results.add(
                f"msg_{size}_{count}",
                target=name,
                # A repeat that never completed is no figure: the median is "never" then.
                ms=statistics.median(done) if None not in done else None,
                runs_ms=[None if r["ms"] is None else round(r["ms"], 1) for r in runs],
                lost=sum(r["lost"] for r in runs),
                out_of_order=sum(r["out_of_order"] for r in runs),
                duplicates=sum(r["duplicates"] for r in runs),
            )


async def run_allocation(name: str, url: str, plan: Plan, results: Results, tag: str) -> None:
    for kind in ("hyperty", "object"):
        for count in plan.alloc_counts:
            for number, with_key in ((1, False), (3, False), (3, True)):
                form = f"{number}{'k' if with_key else ''}"
                r = await drive(
                    {
                        "scenario": "allocation",
                        "url": url,
                        "domain": DOMAIN,
                        "kind": kind,
                        "count": count,
                        "number": number,
                        "withKey": with_key,
                        "tag": f"{tag}-a{kind}{count}{form}",
                    }
                )
                results.add(
                    f"alloc_{kind}_{form}_{count}",
                    target=name,
                    create_ms=r["create_ms"],
                    delete_ms=r["delete_ms"],
                )


async def run_bare(bare: BarePipeline, plan: Plan, results: Results) -> None:
    console.rule("[bold]bare homeserver pipeline (one event per message)")
    r = await bare.latency(plan.latency_count, plan.latency_rate)
    results.add(
        "latency", target="bare", p50_ms=r["p50_ms"], p99_ms=r["p99_ms"], received=r["received"]
    )
    for size in plan.pub_sizes:
        r = await bare.single_event(size)
        rounds = [x["ms"] for x in r["rounds"]]
        results.add(
            f"pub_{size}_event",
            target="bare",
            ms=statistics.median(rounds),
            rounds_ms=[round(x, 1) for x in rounds],
        )
    for size, count in plan.bare_msg:
        r = await bare.messaging(count, size)
        results.add(f"msg_{size}_{count}", target="bare", ms=r["ms"], lost=r["lost"])


# -- report ------------------------------------------------------------------------------------


def summarize(results: Results) -> list[dict[str, Any]]:
    def find(test: str, target: str) -> dict[str, Any] | None:
        return next((r for r in results.rows if r["test"] == test and r["target"] == target), None)

    def value(row: dict[str, Any] | None, key: str) -> float | None:
        return None if row is None else row.get(key)

    checks: list[dict[str, Any]] = []

    def check(
        label: str,
        node: float | None,
        limit: float | None,
        extra: dict[str, Any],
        ok: Callable[[float, float], bool] = lambda v, t: v <= t,
    ) -> None:
        verdict = None if node is None or limit is None else ok(node, limit)
        if verdict and extra.get("lossless_in_order") is False:
            verdict = False  # fast is no figure when messages were lost or reordered
        checks.append({"check": label, "node": node, "limit": limit, "met": verdict, **extra})

    for test, key in (
        ("alloc_hyperty_1_10000", "create_ms"),
        ("msg_100_10000", "ms"),
        ("msg_10000_10000", "ms"),
        ("pub_10000_1000", "ms"),
    ):
        node, relay = find(test, "node"), find(test, "relay")
        bare_test = BARE_BASELINE.get(test)
        bare_row = find(bare_test, "bare") if bare_test else None
        lossless = node is None or all(
            node.get(k, 0) == 0 for k in ("lost", "out_of_order", "duplicates")
        )
        check(
            test,
            value(node, key),
            TARGETS.get(test),
            {
                "relay_same_run": value(relay, key),
                "bare_same_run": value(bare_row, "ms"),
                "bare_test": bare_test,
                "nomatrix_reference": REFERENCE.get(test),
                "lossless_in_order": lossless,
            },
        )
    node_lat, bare_lat = find("latency", "node"), find("latency", "bare")
    bare_p50 = value(bare_lat, "p50_ms")
    check(
        "latency_p50_vs_bare",
        value(node_lat, "p50_ms"),
        None if bare_p50 is None else 1.25 * bare_p50,
        {"bare_p50_ms": bare_p50, "relay_p50_ms": value(find("latency", "relay"), "p50_ms")},
    )
    memory = find("memory_idle", "node")
    check(
        "memory_2000_idle_added_mb",
        value(memory, "added_mb"),
        200.0 if memory and memory.get("connections") == 2000 else None,
        {"connections": value(memory, "connections")},
    )
    return checks


def print_tables(results: Results, checks: list[dict[str, Any]]) -> None:
    table = Table(title="measurements (ms unless noted)")
    for col in ("test", "node", "relay (ceiling)", "bare pipeline", "NoMatrix ref."):
        table.add_column(col, justify="right" if col != "test" else "left")
    tests = dict.fromkeys(
        r["test"]
        for r in results.rows
        if not crowd.is_crowd_row(r)
        and not domains.is_federation_row(r)
        and not hostile.is_hostile_row(r)
        and not str(r["test"]).startswith(("churn_", "soak_"))
    )
    for test in tests:
        cells = []
        for target in ("node", "relay", "bare"):
            row = next(
                (r for r in results.rows if r["test"] == test and r["target"] == target), None
            )
            cells.append(_cell(row))
        table.add_row(test, *cells, str(REFERENCE.get(test, "")))
    console.print(table)
    verdicts = Table(title="targets")
    for col in ("check", "node", "limit", "met", "same-run baselines"):
        verdicts.add_column(col)
    for c in checks:
        extra = {k: v for k, v in c.items() if k not in ("check", "node", "limit", "met")}
        verdicts.add_row(
            c["check"],
            _fmt(c["node"]),
            _fmt(c["limit"]),
            {True: "[green]yes", False: "[red]NO", None: "—"}[c["met"]],
            ", ".join(f"{k}={_fmt(v)}" for k, v in extra.items()),
        )
    console.print(verdicts)


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if "create_ms" in row:
        return f"{row['create_ms']:.0f} / {row['delete_ms']:.0f} del"
    if "p50_ms" in row:
        return f"p50 {row['p50_ms']:.1f} p99 {row['p99_ms']:.1f}"
    if "added_mb" in row:
        return f"+{row['added_mb']:.0f} MB ({row['connections']} conns)"
    lost, twice = row.get("lost", 0), row.get("duplicates", 0)
    if row.get("ms") is None:
        return f"incomplete, lost {lost}"
    return (
        f"{row['ms']:.0f}"
        + (f" LOST {lost}" if lost else "")
        + (f" TWICE {twice}" if twice else "")
    )


# -- main --------------------------------------------------------------------------------------


@dataclass
class Stack:
    """What every phase shares: tokens, registrations, the Synapse install, the plan."""

    work: Path
    python: Path
    plan: Plan
    results: Results
    database: str = "sqlite"
    as_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    hs_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    node_as: int = field(default_factory=free_port)
    bare_as: int = field(default_factory=free_port)
    synapses: dict[str, SynapseProcess] = field(default_factory=dict)  # by phase

    def register(self, bare: BarePipeline) -> None:
        dump_private_yaml(
            build_registration(
                appservice_id="rethink-mn",
                url=f"http://127.0.0.1:{self.node_as}",
                as_token=self.as_token,
                hs_token=self.hs_token,
                sender_localpart="_rethink_bot",
                user_prefix="_rethink_",
                alias_prefix="_rethink_",
                server_name=SERVER_NAME,
            ),
            self.work / "node-registration.yaml",
        )
        dump_private_yaml(bare.registration(), self.work / "bare-registration.yaml")

    @contextlib.asynccontextmanager
    async def homeserver(self, phase: str) -> AsyncIterator[str]:
        """A fresh Synapse for each phase, so every target is measured on an empty homeserver."""
        database = None
        if HOMESERVER_DATABASE == "postgresql":
            database = await fresh_homeserver_database(f"bench_hs_{phase}")
        settings = SynapseSettings(
            data_dir=self.work / f"synapse-{phase}",
            server_name=SERVER_NAME,
            port=free_port(),
            registration_file=self.work / "node-registration.yaml",
            extra_registrations=(self.work / "bare-registration.yaml",),
            database_url=database,
            workers=WorkerLayout.plan(HOMESERVER_WORKERS, free_port)
            if HOMESERVER_WORKERS
            else None,
        )
        write_homeserver_config(settings)
        synapse = self.synapses[phase] = SynapseProcess(self.python, settings)
        synapse.generate_keys()
        synapse.start()
        try:
            await synapse.wait_ready()
            yield settings.url
        finally:
            await synapse.stop_async()

    async def run_node_like(
        self,
        name: str,
        command: Callable[[Path], list[str]],
        journal: bool,
        phase: str | None = None,
        scenarios: crowd.Scenarios | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """The node (or the relay) as its own process, against a fresh homeserver. ``phase``
        names fresh files when a target runs more than once (the crowd's cells); ``scenarios``
        replaces the groups of run_scenarios, given the stub URL and the service; ``settings``
        (dotted keys) configure the node beyond the command line's."""
        phase = phase or name
        async with (
            self.homeserver(phase) as hs_url,
            fresh_database(self.database, self.work, phase) as db_url,
        ):
            as_port = self.node_as if name == "node" else free_port()
            stub_port = free_port()
            config = self.work / f"{phase}.yaml"
            write_config(
                config,
                hs_url,
                as_port,
                stub_port,
                db_url,
                self.as_token,
                self.hs_token,
                journal=journal,
                settings=settings,
            )
            cli = [sys.executable, "-m", "adapter.cli"]
            await asyncio.to_thread(
                subprocess.run,
                [*cli, "-c", str(config), "db", "upgrade"],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            commands: list[str] | list[list[str]] = command(config)
            if name == "node" and NODE_PROCESSES > 1:
                commands = [
                    [*command(config), "--process", f"p{i}"] for i in range(1, NODE_PROCESSES + 1)
                ]
            service = Service(
                name,
                commands,
                f"http://127.0.0.1:{as_port}/health",
                self.work / f"{phase}.log",
                db_url,
            )
            url = f"ws://127.0.0.1:{stub_port}/stub/connect"
            try:
                await service.wait_healthy()
                if scenarios is not None:
                    await scenarios(url, service)
                else:
                    await run_scenarios(name, url, self.plan, self.results, service)
            finally:
                service.stop()


def ensure_driver_installed() -> None:
    """The driver needs the ``ws`` package pinned in bench/package-lock.json."""
    if (ROOT / "bench" / "node_modules" / "ws").is_dir():
        return
    console.print("installing the load driver's packages (npm ci in bench/)")
    subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=ROOT / "bench",
        check=True,
    )


async def main(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    if args.only:
        plan = dataclasses.replace(plan, only=frozenset(args.only.split(",")))
    if args.crowd and plan.runs("federation-crowd") and args.only:
        # One crowd across domains (and within A, beside it), without the bare one.
        cell = dataclasses.replace(args.crowd, size=domains.FULL.crowd[0].size)
        federation = dataclasses.replace(plan.federation, crowd=(cell,), bare_crowd=False)
        plan = dataclasses.replace(plan, federation=federation)
    elif args.crowd:
        only = plan.only if args.only else frozenset()
        plan = dataclasses.replace(plan, crowd_cells=(args.crowd,), only=only | {"crowd"})
    await asyncio.to_thread(ensure_driver_installed)
    source = Source.begin()
    results = Results(
        started=source.started,
        # What was measured (the machine itself, its load, the commit: the file's source).
        machine={
            "quick": args.quick,
            "database": args.database,
            "homeserver_database": HOMESERVER_DATABASE,
            "homeserver_workers": HOMESERVER_WORKERS,
            "node_processes": NODE_PROCESSES,
            "node_settings": NODE_SETTINGS,
        },
    )
    work = Path(tempfile.mkdtemp(prefix="rethink-bench-"))
    console.print(f"working directory {work}")
    python = await asyncio.to_thread(ensure_synapse_installed, None, console.print)
    stack = Stack(work, python, plan, results, args.database)
    bare = BarePipeline(SERVER_NAME, "", stack.bare_as)
    stack.register(bare)

    # The relay holds the appservice's tokens only so its health probe is authenticated; the
    # homeserver pushes nothing to it (the registration names the node's port).
    launchers: crowd.Launchers = {
        "node": (lambda cfg: [sys.executable, "-m", "adapter.cli", "-c", str(cfg), "run"], True),
        "relay": (
            lambda cfg: [sys.executable, str(ROOT / "bench" / "relay.py"), "-c", str(cfg)],
            False,
        ),
    }
    # The floor under the node's CPU (bench/ws_floor.py) runs crowd cells only.
    crowd_launchers: crowd.Launchers = {
        **launchers,
        "floor": (
            lambda cfg: [sys.executable, str(ROOT / "bench" / "ws_floor.py"), "-c", str(cfg)],
            False,
        ),
    }
    if plan.only - OWN_STACK:
        for name, (command, journal) in launchers.items():
            await stack.run_node_like(name, command, journal=journal)
    if plan.runs("bare"):
        async with stack.homeserver("bare") as hs_url:
            bare.homeserver_url = hs_url
            async with bare:
                await run_bare(bare, plan, results)
    if plan.runs("crowd"):
        await crowd.run_group(
            stack,
            plan.crowd_cells,
            {k: v for k, v in crowd_launchers.items() if k in args.crowd_targets.split(",")},
            bare,
            results,
            DOMAIN,
            work,
            console.print,
            args.quick,
            dashboard=bool(NODE_SETTINGS.get("dashboard.worker")),
        )
    if plan.runs("churn"):
        await churn.run_group(
            stack, launchers["node"], results, DOMAIN, work, console.print, args.quick
        )
    if plan.runs("soak"):
        await churn.run_group(
            stack, launchers["node"], results, DOMAIN, work, console.print, args.quick, soak=True
        )
    if plan.runs("hostile"):
        await hostile.run_group(
            stack, launchers["node"], results, DOMAIN, work, console.print, args.quick
        )
    if plan.runs("federation") or plan.runs("federation-crowd"):
        federation = plan.federation
        if not plan.runs("federation"):
            federation = dataclasses.replace(federation, classic=False)
        await domains.run_group(
            python,
            work,
            federation,
            results,
            console.print,
            args.database,
            drive,
            Service,
            _apply_settings,
        )

    checks = summarize(results) if plan.only - (OWN_STACK - {"bare"}) else []
    crowd_checks = crowd.checks(results.rows)
    hostile_checks = hostile.checks(results.rows)
    churn_checks = churn.checks(results.rows)
    federation_checks = domains.checks(results.rows)
    if checks:
        print_tables(results, checks)
    crowd.print_report(results.rows, crowd_checks, console)
    hostile.print_report(results.rows, hostile_checks, console)
    churn.print_report(results.rows, churn_checks, console)
    domains.print_report(results.rows, federation_checks, console)
    out = args.out or ROOT / "bench" / "results" / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    write_results(
        out,
        {
            "started": results.started,
            "machine": results.machine,
            "rows": results.rows,
            "checks": checks + crowd_checks + hostile_checks + churn_checks + federation_checks,
        },
        source,
    )
    console.print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="reTHINK MN benchmark")
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument(
        "--database", choices=KINDS, default="sqlite", help="the node's database (fresh per run)"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated groups to run (default all): {','.join(sorted(GROUPS))}",
    )
    parser.add_argument(
        "--crowd",
        type=crowd.parse_cell,
        metavar="SENDERS,RATE[,SECONDS[,DRIVERS]]",
        help="run one crowd cell (N senders + N receivers, RATE msg/s each) instead of the grid",
    )
    parser.add_argument(
        "--crowd-targets",
        default="node,relay,floor",
        help="what the crowd cells run on: node, relay (the node's code without Matrix), floor "
        "(bench/ws_floor.py: the WebSocket stack alone); default all three; node alone is quicker",
    )
    parser.add_argument(
        "--node-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration value for the node and the relay (YAML value), e.g. routing.lanes=1",
    )
    parser.add_argument(
        "--homeserver-database",
        choices=("sqlite", "postgresql"),
        default="sqlite",
        help="Synapse's own database (default sqlite, as `rethink-mn up` runs it)",
    )
    parser.add_argument(
        "--homeserver-workers",
        type=int,
        default=0,
        metavar="PERSISTERS",
        help="Synapse in worker mode with this many event persisters (and the appservice push "
        "on a worker), on PostgreSQL and the local Redis; the node gets "
        "homeserver.event_persisters and, unless set, as many lanes",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="the node as N processes of one domain sharing its ports (as `rethink-mn up "
        "--nodes N`), on PostgreSQL",
    )
    args = parser.parse_args()
    NODE_PROCESSES = args.nodes
    if NODE_PROCESSES > 1:
        args.database = "postgresql"
    HOMESERVER_DATABASE = args.homeserver_database
    HOMESERVER_WORKERS = args.homeserver_workers
    if HOMESERVER_WORKERS:
        HOMESERVER_DATABASE = "postgresql"
        NODE_SETTINGS["homeserver.event_persisters"] = HOMESERVER_WORKERS
        NODE_SETTINGS["routing.lanes"] = HOMESERVER_WORKERS
    for setting in args.node_setting:
        key, sep, value = setting.partition("=")
        if not sep:
            parser.error(f"--node-setting takes KEY=VALUE, not {setting!r}")
        NODE_SETTINGS[key] = YAML(typ="safe", pure=True).load(value)
    if args.only and not set(args.only.split(",")) <= GROUPS:
        parser.error(f"--only takes {', '.join(sorted(GROUPS))}")
    if not set(args.crowd_targets.split(",")) <= {"node", "relay", "floor"}:
        parser.error("--crowd-targets takes node, relay, floor")
    sys.exit(uvloop.run(main(args)))

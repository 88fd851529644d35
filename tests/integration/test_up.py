"""`rethink-mn up`: the whole local stack from one command, and a clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from adapter.localstack.synapse import free_port

from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone as far as we are concerned.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


async def _ping_through(stub_port: int, tag: str) -> None:
    """Two runtimes with the bundled stub's protocol, one ping from one to the other."""
    url = f"ws://127.0.0.1:{stub_port}/stub/connect"
    alice = await PyRuntime(url, f"runtime://localhost/{tag}-a", acked=True).connect()
    bob = await PyRuntime(url, f"runtime://localhost/{tag}-b", acked=True).connect()
    try:
        [a] = await alice.allocate("localhost")
        [b] = await bob.allocate("localhost")
        await alice.send({"id": 1, "type": "ping", "from": a, "to": b, "body": {"tag": tag}})
        got = await bob.receive(timeout=30)
        assert got["from"] == a and got["body"] == {"tag": tag}
    finally:
        await alice.close()
        await bob.close()


async def _read_until_ready(proc: asyncio.subprocess.Process, output: list[str]) -> None:
    """``up``'s output into ``output`` until it says it is ready (within 3 minutes)."""
    assert proc.stdout is not None
    async with asyncio.timeout(180):
        while not any(line.startswith("press Ctrl-C") for line in output):
            line = (await proc.stdout.readline()).decode()
            assert line, "up exited early:\n" + "".join(output)
            output.append(line)


@contextlib.asynccontextmanager
async def _up(
    tmp_path: Path, *args: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[str]]]:
    """`rethink-mn up *args` in ``tmp_path``, once it says it is ready; stopped with SIGTERM on
    the way out, with its whole output in the list by then."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "adapter.cli", "up", *args),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output: list[str] = []
    try:
        await _read_until_ready(proc, output)
        yield proc, output
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
        output.append(rest.decode())


async def _refused(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`rethink-mn up *args`, expected to stop before starting anything."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "adapter.cli", "up", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _run_up_once(tmp_path: Path, as_port: int, stub_port: int, stop: signal.Signals) -> None:
    """`up` in ``tmp_path`` until healthy, a ping routed through it, then ``stop``: a clean
    exit with Synapse gone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapter.cli", "up"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        report = None
        deadline = time.monotonic() + 120
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    async with session.get(f"http://127.0.0.1:{as_port}/health") as resp:
                        if resp.status == 200:
                            report = await resp.json()
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.3)
        assert report is not None, f"no healthy node; exit={proc.poll()}"
        assert report["checks"]["homeserver"]["ok"] and report["checks"]["database"]["ok"]
        assert (tmp_path / "var/registration.yaml").exists()
        await _ping_through(stub_port, stop.name.lower())
    finally:
        proc.send_signal(stop)
        output, _ = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, output
    match = re.search(r"Synapse is up \(pid (\d+)\)", output)
    assert match, output
    synapse_pid = int(match.group(1))
    assert f"ws://127.0.0.1:{stub_port}/stub/connect" in output
    assert not _alive(synapse_pid), "Synapse outlived `up`"


async def test_up_runs_routes_and_stops_cleanly_and_again_after_ctrl_c(
    synapse_python: Path, tmp_path: Path
) -> None:
    """The day-one path: `make up`, use it, Ctrl-C, `make up` again, use it again. (After a
    restart Synapse on SQLite reuses appservice transaction ids; routing once stalled here.)"""
    hs_port, as_port, stub_port = free_port(), free_port(), free_port()
    (tmp_path / "config.yaml").write_text(
        f"homeserver:\n  url: http://127.0.0.1:{hs_port}\n"
        f"appservice:\n  as_token: up-test-as-token-000000\n  hs_token: up-test-hs-token-000000\n"
        f"  listen:\n    port: {as_port}\n"
        f"stub:\n  listen:\n    port: {stub_port}\n"
        "database:\n  url: sqlite:///var/node.db\n"
    )
    await _run_up_once(tmp_path, as_port, stub_port, signal.SIGINT)
    await _run_up_once(tmp_path, as_port, stub_port, signal.SIGTERM)


async def test_up_refuses_a_remote_homeserver(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "homeserver:\n  url: https://matrix.example.org\n"
        "appservice:\n  as_token: up-test-as-token-000000\n  hs_token: up-test-hs-token-000000\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "adapter.cli", "up"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "runs a local homeserver" in result.stderr


async def test_killing_up_leaves_no_synapse_behind(synapse_python: Path, tmp_path: Path) -> None:
    hs_port, as_port, stub_port = free_port(), free_port(), free_port()
    (tmp_path / "config.yaml").write_text(
        f"homeserver:\n  url: http://127.0.0.1:{hs_port}\n"
        f"appservice:\n  as_token: up-test-as-token-000000\n  hs_token: up-test-hs-token-000000\n"
        f"  listen:\n    port: {as_port}\n"
        f"stub:\n  listen:\n    port: {stub_port}\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "adapter.cli",
        "up",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    synapse_pid = None
    async with asyncio.timeout(120):
        while synapse_pid is None:
            line = (await proc.stdout.readline()).decode()
            assert line, "up exited before Synapse started"
            if match := re.search(r"Synapse is up \(pid (\d+)\)", line):
                synapse_pid = int(match.group(1))
    assert _alive(synapse_pid)
    proc.kill()  # SIGKILL: no chance to clean up; the kernel's parent-death signal must do it
    await proc.wait()
    async with asyncio.timeout(20):
        while _alive(synapse_pid):
            await asyncio.sleep(0.2)


async def test_up_two_domains_runs_both_and_stops_cleanly(
    synapse_python: Path, tmp_path: Path
) -> None:
    # The default ports are fixed (8008, 8018, ...); a test pre-creates both domains' configs on
    # free ports, which `up --two-domains` then uses as a user's edited configs.
    from adapter.localstack.up import LocalDomain, two_domain_config

    domains = (
        LocalDomain("a.localhost", free_port(), free_port(), free_port(), free_port()),
        LocalDomain("b.localhost", free_port(), free_port(), free_port(), free_port()),
    )
    state = tmp_path / "var"
    configs = [two_domain_config(state, i, lambda _: None, domains) for i in (0, 1)]
    assert configs[0].federation.peers["b.localhost"].server_name == (
        f"127.0.0.1:{domains[1].federation_port}"
    )
    async with (
        _up(tmp_path, "--two-domains", "--state-dir", str(state)) as (proc, output),
        aiohttp.ClientSession() as session,
    ):
        for domain in domains:
            url = f"http://127.0.0.1:{domain.appservice_port}/health"
            async with session.get(url) as resp:
                report = await resp.json()
            assert resp.status == 200, report
            assert report["checks"]["homeserver"]["ok"]
    text = "".join(output)
    assert proc.returncode == 0, text
    for domain in domains:
        assert f"ws://127.0.0.1:{domain.stub_port}/stub/connect" in text
    pids = [int(pid) for pid in re.findall(r"Synapse \S+ is up \(pid (\d+)\)", text)]
    assert len(pids) == 2, text
    assert not any(_alive(pid) for pid in pids), "a Synapse outlived `up --two-domains`"


async def test_up_workers_runs_synapse_in_worker_mode_routes_and_stops_everything(
    synapse_python: Path, tmp_path: Path, worker_services: None
) -> None:
    from adapter.localstack.homeserver_database import drop_homeserver_database
    from adapter.localstack.up import WORKERS_DIR, ensure_config

    from ..conftest import PG_DSN

    hs_port, as_port, stub_port = free_port(), free_port(), free_port()
    state = tmp_path / "var"
    # A user's edited config on free ports (the defaults are fixed), with the persisters and
    # lanes `up --workers` puts into a new one.
    ensure_config(
        state / WORKERS_DIR / "config.yaml",
        state / WORKERS_DIR,
        lambda _: None,
        {
            "homeserver.url": f"http://127.0.0.1:{hs_port}",
            # Synapse names its Redis channels after it: not `localhost`, which a `make
            # up-workers` on this machine may be using.
            "homeserver.server_name": f"up-workers-{os.getpid()}.localhost",
            "appservice.listen.port": as_port,
            "stub.listen.port": stub_port,
            "homeserver.event_persisters": 2,
            "routing.lanes": 2,
        },
    )
    database = PG_DSN.rsplit("/", 1)[0] + f"/rethink_test_up_workers_{os.getpid()}"
    try:
        async with _up(
            tmp_path, "--workers", "--state-dir", str(state), "--homeserver-database", database
        ) as (proc, output):
            await _ping_through(stub_port, "workers")
    finally:
        await drop_homeserver_database(database)
    text = "".join(output)
    assert proc.returncode == 0, text
    assert "2 lane(s) over 2 event persister(s)" in text, text
    pids = [int(p) for p in re.findall(r"Synapse is up \(pid (\d+)\)", text)]
    pids += [int(p) for p in re.findall(r"(?:persister\d|appservice1) pid (\d+)", text)]
    assert len(pids) == 4, text
    assert not any(_alive(pid) for pid in pids), "a Synapse process outlived `up --workers`"


async def test_up_workers_without_redis_says_so(tmp_path: Path) -> None:
    result = await _refused(tmp_path, "--workers", "--redis", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1, result.stderr
    assert "Synapse's workers talk over Redis, and none answers" in result.stderr


async def test_up_nodes_spreads_runtimes_over_processes_restarts_one_killed_and_stops_all(
    synapse_python: Path, tmp_path: Path, worker_services: None
) -> None:
    from adapter.localstack.homeserver_database import drop_homeserver_database
    from adapter.localstack.nodes import NODES_DIR
    from adapter.localstack.up import ensure_config

    from ..conftest import PG_DSN

    hs_port, as_port, stub_port = free_port(), free_port(), free_port()
    state = tmp_path / "var"
    database = PG_DSN.rsplit("/", 1)[0] + f"/rethink_test_up_nodes_{os.getpid()}"
    ensure_config(
        state / NODES_DIR / "config.yaml",
        state / NODES_DIR,
        lambda _: None,
        {
            "homeserver.url": f"http://127.0.0.1:{hs_port}",
            "appservice.listen.port": as_port,
            "stub.listen.port": stub_port,
            "database.url": database,
            "dashboard.enabled": False,
            "cluster.heartbeat_seconds": 0.5,
            "cluster.gone_after_seconds": 2,
        },
    )
    try:
        async with _up(
            tmp_path, "--nodes", "2", "--state-dir", str(state), "--node-database", database
        ) as (proc, output):
            [(_p1, p2)] = re.findall(r"p1 pid (\d+), p2 pid (\d+)", "".join(output))
            # Enough pairs that the kernel puts runtimes on both processes.
            await asyncio.gather(*(_ping_through(stub_port, f"nodes-{i}") for i in range(6)))
            os.kill(int(p2), signal.SIGKILL)
            async with asyncio.timeout(60):
                while not any("p2 exited" in line for line in output):
                    line = await proc.stdout.readline()  # type: ignore[union-attr]
                    output.append(line.decode())
            await asyncio.gather(*(_ping_through(stub_port, f"after-{i}") for i in range(6)))
    finally:
        await drop_homeserver_database(database)
    text = "".join(output)
    assert proc.returncode == 0, text
    assert "[p1]" in text and "[p2]" in text
    assert "node process p2 exited (status -9); starting it again" in text, text
    pids = [int(p) for p in re.findall(r"(?:p\d pid|Synapse is up \(pid) (\d+)", text)]
    pids += [int(p) for p in re.findall(r"\[p\d\].*?pid=(\d+)", text)]
    assert not any(_alive(pid) for pid in pids), "a process outlived `up --nodes`"


async def test_up_nodes_with_workers_routes_across_processes_and_stops_everything(
    synapse_python: Path, tmp_path: Path, worker_services: None
) -> None:
    """The largest local layout: the domain on two node processes, Synapse in worker mode, each
    process's lanes over the event persisters; runtimes on either process reach each other."""
    from adapter.localstack.homeserver_database import drop_homeserver_database
    from adapter.localstack.nodes import NODES_WORKERS_DIR
    from adapter.localstack.up import ensure_config

    from ..conftest import PG_DSN

    hs_port, as_port, stub_port = free_port(), free_port(), free_port()
    state = tmp_path / "var"
    base = PG_DSN.rsplit("/", 1)[0]
    node_database = f"{base}/rethink_test_up_nodes_workers_{os.getpid()}"
    homeserver_database = f"{base}/rethink_test_up_nodes_workers_hs_{os.getpid()}"
    ensure_config(
        state / NODES_WORKERS_DIR / "config.yaml",
        state / NODES_WORKERS_DIR,
        lambda _: None,
        {
            "homeserver.url": f"http://127.0.0.1:{hs_port}",
            # Synapse names its Redis channels after it (see the worker test above).
            "homeserver.server_name": f"up-nodes-workers-{os.getpid()}.localhost",
            "appservice.listen.port": as_port,
            "stub.listen.port": stub_port,
            "database.url": node_database,
            "dashboard.enabled": False,
            "homeserver.event_persisters": 2,
            "routing.lanes": 2,
        },
    )
    try:
        async with _up(
            tmp_path,
            *("--nodes", "2", "--workers", "--state-dir", str(state)),
            *("--node-database", node_database, "--homeserver-database", homeserver_database),
        ) as (proc, output):
            # Enough pairs that the kernel puts runtimes on both processes.
            await asyncio.gather(*(_ping_through(stub_port, f"nw-{i}") for i in range(6)))
    finally:
        await drop_homeserver_database(node_database)
        await drop_homeserver_database(homeserver_database)
    text = "".join(output)
    assert proc.returncode == 0, text
    assert "each node process writes 2 lane(s) over 2 event persister(s)" in text, text
    # Both processes held runtimes: each logged a connect.
    assert re.search(r"\[p1\].*runtime connected", text) and re.search(
        r"\[p2\].*runtime connected", text
    ), text
    pids = [int(p) for p in re.findall(r"(?:p\d pid|Synapse is up \(pid) (\d+)", text)]
    pids += [int(p) for p in re.findall(r"(?:persister\d|appservice1) pid (\d+)", text)]
    assert len(pids) == 6, text
    assert not any(_alive(pid) for pid in pids), "a process outlived `up --nodes --workers`"


async def test_up_refuses_nodes_with_two_domains(tmp_path: Path) -> None:
    result = await _refused(tmp_path, "--nodes", "2", "--two-domains")
    assert result.returncode == 2, result.stderr
    assert "--nodes and --two-domains do not go together" in result.stderr
    assert not (tmp_path / "var").exists()

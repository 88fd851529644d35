"""Processes for the fault suite: a Synapse with its own data dir, the node as a separate
`rethink-mn run` process with a generated config, the node's database (a SQLite file or a fresh
PostgreSQL database), a TCP proxy in front of the node's stub port that can cut every
connection at once or refuse new ones for a while, and, for the scenarios that need them, a TCP
proxy in front of PostgreSQL (an outage of the database server) and an HTTP proxy in front of
Synapse's client API (Synapse answering errors). For the scenarios across domains, a second
domain (its Synapse and node) whose homeserver federates with the first, each homeserver's
federation listener behind a TCP proxy that can stall the link. Each can be signalled and
restarted."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp import web

from adapter.localstack.federation import federating, server_name_for
from adapter.localstack.homeserver_database import (
    drop_homeserver_database,
    ensure_homeserver_database,
)
from adapter.localstack.nodes import STARTED
from adapter.localstack.synapse import (
    SynapseProcess,
    SynapseSettings,
    free_port,
    write_homeserver_config,
)
from adapter.localstack.workers import WorkerLayout
from adapter.private_files import dump_private_yaml
from appservice.registration import build_registration

ROOT = Path(__file__).resolve().parents[1]

DOMAIN = "faults.local"
SERVER_NAME = "faults.local"
PG_ADMIN_DSN = os.environ.get(
    "RETHINK_MN_FAULTS_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if the suite dies, even by SIGKILL; nothing is left behind.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def _wait_exit(poll: Any, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = poll()
        if code is not None:
            return int(code)
        await asyncio.sleep(0.02)
    return None


# -- the node's database -----------------------------------------------------------------------


class Database:
    """The node's database for one scenario: created fresh, dropped afterwards. With
    ``outages`` the node reaches PostgreSQL through a TCP proxy, so that the server can seem
    to go away (`outage`)."""

    def __init__(self, kind: str, work: Path, outages: bool = False) -> None:
        self.kind = kind
        self.work = work
        self.url = ""
        self._pg_name: str | None = None
        pg = urlsplit(PG_ADMIN_DSN)
        self.proxy = Proxy(pg.port or 5432, pg.hostname or "127.0.0.1") if outages else None

    async def create(self) -> str:
        if self.kind == "sqlite":
            self.url = f"sqlite:///{self.work / 'node.db'}"
        elif self.kind == "postgresql":
            import psycopg

            self._pg_name = f"rethink_faults_{uuid.uuid4().hex[:10]}"
            async with await psycopg.AsyncConnection.connect(
                PG_ADMIN_DSN, autocommit=True, connect_timeout=5
            ) as conn:
                await conn.execute(f'CREATE DATABASE "{self._pg_name}"')
            pg = urlsplit(PG_ADMIN_DSN)
            netloc = pg.netloc
            if self.proxy is not None:
                port = await self.proxy.start()
                netloc = netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{port}"
            self.url = urlunsplit((pg.scheme, netloc, f"/{self._pg_name}", pg.query, ""))
        else:
            raise ValueError(f"unknown database {self.kind!r}")
        return self.url

    async def outage(self, seconds: float) -> tuple[bool, str]:
        """The database unusable for the node for ``seconds``. SQLite: another process holds
        the write lock (longer than the node's busy timeout). PostgreSQL: as in a restart,
        the server ends every connection of the node's database and refuses new ones.
        Whether it took effect, and how."""
        if self.kind == "sqlite":
            path = self.url.removeprefix("sqlite:///")
            lock = await asyncio.to_thread(_sqlite_write_lock, path)
            try:
                await asyncio.sleep(seconds)
            finally:
                await asyncio.to_thread(lock.close)  # rolls back: nothing written
            return True, f"write lock held {seconds}s by another process"
        assert self.proxy is not None, "a PostgreSQL outage needs Database(outages=True)"
        import psycopg

        refused_before = self.proxy.refused
        self.proxy.refusing = True
        try:
            async with await psycopg.AsyncConnection.connect(
                PG_ADMIN_DSN, autocommit=True, connect_timeout=5
            ) as conn:
                cursor = await conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self._pg_name,),
                )
                row = await cursor.fetchone()
            ended = int(row[0]) if row else 0
            cut = self.proxy.cut()
            await asyncio.sleep(seconds)
        finally:
            self.proxy.refusing = False
        refused = self.proxy.refused - refused_before
        how = f"{ended} connections ended, {cut} cut, {refused} refused over {seconds}s"
        return ended + cut > 0, how

    async def drop(self) -> None:
        if self.proxy is not None:
            await self.proxy.close()
        if self._pg_name is None:
            return
        import psycopg

        async with await psycopg.AsyncConnection.connect(
            PG_ADMIN_DSN, autocommit=True, connect_timeout=5
        ) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self._pg_name}" WITH (FORCE)')
        self._pg_name = None


def _sqlite_write_lock(path: str) -> sqlite3.Connection:
    # isolation_level=None: the BEGIN is ours. IMMEDIATE takes the write lock at once; the
    # node's readers go on (WAL), its writers wait and then fail with "database is locked".
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def postgres_reachable() -> str | None:
    """None when the PostgreSQL server answers, else why not."""
    import psycopg

    try:
        conn = await psycopg.AsyncConnection.connect(PG_ADMIN_DSN, connect_timeout=5)
    except psycopg.OperationalError as exc:
        return str(exc).strip()
    await conn.close()
    return None


# -- processes -----------------------------------------------------------------------------------


@dataclass
class Tokens:
    as_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    hs_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))


class Homeserver:
    """Synapse (SQLite, loopback) in its own data directory, as bench/run.py runs it."""

    def __init__(
        self,
        python: Path,
        work: Path,
        tokens: Tokens,
        node_as_port: int,
        server_name: str = SERVER_NAME,
        workers: int = 0,
    ) -> None:
        """``workers``: in worker mode, with this many event persisters (on a PostgreSQL
        database made in ``prepare_database``)."""
        self.workers = workers
        self.python = python
        registration = work / "registration.yaml"
        dump_private_yaml(
            build_registration(
                appservice_id="rethink-mn",
                url=f"http://127.0.0.1:{node_as_port}",
                as_token=tokens.as_token,
                hs_token=tokens.hs_token,
                sender_localpart="_rethink_bot",
                user_prefix="_rethink_",
                alias_prefix="_rethink_",
                server_name=server_name,
            ),
            registration,
        )
        self.settings = SynapseSettings(
            data_dir=work / "synapse",
            server_name=server_name,
            port=free_port(),
            registration_file=registration,
        )
        write_homeserver_config(self.settings)
        self.process = SynapseProcess(python, self.settings)

    @property
    def url(self) -> str:
        return self.settings.url

    async def prepare_database(self) -> None:
        """Worker mode only: a fresh PostgreSQL database for Synapse, the workers configured."""
        if not self.workers:
            return
        name = f"rethink_faults_hs_{uuid.uuid4().hex[:10]}"
        url = await ensure_homeserver_database(
            f"{PG_ADMIN_DSN.rsplit('/', 1)[0]}/{name}", fresh=True
        )
        layout = WorkerLayout.plan(self.workers, free_port)
        self.reconfigure(dataclasses.replace(self.settings, database_url=url, workers=layout))

    async def drop_database(self) -> None:
        if self.settings.database_url is not None:
            await drop_homeserver_database(self.settings.database_url)

    def reconfigure(self, settings: SynapseSettings) -> None:
        self.settings = settings
        write_homeserver_config(settings)
        self.process = SynapseProcess(self.python, settings)

    async def start(self) -> None:
        self.process.generate_keys()  # unless it has one
        self.process.start()
        await self.wait_answering()
        if self.settings.workers is not None:
            await self.process.wait_ready()  # starts the workers once the main process answers

    def signal(self, sig: int) -> None:
        """The main process and its workers, as a homeserver restart takes them all."""
        self.process.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int | None:
        return await _wait_exit(self.process.all_exited, timeout)

    async def wait_answering(self, timeout: float = 90) -> None:
        """Answering = /_matrix/client/versions says 200 (polled every 20 ms)."""
        deadline = time.monotonic() + timeout
        url = self.url + "/_matrix/client/versions"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                code = self.process.exit_code()
                if code is not None:
                    raise RuntimeError(f"Synapse exited with {code}; log:\n{self.log_tail()}")
                try:
                    async with http.get(url) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.02)
        raise RuntimeError(f"Synapse did not answer within {timeout:.0f}s; log:\n{self.log_tail()}")

    async def stop(self) -> None:
        await self.process.stop_async()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)


class SynapseWorker:
    """One worker of a homeserver in worker mode (an event persister), signalled and started
    again on its own, the main process and the other workers running on."""

    def __init__(self, homeserver: Homeserver, name: str) -> None:
        self.homeserver = homeserver
        self.name = name

    def signal(self, sig: int) -> None:
        os.kill(self.homeserver.process.worker_pids[self.name], sig)

    async def wait_exit(self, timeout: float) -> int | None:
        process = self.homeserver.process
        return await _wait_exit(lambda: process.worker_exit_code(self.name), timeout)

    async def start(self) -> None:
        await self.homeserver.process.restart_worker(self.name)


def federated_pair(
    a: Homeserver, b: Homeserver, a_link: Proxy, b_link: Proxy, tls_dir: Path
) -> None:
    """Make ``a`` and ``b`` federate with each other only, each reached by the other through
    its link proxy: a homeserver's server name is its proxy's address, its federation listener
    a port of its own behind it. Start the proxies first (their ports are the server names)."""
    settings = federating([a.settings, b.settings], tls_dir)
    for server, proxied, link in zip((a, b), settings, (a_link, b_link), strict=True):
        assert proxied.federation is not None
        assert server.settings.server_name == server_name_for(link.port)
        federation = dataclasses.replace(proxied.federation, port=link.upstream_port)
        server.reconfigure(dataclasses.replace(proxied, federation=federation))


def write_node_config(
    path: Path,
    hs_url: str,
    as_port: int,
    stub_port: int,
    db_url: str,
    tokens: Tokens,
    domain: str = DOMAIN,
    server_name: str = SERVER_NAME,
    peers: dict[str, str] | None = None,
    persisters: int = 0,
    lanes: int | None = None,
    cluster: dict[str, Any] | None = None,
) -> None:
    """``peers``: the other domains and their homeservers' server names; ``persisters``: the
    homeserver's event persisters (worker mode); ``lanes``: by default one per persister;
    ``cluster``: settings for a domain on several node processes (each names itself)."""
    federation = {d: {"server_name": name} for d, name in (peers or {}).items()}
    dump_private_yaml(
        {
            "domain": domain,
            "homeserver": {
                "url": hs_url,
                "server_name": server_name,
                "event_persisters": max(1, persisters),
            },
            "routing": {"lanes": lanes or max(1, persisters)},
            "appservice": {
                "as_token": tokens.as_token,
                "hs_token": tokens.hs_token,
                "listen": {"host": "127.0.0.1", "port": as_port},
            },
            "stub": {
                "listen": {"host": "127.0.0.1", "port": stub_port},
                # Fixed, so that session tokens stay valid across the node's restarts.
                "session_secret": secrets.token_urlsafe(24),
            },
            "database": {"url": db_url},
            "federation": {"peers": federation},
            "dashboard": {"worker": False},
            "logging": {"level": "INFO", "format": "json"},
            **({"cluster": cluster} if cluster else {}),
        },
        path,
    )


class NodeProcess:
    """`rethink-mn run` as a child process (the worktree's code: ``python -m adapter.cli``)."""

    def __init__(
        self, config: Path, log: Path, as_port: int, stub_port: int, process: str | None = None
    ) -> None:
        self.config = config
        self.log = log
        # Its name among the domain's node processes, when it is one of several.
        self.process = process
        self.as_port = as_port
        self.stub_port = stub_port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._started_at_byte = 0  # where its log of the latest start begins

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "adapter.cli", "-c", str(self.config), *args]

    async def migrate(self) -> None:
        proc = await asyncio.to_thread(
            subprocess.run,
            self._cli("db", "upgrade"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"db upgrade failed: {(proc.stderr or proc.stdout)[-2000:]}")

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- start #{self.starts} at {time.time():.3f}\n".encode())
            log.flush()
            self._started_at_byte = log.tell()
            self.proc = subprocess.Popen(
                self._cli("run", *(("--process", self.process) if self.process else ())),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        return await _wait_exit(self.proc.poll, timeout)

    async def wait_answering(self, timeout: float = 60) -> None:
        """Answering = the stub listener serves the stub (what runtimes need: it opens last,
        after the appservice listener and the database). Not /health: that also probes the
        homeserver, which lags under load. One of several processes shares its ports with the
        others, which would answer for it: its own log saying it started, then (written once
        its stub listener is open)."""
        assert self.proc is not None
        if self.process is not None:
            await self._wait_logged(STARTED, timeout)
            return
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.stub_port}/stub/protostub.js"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the node exited with {self.proc.returncode}; log:\n{self.log_tail()}"
                    )
                try:
                    async with http.get(url) as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.02)
        raise RuntimeError(
            f"the node did not answer within {timeout:.0f}s; log:\n{self.log_tail()}"
        )

    async def _wait_logged(self, text: str, timeout: float) -> None:
        """Until the log of the latest start holds ``text`` (polled every 20 ms)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        needle = text.encode()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the node exited with {self.proc.returncode}; log:\n{self.log_tail()}"
                )
            with self.log.open("rb") as log:
                log.seek(self._started_at_byte)
                if needle in log.read():
                    return
            await asyncio.sleep(0.02)
        raise RuntimeError(
            f"the node did not log {text!r} within {timeout:.0f}s; log:\n{self.log_tail()}"
        )

    async def wait_healthy(self, timeout: float = 60) -> None:
        """/health says 200: homeserver and database reachable (before the stream starts)."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                try:
                    async with http.get(f"http://127.0.0.1:{self.as_port}/health") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the node was not healthy within {timeout:.0f}s")

    async def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        if await self.wait_exit(30) is None:
            self.proc.kill()
            await self.wait_exit(5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])


# -- the proxy -----------------------------------------------------------------------------------


class Proxy:
    """A TCP proxy: runtimes connect here for the node's stub listener (and the node here for
    PostgreSQL in the database outage).

    ``cut()`` aborts every connection at once (both sides see the socket die, no WebSocket close
    frame: a network loss); while ``refusing`` new connections are accepted and aborted at once;
    while ``blackhole`` everything read is discarded and nothing closed (a link that died without
    either end noticing yet); while ``stalled`` nothing is read, forwarded or connected, and
    what the ends send waits in the kernel's buffers until the stall ends (a link that drops
    every packet for a while, TCP retransmitting until it is back).
    A connection whose other side closes or fails is aborted as a whole."""

    def __init__(
        self, upstream_port: int, upstream_host: str = "127.0.0.1", listen_port: int = 0
    ) -> None:
        self.upstream_port = upstream_port
        self.upstream_host = upstream_host
        self.port = listen_port
        self.refusing = False
        self.blackhole = False  # forward nothing, in either direction, without closing anything
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.discarded_bytes = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0
        self.refused = 0
        self.upstream_failed = 0
        self.cut_connections = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    @stalled.setter
    def stalled(self, value: bool) -> None:
        if value:
            self._flowing.clear()
        else:
            self._flowing.set()

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    def cut(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            self._abort(pair)
        self.cut_connections += len(pairs)
        return len(pairs)

    def _abort(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        self._pairs.discard(pair)
        for writer in pair:
            writer.transport.abort()

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._flowing.wait()
        if self.refusing:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            self.upstream_failed += 1
            writer.transport.abort()
            return
        if self.refusing:  # a cut began while we were connecting
            self.refused += 1
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self.accepted += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while (await self._flowing.wait()) and (data := await src.read(65536)):
                await self._flowing.wait()  # read as the stall began: held until it ends
                if self.blackhole:
                    self.discarded_bytes += len(data)
                    continue
                if dst.is_closing():
                    break  # cut, or the other direction ended
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError, RuntimeError):
            # A reset on one side resets the other (uvloop raises RuntimeError for a write to a
            # transport closed meanwhile).
            self._abort(pair)
        else:
            # A clean end on one side: close both, after what is buffered (a close frame).
            self._pairs.discard(pair)
            for writer in pair:
                writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)


class HomeserverProxy:
    """An HTTP proxy in front of Synapse's client API, for the node's requests. While
    ``failing`` is a status, every request is answered with it, as an overloaded or broken
    homeserver answers (429 with ``retry_after_ms``, or 500), and never reaches Synapse.
    Synapse's pushes to the node do not pass here."""

    # Hop-by-hop, or recomputed by aiohttp for the body it sends on.
    _SKIP = frozenset({"host", "connection", "content-length", "transfer-encoding", "keep-alive"})

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.failing: int | None = None
        self.failed = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        # No decompression: bodies go on byte for byte with their Content-Encoding.
        self._http = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_read=120)
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        status = self.failing
        if status is not None:
            self.failed += 1
            if status == 429:
                body = {
                    "errcode": "M_LIMIT_EXCEEDED",
                    "error": "Too Many Requests",
                    "retry_after_ms": 500,
                }
            else:
                body = {"errcode": "M_UNKNOWN", "error": "Internal server error"}
            return web.json_response(body, status=status)
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in self._SKIP}
        async with self._http.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
        ) as upstream:
            answer = {k: v for k, v in upstream.headers.items() if k.lower() not in self._SKIP}
            return web.Response(status=upstream.status, body=await upstream.read(), headers=answer)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

"""A local Synapse for `rethink-mn up` and the test suite: installed from PyPI into its own
virtual environment, configured for loopback only, supervised as a child process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import fcntl
import os
import random
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from ruamel.yaml import YAML

from ..private_files import (
    PRIVATE_UMASK,
    dump_private_yaml,
    open_private_append,
    private_dir,
    write_private,
)
from .ip_blocklist import blocklist_except
from .workers import Worker, WorkerLayout

SYNAPSE_VERSION = "1.163.2"
# The whole dependency tree of that Synapse, pinned, so every install is the same.
CONSTRAINTS_FILE = Path(__file__).with_name("synapse-constraints.txt")


class LocalStackError(Exception):
    """The local homeserver could not be installed, configured or started."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rethink-mn"


def synapse_venv_path(cache_dir: Path | None = None) -> Path:
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    return (cache_dir or default_cache_dir()) / f"synapse-{SYNAPSE_VERSION}-{py}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_synapse_installed(
    venv: Path | None = None, log: Callable[[str], None] = lambda _msg: None
) -> Path:
    """Install the pinned Synapse into ``venv`` unless already there; returns its python.

    Safe to call from several processes at once (a file lock serialises them). The marker file
    is written last, so an install interrupted half-way is thrown away and redone.
    """
    venv = venv or synapse_venv_path()
    python = venv / "bin" / "python"
    # Named after what the install holds: a venv from before psycopg2 and the Redis client (for
    # workers) were added is redone once.
    marker = venv / ".rethink-mn-installed-with-postgres-redis"
    if marker.exists():
        return python
    with _file_lock(venv.with_name(venv.name + ".lock")):
        if marker.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        log(f"installing Synapse {SYNAPSE_VERSION} from PyPI into {venv} (once; about a minute)")
        _run([sys.executable, "-m", "venv", str(venv)], "create the Synapse virtualenv")
        constraints = ["-c", str(CONSTRAINTS_FILE)] if CONSTRAINTS_FILE.exists() else []
        _run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                # `redis`: workers replicate over Redis.
                f"matrix-synapse[redis]=={SYNAPSE_VERSION}",
                # Synapse's PostgreSQL driver, prebuilt (the `postgres` extra would compile it).
                "psycopg2-binary",
                *constraints,
            ],
            "pip install Synapse",
        )
        marker.write_text(SYNAPSE_VERSION + "\n")
    return python


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise LocalStackError(f"could not {what} (exit {proc.returncode}):\n{tail}")


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports this process already handed out, so two listeners planned together never share one.
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port to listen on that stays ours across restarts of its listener.

    A port the kernel picks (bind to 0) comes from the ephemeral range, which every outgoing
    connection on the machine also draws from: once a killed node's listener lets it go, a client
    socket of anything else may take it, and the restarted node (whose address Synapse knows) can
    no longer bind it. Ports below that range are never given to outgoing connections."""
    floor = _ephemeral_floor()
    low = max(1024, floor - 12000)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, floor)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port on {host} between {low} and {floor}")


@dataclass(frozen=True)
class FederationSettings:
    """A TLS federation listener and the peers this homeserver federates with (no others)."""

    port: int
    certificate: Path
    private_key: Path
    # The CA(s) the peers' certificates are checked against, instead of the system's.
    ca_certificates: tuple[Path, ...]
    peers: tuple[str, ...]
    # Synapse's default blocklist forbids outbound federation to loopback; the peers' addresses
    # are let through, no other.
    peer_addresses: tuple[str, ...] = ("127.0.0.1",)
    # Synapse waits up to a minute between retries of a federation request and backs off an
    # unreachable server for 10 minutes at first, up to a week; a local peer that was restarted
    # is reached again within seconds instead. A request's own retries (a transaction sent
    # while the peer is down) come at most `request_retry_max` apart: nothing wakes them early,
    # and at 10 s apart delivery resumed more than 5 s after a restarted peer answered again.
    retry_min: str = "1s"
    retry_max: str = "10s"
    request_retry_max: str = "2s"


@dataclass(frozen=True)
class SynapseSettings:
    data_dir: Path
    server_name: str
    port: int
    registration_file: Path
    host: str = "127.0.0.1"
    max_upload_size: str = "200M"
    # Further appservices on the same homeserver (the benchmark registers a baseline one).
    extra_registrations: tuple[Path, ...] = ()
    # Synapse's own database: SQLite in the data directory, or this PostgreSQL database
    # (postgresql://user@host:port/name, created with the C collation Synapse requires).
    database_url: str | None = None
    # None: no federation at all, as for a single domain.
    federation: FederationSettings | None = None
    # None: one process does everything. Workers need the PostgreSQL database and Redis.
    workers: WorkerLayout | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ports(self) -> tuple[int, ...]:
        """The client port, then the federation port (with federation), then the workers'."""
        federation = () if self.federation is None else (self.federation.port,)
        layout = self.workers
        workers = () if layout is None else (layout.main_port, *(w.port for w in layout.workers))
        return (self.port, *federation, *workers)

    @property
    def config_file(self) -> Path:
        return self.data_dir / "homeserver.yaml"

    @property
    def signing_key_file(self) -> Path:
        return self.data_dir / "signing.key"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "homeserver.log"

    def worker_config_file(self, worker: Worker) -> Path:
        return self.data_dir / "workers" / f"{worker.name}.yaml"

    def worker_log_file(self, worker: Worker) -> Path:
        return self.data_dir / "workers" / f"{worker.name}.log"


def write_homeserver_config(settings: SynapseSettings) -> Path:
    """A homeserver for one machine: loopback client listener, SQLite (or the PostgreSQL database
    the settings name), no stats reporting, no key servers to contact, our appservice registered.
    No federation unless the settings ask for it, and then only with the peers they name; one
    process unless they name workers (whose own files go to `<data>/workers/`).

    Secrets generated on the first write are kept on later writes, so sessions and the signing
    key stay valid across restarts of the local stack. The data directory is 0700 and the
    config, which holds them, 0600 from the moment it is written."""
    data = settings.data_dir.resolve()
    private_dir(data)
    private_dir(data / "media_store")
    previous: dict[str, Any] = {}
    if settings.config_file.exists():
        previous = dict(YAML(typ="safe", pure=True).load(settings.config_file.read_text()) or {})

    def secret(name: str) -> str:
        return str(previous.get(name) or secrets.token_urlsafe(32))

    log_config = _write_log_config(data / "log.config", settings.log_file)
    config = {
        "server_name": settings.server_name,
        "public_baseurl": settings.url + "/",
        "pid_file": str(data / "homeserver.pid"),
        "listeners": [
            {
                "port": settings.port,
                "bind_addresses": [settings.host],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": _database(settings, data),
        "log_config": str(log_config),
        "media_store_path": str(data / "media_store"),
        "max_upload_size": settings.max_upload_size,
        "signing_key_path": str(settings.signing_key_file.resolve()),
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "enable_registration": False,
        "url_preview_enabled": False,
        # Rooms the node created and left (placing lanes on event persisters) are purged.
        "forgotten_room_retention_period": "1d",
        "presence": {"enabled": False},
        "federation_domain_whitelist": [],
        "macaroon_secret_key": secret("macaroon_secret_key"),
        "form_secret": secret("form_secret"),
        "registration_shared_secret": secret("registration_shared_secret"),
        "app_service_config_files": [
            str(p.resolve()) for p in (settings.registration_file, *settings.extra_registrations)
        ],
    }
    if settings.federation is not None:
        config = _with_federation(config, settings.host, settings.federation)
    if settings.workers is not None:
        config = _with_workers(config, settings, settings.workers)
        # Without it the replication endpoints (the main process's and every worker's) take
        # requests from anyone on the machine.
        config["worker_replication_secret"] = secret("worker_replication_secret")
    dump_private_yaml(config, settings.config_file)
    return settings.config_file


def _write_log_config(path: Path, log_file: Path) -> Path:
    dump_private_yaml(
        {
            "version": 1,
            "formatters": {"precise": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
            "handlers": {
                "file": {
                    "class": "logging.FileHandler",
                    "formatter": "precise",
                    "filename": str(log_file.resolve()),
                }
            },
            "root": {"level": "WARNING", "handlers": ["file"]},
            "loggers": {
                "synapse.app": {"level": "INFO"},
                "synapse.storage.SQL": {"level": "WARNING"},
                # Quiet while all is well, and what explains a push or a peer that went silent:
                # the appservice's recovery (marked down, retried, recovered) and a
                # destination's back-off and catch-up.
                "synapse.appservice.scheduler": {"level": "INFO"},
                "synapse.federation.sender.per_destination_queue": {"level": "INFO"},
            },
            "disable_existing_loggers": False,
        },
        path,
    )
    return path


def _with_workers(
    config: dict[str, Any], settings: SynapseSettings, workers: WorkerLayout
) -> dict[str, Any]:
    if settings.database_url is None:
        raise LocalStackError(
            "Synapse's workers share one PostgreSQL database: give the homeserver a database URL"
        )
    private_dir(settings.data_dir / "workers")
    for worker in workers.workers:
        log_config = _write_log_config(
            settings.data_dir / "workers" / f"{worker.name}.log.config",
            settings.worker_log_file(worker),
        )
        dump_private_yaml(
            workers.worker_config(worker, settings.host, log_config.resolve()),
            settings.worker_config_file(worker),
        )
    return {
        **config,
        **workers.shared_config(settings.host),
        "listeners": [*config["listeners"], workers.main_listener(settings.host)],
    }


def _with_federation(
    config: dict[str, Any], host: str, federation: FederationSettings
) -> dict[str, Any]:
    listener = {
        "port": federation.port,
        "bind_addresses": [host],
        "type": "http",
        "tls": True,
        "x_forwarded": False,
        "resources": [{"names": ["federation", "keys"], "compress": False}],
    }
    return {
        **config,
        "listeners": [*config["listeners"], listener],
        "tls_certificate_path": str(federation.certificate.resolve()),
        "tls_private_key_path": str(federation.private_key.resolve()),
        "federation_domain_whitelist": list(federation.peers),
        "federation_verify_certificates": True,
        "federation_custom_ca_list": [str(p.resolve()) for p in federation.ca_certificates],
        # Also read by Synapse's other outbound clients (push, identity servers), none of which
        # a local stack configures.
        "ip_range_blacklist": blocklist_except(federation.peer_addresses),
        "federation": {
            "max_long_retry_delay": federation.request_retry_max,
            "destination_min_retry_interval": federation.retry_min,
            "destination_max_retry_interval": federation.retry_max,
        },
    }


def _database(settings: SynapseSettings, data: Path) -> dict[str, Any]:
    if settings.database_url is None:
        return {"name": "sqlite3", "args": {"database": str(data / "homeserver.db")}}
    url = urlsplit(settings.database_url)
    return {
        "name": "psycopg2",
        "args": {
            "user": url.username or "postgres",
            "password": url.password or "",
            "host": url.hostname or "127.0.0.1",
            "port": url.port or 5432,
            "database": url.path.lstrip("/"),
            "cp_min": 5,
            "cp_max": 10,
        },
    }


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if we die, even by SIGKILL, so no Synapse is left orphaned.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class SynapseProcess:
    """A running Synapse: its main process and, in worker mode, its workers, started and stopped
    together."""

    def __init__(self, python: Path, settings: SynapseSettings) -> None:
        self.python = python
        self.settings = settings
        self._proc: subprocess.Popen[bytes] | None = None
        self._workers: dict[str, subprocess.Popen[bytes]] = {}

    def generate_keys(self) -> None:
        """The homeserver's signing key, unless it has one: what `--generate-keys` writes (an
        ed25519 seed, unpadded base64, under a random key id), without the seconds a Synapse
        process takes to import. Owner-only, as every secret of the stack."""
        path = self.settings.signing_key_file
        if path.exists():
            return
        key_id = "a_" + "".join(secrets.choice(string.ascii_letters) for _ in range(4))
        seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
        write_private(path, f"ed25519 {key_id} {seed}\n")

    def start(self) -> None:
        for port in self.settings.ports:
            if not port_is_free(self.settings.host, port):
                raise LocalStackError(
                    f"port {self.settings.host}:{port} is already in use: stop what holds it "
                    "or choose another homeserver port"
                )
        still = [name for name, proc in self._workers.items() if proc.poll() is None]
        if still:
            raise LocalStackError(
                f"Synapse's workers {', '.join(still)} still run: stop them first"
            )
        self._workers = {}
        self._proc = self._spawn(
            ["synapse.app.homeserver", "-c", str(self.settings.config_file)],
            self.settings.log_file,
        )

    def _start_workers(self) -> None:
        layout = self.settings.workers
        for worker in layout.workers if layout else ():
            self._start_worker(worker)

    def _start_worker(self, worker: Worker) -> None:
        self._workers[worker.name] = self._spawn(
            [
                "synapse.app.generic_worker",
                "-c",
                str(self.settings.config_file),
                "-c",
                str(self.settings.worker_config_file(worker)),
            ],
            self.settings.worker_log_file(worker),
        )

    def worker(self, name: str) -> Worker:
        layout = self.settings.workers
        found = next((w for w in (layout.workers if layout else ()) if w.name == name), None)
        if found is None:
            raise LocalStackError(f"this homeserver has no worker {name!r}")
        return found

    async def restart_worker(self, name: str, timeout: float = 60.0) -> None:
        """Start worker ``name`` again (it has exited) and wait until it is healthy."""
        worker = self.worker(name)
        if self._workers[name].poll() is None:
            raise LocalStackError(f"worker {name} is still running")
        self._start_worker(worker)
        url = f"http://{self.settings.host}:{worker.port}/health"
        async with aiohttp.ClientSession() as session:
            await self._wait_for(session, url, time.monotonic() + timeout, name)

    def _spawn(self, module_and_args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
        # Synapse's log may quote tokens: owner-only, like everything Synapse itself creates in
        # its data directory (its database, media, pid file), which the umask makes so.
        log = open_private_append(log_file)
        try:
            return subprocess.Popen(
                [str(self.python), "-m", *module_and_args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Own session: a Ctrl-C in the terminal reaches only us, and we stop Synapse in
                # order.
                start_new_session=True,
                preexec_fn=_die_with_parent,
                umask=PRIVATE_UMASK,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        """The main process's."""
        return self._proc.pid if self._proc else None

    @property
    def worker_pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._workers.items()}

    def worker_exit_code(self, name: str) -> int | None:
        return self._workers[name].poll()

    @property
    def all_pids(self) -> tuple[int, ...]:
        """The main process's, then the workers'."""
        return tuple(proc.pid for _name, proc in self._processes())

    def exit_code(self) -> int | None:
        """The exit code of the main process, or of a worker, that has exited; None while all
        run."""
        for _name, proc in self._processes():
            code = proc.poll()
            if code is not None:
                return code
        return None

    def send_signal(self, sig: int) -> None:
        """Signal every process that runs (a homeserver restart takes its workers too)."""
        for _name, proc in self._processes():
            if proc.poll() is None:
                proc.send_signal(sig)

    def all_exited(self) -> int | None:
        """The main process's exit code once every process has exited; None before."""
        if any(proc.poll() is None for _name, proc in self._processes()):
            return None
        return self._proc.poll() if self._proc else None

    def _processes(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        main = [("main", self._proc)] if self._proc else []
        return [*main, *self._workers.items()]

    def _exited(self) -> str | None:
        return next((name for name, proc in self._processes() if proc.poll() is not None), None)

    async def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the client API answers; in worker mode, then starts the workers (a worker
        refuses a database the main process has not prepared yet) and waits until every one's
        listener says it is healthy."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            await self._wait_for(session, self.settings.url + "/_matrix/client/versions", deadline)
            layout = self.settings.workers
            if layout is None:
                return
            if not self._workers:
                self._start_workers()
            for worker in layout.workers:
                await self._wait_for(
                    session,
                    f"http://{self.settings.host}:{worker.port}/health",
                    deadline,
                    worker.name,
                )

    async def _wait_for(
        self, session: aiohttp.ClientSession, url: str, deadline: float, process: str = "main"
    ) -> None:
        while not await self._answers(session, url):
            exited = self._exited()
            if exited is not None:
                raise LocalStackError(
                    f"Synapse ({exited}) exited with code {self.exit_code()} while starting; "
                    f"last log lines:\n{self.log_tail(process=exited)}"
                )
            if time.monotonic() > deadline:
                raise LocalStackError(
                    f"Synapse ({process}) did not answer on {url} in time; last log lines:\n"
                    f"{self.log_tail(process=process)}"
                )
            await asyncio.sleep(0.2)

    @staticmethod
    async def _answers(session: aiohttp.ClientSession, url: str) -> bool:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def log_tail(self, lines: int = 20, process: str | None = None) -> str:
        """The end of the log of ``process`` (a worker's name), by default of the first process
        that exited, else of the main process."""
        name = process or self._exited() or "main"
        log_file = self.settings.log_file
        layout = self.settings.workers
        for worker in layout.workers if layout else ():
            if worker.name == name:
                log_file = self.settings.worker_log_file(worker)
        try:
            text = log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to every process that runs, then wait for each (SIGKILL past ``timeout``)."""
        running = [proc for _name, proc in self._processes() if proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)

    async def stop_async(self, timeout: float = 15.0) -> None:
        await asyncio.to_thread(self.stop, timeout)

"""Shared fixtures: a real Synapse for the whole session, nodes wired to it, real databases."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import psycopg
import pytest
import pytest_asyncio
import structlog
import uvloop

from adapter.config import NodeConfig, parse_config
from adapter.localstack.federation import federating, server_name_for, start_homeservers
from adapter.localstack.synapse import (
    SynapseProcess,
    SynapseSettings,
    ensure_synapse_installed,
    free_port,
    write_homeserver_config,
)
from adapter.node import Node
from adapter.private_files import dump_private_yaml
from adapter.storage import migrate
from appservice.registration import build_registration

from .support.fuzzing import CORPUS, SEED_VARIABLE, fuzz_seed
from .support.xdist_schedule import TogetherByPath, misplaced

# The node's processes log through adapter.observability.configure_logging; a test process
# keeps structlog's defaults, whose rich tracebacks take ~0.3 s each, on the event loop the
# nodes under test share: plain ones here.
structlog.configure(
    processors=[
        *structlog.get_config()["processors"][:-1],
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
    ]
)

SERVER_NAME = "mn.test"
# The appservice id both the `homeserver` and `federation` fixtures register.
APPSERVICE_ID = "rethink-mn"
PG_DSN = os.environ.get("RETHINK_MN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
# The machine's Redis, which Synapse's workers replicate over.
REDIS = ("127.0.0.1", 6379)


def missing_service(reason: str) -> NoReturn:
    """A service a test needs is not there: skipped on a developer's machine, a failure in CI
    (the machines CI runs on always have it: a skip there hides a defect)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run these tests")
    pytest.skip(f"{reason}; skipped")


@pytest.fixture(scope="session")
def worker_services() -> None:
    """PostgreSQL and Redis, which Synapse in worker mode needs, answer."""
    try:
        socket.create_connection(REDIS, timeout=3).close()
    except OSError as exc:
        missing_service(f"Redis not reachable at {REDIS[0]}:{REDIS[1]} ({exc})")
    try:
        psycopg.connect(PG_DSN, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        missing_service(f"PostgreSQL not reachable at {PG_DSN} ({exc})")


def pytest_configure(config: pytest.Config) -> None:
    """The fuzzers' seed: the controller's, on every xdist worker too."""
    worker = getattr(config, "workerinput", None)
    if worker is not None and "fuzz_seed" in worker:
        os.environ[SEED_VARIABLE] = worker["fuzz_seed"]
    fuzz_seed()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput["fuzz_seed"] = str(fuzz_seed())


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"fuzz seed: {fuzz_seed()} ({SEED_VARIABLE}={fuzz_seed()} draws the same examples again; "
        f"the kept ones in {CORPUS.relative_to(CORPUS.parents[1])} are replayed first)"
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> TogetherByPath | None:
    """`--dist loadgroup` (as `make test` runs): tests that share session state run together, on
    one worker (tests/support/xdist_schedule.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return TogetherByPath(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    problems = [
        why
        for item in items
        if (why := misplaced(item.nodeid, list(getattr(item, "fixturenames", ())))) is not None
    ]
    if problems:
        raise pytest.UsageError("\n".join(problems))


# The homeservers the session fixtures started, by name: a failed test that used them shows the
# end of their logs (what a flaky federation or push did is in there, and CI keeps nothing else).
HOMESERVERS = pytest.StashKey[dict[str, dict[str, SynapseProcess]]]()
HOMESERVER_LOG_LINES = 60


def _started(request: pytest.FixtureRequest, name: str, process: SynapseProcess) -> None:
    by_fixture = request.config.stash.setdefault(HOMESERVERS, {})
    by_fixture.setdefault(request.fixturename or "", {})[name] = process


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        used = getattr(item, "fixturenames", ())
        for fixture, processes in item.config.stash.get(HOMESERVERS, {}).items():
            if fixture not in used:
                continue
            for name, process in processes.items():
                tail = process.log_tail(HOMESERVER_LOG_LINES)
                report.sections.append((f"homeserver {name}: the end of its log", tail))
    return report


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """The tests run on the event loop the node runs on in production."""
    return {"uvloop": uvloop.new_event_loop}


@dataclass
class Homeserver:
    url: str
    server_name: str
    as_token: str
    hs_token: str
    appservice_port: int
    process: SynapseProcess

    def node_config(self, database_url: str, **overrides: Any) -> NodeConfig:
        raw: dict[str, Any] = {
            "domain": "mn.test",
            "homeserver": {"url": self.url, "server_name": self.server_name},
            "appservice": {
                "as_token": self.as_token,
                "hs_token": self.hs_token,
                "listen": {"host": "127.0.0.1", "port": self.appservice_port},
            },
            # The test runtimes connect NoMatrix-style (v2 without hello) unless a test says
            # otherwise; tests of `refuse` set it.
            "stub": {"listen": {"host": "127.0.0.1", "port": 0}, "tokenless_sessions": "allow"},
            "database": {"url": database_url},
            # Integration tests of the dashboard start its worker themselves.
            "dashboard": {"worker": False},
        }
        for dotted, value in overrides.items():
            node = raw
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return parse_config(raw, "test", environ={})


@pytest.fixture(scope="session")
def synapse_python() -> Path:
    """The pinned Synapse, installed once into a cached virtualenv (not again on later runs)."""
    return ensure_synapse_installed(log=lambda msg: print(f"[synapse] {msg}"))


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def homeserver(
    synapse_python: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> AsyncIterator[Homeserver]:
    data_dir = tmp_path_factory.mktemp("synapse")
    as_port = free_port()
    registration = data_dir / "registration.yaml"
    as_token, hs_token = _write_registration(registration, as_port, SERVER_NAME)
    settings = SynapseSettings(
        data_dir=data_dir, server_name=SERVER_NAME, port=free_port(), registration_file=registration
    )
    write_homeserver_config(settings)
    process = SynapseProcess(synapse_python, settings)
    process.generate_keys()
    process.start()
    _started(request, "mn.test", process)
    try:
        await process.wait_ready()
        yield Homeserver(settings.url, SERVER_NAME, as_token, hs_token, as_port, process)
    finally:
        await process.stop_async()


# -- two domains whose homeservers federate -------------------------------------------------------


@dataclass
class FederatedHomeserver(Homeserver):
    """One domain of the `federation` fixture: its homeserver's server name is its federation
    address (`127.0.0.1:<federation_port>`)."""

    federation_port: int
    domain: str

    @property
    def bot(self) -> str:
        return f"@_rethink_bot:{self.server_name}"

    def node_config(self, database_url: str, **overrides: Any) -> NodeConfig:
        return super().node_config(database_url, **{"domain": self.domain, **overrides})


@dataclass
class Federation:
    a: FederatedHomeserver
    b: FederatedHomeserver
    # The local CA both homeservers trust for federation.
    ca_certificate: Path


def _write_registration(path: Path, as_port: int, server_name: str) -> tuple[str, str]:
    as_token, hs_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    dump_private_yaml(
        build_registration(
            appservice_id=APPSERVICE_ID,
            url=f"http://127.0.0.1:{as_port}",
            as_token=as_token,
            hs_token=hs_token,
            sender_localpart="_rethink_bot",
            user_prefix="_rethink_",
            alias_prefix="_rethink_",
            server_name=server_name,
        ),
        path,
    )
    return as_token, hs_token


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def federation(
    synapse_python: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> AsyncIterator[Federation]:
    """Two homeservers on loopback federating with each other (and no one else), each with the
    node's registration, for domains `a.mn.test` and `b.mn.test`."""
    root = tmp_path_factory.mktemp("federation")
    plain, appservices = [], []
    for side in ("a", "b"):
        (root / side).mkdir()
        as_port, server_name = free_port(), server_name_for(free_port())
        registration = root / side / "registration.yaml"
        appservices.append((as_port, *_write_registration(registration, as_port, server_name)))
        plain.append(SynapseSettings(root / side, server_name, free_port(), registration))
    group = federating(plain, root / "tls")
    processes = await start_homeservers(synapse_python, group)
    for side, process in zip(("a.mn.test", "b.mn.test"), processes, strict=True):
        _started(request, side, process)
    try:
        a, b = (
            FederatedHomeserver(
                url=process.settings.url,
                server_name=process.settings.server_name,
                as_token=as_token,
                hs_token=hs_token,
                appservice_port=as_port,
                process=process,
                federation_port=process.settings.ports[1],
                domain=f"{side}.mn.test",
            )
            for side, process, (as_port, as_token, hs_token) in zip(
                "ab", processes, appservices, strict=True
            )
        )
        assert group[0].federation is not None
        yield Federation(a, b, group[0].federation.ca_certificates[0])
    finally:
        for process in processes:
            await process.stop_async()


# -- databases ---------------------------------------------------------------------------------


@dataclass
class Databases:
    tmp: Path
    created_pg: list[str] = field(default_factory=list)

    def sqlite(self) -> str:
        return f"sqlite:///{self.tmp / f'node-{uuid.uuid4().hex[:8]}.db'}"

    async def migrated_sqlite(self) -> str:
        """A fresh SQLite database with the node's schema."""
        url = self.sqlite()
        await migrate.upgrade(url)
        return url

    async def postgres(self) -> str:
        """A fresh, empty PostgreSQL database (dropped after the test)."""
        name = f"rethink_test_{uuid.uuid4().hex[:10]}"
        try:
            conn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            missing_service(f"PostgreSQL not reachable at {PG_DSN} ({exc})")
        async with conn:
            await conn.execute(f'CREATE DATABASE "{name}"')
        self.created_pg.append(name)
        return PG_DSN.rsplit("/", 1)[0] + f"/{name}"

    async def drop_all(self) -> None:
        if not self.created_pg:
            return
        conn = await psycopg.AsyncConnection.connect(PG_DSN, autocommit=True, connect_timeout=5)
        async with conn:
            for name in self.created_pg:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest_asyncio.fixture(loop_scope="session")
async def databases(tmp_path: Path) -> AsyncIterator[Databases]:
    dbs = Databases(tmp_path)
    yield dbs
    await dbs.drop_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(databases: Databases, db_backend: str) -> str:
    url = databases.sqlite() if db_backend == "sqlite" else await databases.postgres()
    await migrate.upgrade(url)
    return url


# -- nodes -------------------------------------------------------------------------------------

NodeFactory = Callable[..., Awaitable[Node]]


@pytest_asyncio.fixture(loop_scope="session")
async def start_node(homeserver: Homeserver, databases: Databases) -> AsyncIterator[NodeFactory]:
    """Start nodes against the session's homeserver; every node is stopped after the test.

    Only one node can serve the appservice port at a time (the homeserver pushes to it), so a
    test restarting "the node" stops the old one before starting the new one. The nodes stop
    before the test's databases are dropped (this fixture depends on theirs): a node that
    lost its database mid-stop would retry its writes for seconds."""
    nodes: list[Node] = []

    async def start(database_url: str, **overrides: Any) -> Node:
        node = Node(homeserver.node_config(database_url, **overrides))
        await node.start()
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        await node.stop()


@pytest.fixture
def chromium() -> Iterator[str]:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.skip("Debian's chromium is not installed (the test setup installs it)")
    yield path

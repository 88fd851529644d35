"""The node on Synapse in worker mode: two event persisters and the appservice push on workers,
one PostgreSQL database and the machine's Redis, as `rethink-mn up --workers` runs it."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psycopg
import pytest
import pytest_asyncio

from adapter.localstack.homeserver_database import (
    drop_homeserver_database,
    ensure_homeserver_database,
)
from adapter.localstack.synapse import (
    SynapseProcess,
    SynapseSettings,
    free_port,
    write_homeserver_config,
)
from adapter.localstack.workers import WorkerLayout
from adapter.routing.rooms import persister_of

from ..conftest import PG_DSN, Homeserver, _write_registration
from ..support.runtime import PyRuntime

pytestmark = [pytest.mark.integration]
DOMAIN = "mn.test"
# Its own server name: Synapse's replication channels on Redis are named after it, and another
# worker-mode homeserver may use the same Redis.
SERVER_NAME = f"workers-{uuid.uuid4().hex[:8]}.mn.test"
PERSISTERS = 2
BATCH = "eu.rethink-project.mn.batch"


@pytest_asyncio.fixture(loop_scope="session")
async def worker_homeserver(
    synapse_python: Path, tmp_path: Path, worker_services: None
) -> AsyncIterator[tuple[Homeserver, str]]:
    """A homeserver with two event persisters and an appservice-push worker; its database URL."""
    database = await ensure_homeserver_database(
        PG_DSN.rsplit("/", 1)[0] + f"/rethink_test_hs_{uuid.uuid4().hex[:10]}"
    )
    as_port = free_port()
    registration = tmp_path / "registration.yaml"
    as_token, hs_token = _write_registration(registration, as_port, SERVER_NAME)
    settings = SynapseSettings(
        data_dir=tmp_path / "synapse",
        server_name=SERVER_NAME,
        port=free_port(),
        registration_file=registration,
        database_url=database,
        workers=WorkerLayout.plan(PERSISTERS, free_port),
    )
    write_homeserver_config(settings)
    process = SynapseProcess(synapse_python, settings)
    process.generate_keys()
    process.start()
    try:
        await process.wait_ready()
        assert set(process.worker_pids) == {"persister1", "persister2", "appservice1"}
        yield Homeserver(settings.url, SERVER_NAME, as_token, hs_token, as_port, process), database
    finally:
        await process.stop_async()
        await drop_homeserver_database(database)


async def _persisted_by(database: str) -> dict[str, set[str]]:
    """The Synapse instances that persisted each room's message batches."""
    found: dict[str, set[str]] = {}
    async with await psycopg.AsyncConnection.connect(database) as conn:
        rows = await conn.execute(
            "SELECT DISTINCT room_id, instance_name FROM events WHERE type = %s", (BATCH,)
        )
        for room_id, instance in await rows.fetchall():
            found.setdefault(room_id, set()).add(instance)
    return found


async def _transactions_pushed(node_port: int) -> float:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{node_port}/metrics") as resp,
    ):
        text = await resp.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rethink_mn_as_transactions_total{")
    )


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_lanes_spread_over_event_persisters_and_the_push_comes_from_its_worker(
    worker_homeserver: tuple[Homeserver, str], database_url: str
) -> None:
    homeserver, hs_database = worker_homeserver
    from adapter.node import Node

    node = Node(
        homeserver.node_config(
            database_url,
            **{"routing.lanes": PERSISTERS, "homeserver.event_persisters": PERSISTERS},
        )
    )
    await node.start()
    url = f"ws://127.0.0.1:{node.stub_port}/stub/connect"
    # Enough senders that both lanes (chosen by each session's random key) carry traffic: all
    # 16 in one lane has a chance of 2 in 65,536.
    senders = [await PyRuntime(url, f"runtime://{DOMAIN}/s{i}").connect() for i in range(16)]
    receiver = await PyRuntime(url, f"runtime://{DOMAIN}/r").connect()
    try:
        [to] = await receiver.allocate(DOMAIN)
        for i, sender in enumerate(senders):
            [frm] = await sender.allocate(DOMAIN)
            for n in range(5):
                await sender.send(
                    {"id": n, "type": "create", "from": frm, "to": to, "body": {"i": i, "n": n}}
                )
        got = await receiver.receive_n(16 * 5, timeout=60)
        per_sender: dict[int, list[int]] = {}
        for message in got:
            per_sender.setdefault(message["body"]["i"], []).append(message["body"]["n"])
        assert per_sender == {i: [0, 1, 2, 3, 4] for i in range(16)}

        # Each lane's room is on the persister its index names, and Synapse agrees: its events
        # were persisted there and nowhere else.
        lanes = []
        for index in range(PERSISTERS):
            _intent, room_id = await node.rooms.lane(index)
            assert persister_of(room_id, PERSISTERS) == index
            lanes.append(room_id)
        persisted = await _persisted_by(hs_database)
        assert {room: persisted[room] for room in lanes} == {
            room: {f"persister{index + 1}"} for index, room in enumerate(lanes)
        }
        # The node's own lane events come back in the push, and only the appservice worker
        # pushes: stopped, nothing comes; let go, what waited comes.
        async with asyncio.timeout(30):
            while await _transactions_pushed(node.appservice_port) == 0:
                await asyncio.sleep(0.2)
        pusher = homeserver.process.worker_pids["appservice1"]
        os.kill(pusher, signal.SIGSTOP)
        try:
            await asyncio.sleep(1.0)  # what it was pushing when stopped
            before = await _transactions_pushed(node.appservice_port)
            [frm] = await senders[0].allocate(DOMAIN)
            await senders[0].send({"id": 9, "type": "create", "from": frm, "to": to, "body": {}})
            assert (await receiver.receive(15))["id"] == 9
            await asyncio.sleep(2.0)
            assert await _transactions_pushed(node.appservice_port) == before
        finally:
            os.kill(pusher, signal.SIGCONT)
        async with asyncio.timeout(30):
            while await _transactions_pushed(node.appservice_port) == before:
                await asyncio.sleep(0.2)
    finally:
        for runtime in (*senders, receiver):
            await runtime.close()
        await node.stop()

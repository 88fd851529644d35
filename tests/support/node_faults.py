"""Faults the tests make to a node running in their own process: stopped as by SIGKILL, its
SQLite database away, its homeserver killed and started again.

A node in the tests' process cannot be sent a signal, but what a SIGKILL denies it can be
denied: every stub socket is cut without a close frame, and nothing the node holds is flushed
on the way down (no lane sent on, no acknowledgement sent, no final checkpoint written). What
it wrote before the cut is all the next start finds, as after a real kill."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from typing import Any

from adapter.localstack.synapse import LocalStackError, SynapseProcess
from adapter.node import Node


async def _nothing(*_args: Any, **_kwargs: Any) -> None:
    return None


def _skip(owner: object, step: str) -> None:
    assert callable(getattr(owner, step, None)), f"{type(owner).__name__} has no step {step}"
    setattr(owner, step, _nothing)


async def kill(node: Node) -> None:
    """Stop ``node`` as a SIGKILL would, as far as the tests' own process allows."""
    core = node.core
    endpoint = core.stub_endpoint
    for conn in list(endpoint._open):
        request = conn.ws._req
        transport = request.transport if request is not None else None
        if transport is not None:
            transport.abort()  # no close frame: the stub sees its socket die
    # Every step of a graceful stop that saves or sends what the node holds is skipped. Each
    # is replaced where the stop calls it, and must exist there: a step renamed or moved would
    # otherwise leave a graceful stop passing for a kill.
    _skip(endpoint, "stop_reading")
    _skip(core, "_flush_lanes")
    _skip(core, "_await_acknowledgements")
    _skip(core.acks, "flush")
    _skip(core.settlement, "checkpoint")
    if node.federation is not None:
        _skip(node.federation, "flush")
    if core.journal.stream is not None:
        _skip(core.journal.stream, "flush")
    await node.stop()


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _write_lock(path: str) -> sqlite3.Connection:
    # isolation_level=None: the BEGIN is ours. IMMEDIATE takes the write lock at once; the
    # node's readers go on (WAL), its writers wait out their busy timeout and then fail with
    # "database is locked", as bench/fault_stack.py's outage on SQLite.
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


class DatabaseAway:
    """Another process holds the write lock of the node's SQLite database until ``end``."""

    def __init__(self, url: str) -> None:
        self.path = sqlite_path(url)
        self._conn: sqlite3.Connection | None = None

    async def begin(self) -> None:
        self._conn = await asyncio.to_thread(_write_lock, self.path)

    async def end(self) -> None:
        if self._conn is not None:
            await asyncio.to_thread(self._conn.close)  # rolls back: nothing written
            self._conn = None


async def stop_homeserver(process: SynapseProcess, sig: signal.Signals) -> None:
    """Signal the homeserver (SIGKILL: no chance to finish anything; SIGTERM: its own
    shutdown) and wait until every process of it has exited."""
    process.send_signal(sig)
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while process.all_exited() is None:
        if loop.time() >= end:
            process.send_signal(signal.SIGKILL)
            end = loop.time() + 60
        await asyncio.sleep(0.1)


async def start_homeserver(process: SynapseProcess) -> None:
    """Start the homeserver again on its database (a no-op while it runs)."""
    if process.all_exited() is None:
        return
    # Its ports may take a moment to be free again after a kill.
    for _ in range(100):
        try:
            process.start()
            break
        except LocalStackError:
            await asyncio.sleep(0.2)
    await process.wait_ready()

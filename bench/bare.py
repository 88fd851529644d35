"""The homeserver baseline: the bare pipeline with nothing of ours in between.

A virtual user sends one event per message into a room; a minimal appservice (the project's
appservice package, with no reTHINK logic) receives the homeserver's pushes. Its figures are what
routing "one message = one event" through this Synapse costs; the node's batching is measured
against them.

Across two federating homeservers (bench/domains.py), ``federate_to(peer)`` moves the sending
into a federated room that the peer pipeline's bot (on the other homeserver) joins, and the
arrivals are the peer appservice's pushes: what "one message = one event" costs between domains.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from appservice.api import HomeserverClient
from appservice.intent import AppserviceAPI, Intent
from appservice.registration import build_registration
from appservice.server import AppserviceServer

EVENT_TYPE = "eu.rethink-project.bench.bare"


def payload(size: int) -> str:
    # Random base64, as the driver sends: no layer can compress it.
    return base64.b64encode(os.urandom(size))[:size].decode()


class _Memory:
    """Transaction ids in memory: this baseline owns no database."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    async def is_processed(self, txn_id: str) -> bool:
        return txn_id in self.seen

    async def mark_processed(self, txn_id: str, event_count: int) -> None:
        self.seen.add(txn_id)


class _NoQueries:
    async def user_exists(self, user_id: str) -> bool:
        return False

    async def alias_exists(self, alias: str) -> bool:
        return False


@dataclass
class BarePipeline:
    server_name: str
    homeserver_url: str
    port: int
    as_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    hs_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    arrivals: dict[int, float] = field(default_factory=dict)
    _wanted: int = 0
    _done: asyncio.Event = field(default_factory=asyncio.Event)
    _run: int = 0  # which measurement the events sent now belong to
    # Where the events sent here are received (federate_to): another pipeline, or this one.
    _sink: BarePipeline | None = None

    def registration(self) -> dict[str, Any]:
        return build_registration(
            appservice_id="bench-bare",
            url=f"http://127.0.0.1:{self.port}",
            as_token=self.as_token,
            hs_token=self.hs_token,
            sender_localpart="_bare_bot",
            user_prefix="_bare_",
            alias_prefix="_bare_",
            server_name=self.server_name,
            receive_ephemeral=False,
        )

    async def handle_events(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        now = time.perf_counter()
        for event in events:
            content = event.get("content")
            if (
                event.get("type") == EVENT_TYPE
                and isinstance(content, dict)
                # A homeserver far behind still pushes an earlier measurement's events.
                and content.get("run") == self._run
            ):
                self.arrivals.setdefault(int(content["seq"]), now)
        if len(self.arrivals) >= self._wanted:
            self._done.set()

    async def handle_ephemeral(self, _txn_id: str, _events: list[dict[str, Any]]) -> None:
        """None are asked for (the registration's receive_ephemeral is off)."""

    async def __aenter__(self) -> BarePipeline:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        AppserviceServer(self.hs_token, self, _Memory(), _NoQueries()).add_routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._http = aiohttp.ClientSession()
        client = HomeserverClient(self.homeserver_url, self.as_token, self._http)
        self._api = AppserviceAPI(client, self.server_name, "_bare_bot")
        self._intent: Intent = self._api.intent(self._api.user_id("_bare_sender"))
        self._room = await self._intent.create_room(
            alias_localpart=f"_bare_room_{secrets.token_hex(4)}"
        )
        return self

    async def federate_to(self, peer: BarePipeline) -> None:
        """Send from now on into a federated room joined by ``peer``'s bot, on its homeserver;
        the measurements then time until ``peer`` receives each event."""
        bot = peer._api.bot.user_id
        room = await self._intent.create_room(invite=[bot], federate=True)
        await peer._api.bot.join(room)
        self._room, self._sink = room, peer

    @property
    def _receiver(self) -> BarePipeline:
        return self._sink or self

    async def __aexit__(self, *_exc: object) -> None:
        await self._http.close()
        await self._runner.cleanup()

    def _reset(self, wanted: int) -> BarePipeline:
        receiver = self._receiver
        receiver.arrivals = {}
        receiver._wanted = wanted
        self._run = receiver._run = max(self._run, receiver._run) + 1
        receiver._done = asyncio.Event()
        return receiver

    async def _send(self, seq: int, body: str) -> float:
        started = time.perf_counter()
        await self._intent.send_event(
            self._room, EVENT_TYPE, {"seq": seq, "run": self._run, "body": body}
        )
        return started

    async def messaging(
        self, count: int, size: int, in_flight: int = 16, timeout: float = 600
    ) -> dict[str, Any]:
        """``count`` events, ``in_flight`` at a time: first send to last push received."""
        receiver = self._reset(count)
        body = payload(size)
        next_seq = iter(range(count))
        started = time.perf_counter()

        async def sender() -> None:
            for seq in next_seq:
                await self._send(seq, body)

        await asyncio.gather(*(sender() for _ in range(in_flight)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver._done.wait(), timeout)
        ended = max(receiver.arrivals.values(), default=time.perf_counter())
        return {
            "ms": (ended - started) * 1000,
            "received": len(receiver.arrivals),
            "lost": count - len(receiver.arrivals),
        }

    async def latency(
        self, count: int, rate: float, size: int = 100, drain: float = 30.0
    ) -> dict[str, Any]:
        """One event every 1/rate s; send start to push received, per event. What has not
        arrived ``drain`` seconds after the last send is lost."""
        receiver = self._reset(count)
        body = payload(size)
        sent: dict[int, float] = {}
        started = time.perf_counter()
        tasks = []
        for seq in range(count):
            due = started + seq / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            sent[seq] = time.perf_counter()
            tasks.append(asyncio.create_task(self._send(seq, body)))
        # A send the homeserver did not answer in time (far behind) is a message not carried.
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver._done.wait(), drain)
        arrivals = receiver.arrivals
        # What never arrived counts as infinitely late: percentiles over arrivals alone flatter.
        latencies = sorted(
            (arrivals[s] - sent[s]) * 1000 if s in arrivals else math.inf for s in sent
        )
        return {
            "received": sum(1 for s in sent if s in arrivals),
            "p50_ms": _pct(latencies, 50),
            "p99_ms": _pct(latencies, 99),
            "max_ms": _pct(latencies, 100),
        }

    async def single_event(self, size: int, rounds: int = 3) -> dict[str, Any]:
        """One event pushed back: the pipeline's share of a publication."""
        results = []
        for r in range(rounds):
            receiver = self._reset(1)
            started = await self._send(r, payload(size))
            await asyncio.wait_for(receiver._done.wait(), 30)
            results.append({"ms": (receiver.arrivals[r] - started) * 1000, "received": 1})
            await asyncio.sleep(0.2)
        return {"rounds": results}


def _pct(values: list[float], p: float) -> float | None:
    """The p-th percentile; None when it falls on a message that never arrived."""
    if not values:
        return None
    value = values[min(len(values) - 1, int(p / 100 * len(values)))]
    return None if math.isinf(value) else value

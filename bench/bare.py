"""The homeserver baseline: the bare pipeline with nothing of ours in between.

A virtual user sends one event per message into a room; a minimal appservice (the project's
appservice package, with no reTHINK logic) receives the homeserver's pushes. Its figures are what
routing "one message = one event" through this Synapse costs; the node's batching is measured
against them.

Across two federating homeservers (bench/domains.py), ``federate_to(peer)`` moves the sending
into a federated room that the peer pipeline's bot (on the other homeserver) joins, and the
arrivals are the peer appservice's pushes: what "one message = one event" costs between domains.

``paced_batches`` is the floor for a crowd's traffic: messages due at a steady rate, gathered
into one event while earlier events are on their way, with at most ``window`` events sent and not
yet pushed to the receiver. Paced by ``arrival``, the sender learns of each arrival at once (it
shares this process with the receiver), so the pacing costs no receipt and waits for nothing but
the homeservers: the best any design that carries every message in an event through them can do.
Paced by ``receipt``, the receiver confirms what arrived with a read receipt (one in flight, for
its newest event) and the sender counts an event arrived only when that receipt reaches it through
the homeservers: the best a sender can do that learns of the far side's progress through Matrix.
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
    # Batches (paced_batches) whose event has been pushed, and a wake-up for their sender.
    landed: set[int] = field(default_factory=set)
    _landing: asyncio.Event = field(default_factory=asyncio.Event)
    # Receipt pacing: the receiver confirms its newest event (one receipt in flight), and the
    # sender's confirmed batches (the highest one a receipt reached) wake it the same way.
    _confirming: bool = False
    _newest: str | None = None
    _receipting: asyncio.Task[None] | None = None
    _batch_of: dict[str, int] = field(default_factory=dict)
    _receipted: set[str] = field(default_factory=set)
    confirmed_upto: int = -1
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
            receive_ephemeral=True,  # read receipts, for paced_batches(pacing="receipt")
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
                for seq in content.get("seqs") or (content["seq"],):
                    self.arrivals.setdefault(int(seq), now)
                if "batch" in content:
                    self.landed.add(int(content["batch"]))
                    self._landing.set()
                    if self._confirming and isinstance(event.get("event_id"), str):
                        self._newest = event["event_id"]
                        if self._receipting is None:
                            self._receipting = asyncio.create_task(self._confirm(event["room_id"]))
        if len(self.arrivals) >= self._wanted:
            self._done.set()

    async def _confirm(self, room_id: str) -> None:
        """Read receipts for the newest event received, one in flight."""
        sent = None
        try:
            while self._newest is not None and self._newest != sent:
                sent = self._newest
                await self._api.bot.send_receipt(room_id, sent)
        finally:
            self._receipting = None

    async def handle_ephemeral(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        """Read receipts of the receiving bot on the events this pipeline sent."""
        for event in events:
            content = event.get("content")
            if event.get("type") != "m.receipt" or not isinstance(content, dict):
                continue
            for event_id in content:
                self._receipted.add(event_id)
                self._confirm_batch(self._batch_of.get(event_id))

    def _confirm_batch(self, batch: int | None) -> None:
        if batch is not None and batch > self.confirmed_upto:
            self.confirmed_upto = batch
            self._landing.set()

    async def _send_batch(self, batch: int, content: dict[str, Any]) -> None:
        event_id = await self._intent.send_event(self._room, EVENT_TYPE, content)
        self._batch_of[event_id] = batch
        if event_id in self._receipted:  # its receipt came before the send's answer
            self._confirm_batch(batch)

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
        self._sink = None  # within its homeserver until federate_to (again) says otherwise
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
        await self._runner.cleanup()  # no more pushes, so no new receipts
        # A receipt still on its way would fail on the closed session, unretrieved.
        if self._receipting is not None:
            self._receipting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receipting
        await self._http.close()

    def _reset(self, wanted: int) -> BarePipeline:
        receiver = self._receiver
        receiver.arrivals = {}
        receiver._wanted = wanted
        self._run = receiver._run = max(self._run, receiver._run) + 1
        receiver._done = asyncio.Event()
        receiver.landed = set()
        receiver._confirming = False
        self._batch_of, self._receipted, self.confirmed_upto = {}, set(), -1
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

    async def paced_batches(
        self,
        rate: float,
        seconds: float,
        size: int,
        window: int = 1,
        warmup: float = 5.0,
        drain: float = 30.0,
        max_per_event: int = 200,
        pacing: str = "arrival",
    ) -> dict[str, Any]:
        """Messages of ``size`` bytes due every 1/rate s for ``warmup`` + ``seconds``; whatever
        is due leaves in one event (at most ``max_per_event``, ~45 kB at 200 B: under Matrix's
        64 kB) as soon as fewer than ``window`` events are unarrived. Latency is due time to the
        push of its event; the figures cover the messages due after the warm-up. A message not
        pushed ``drain`` s after the sender last had news counts as lost."""
        count = int(rate * (warmup + seconds))
        receiver = self._reset(count)
        receiver._confirming = pacing == "receipt"
        body = payload(size)
        loop = asyncio.get_running_loop()
        waker = self._landing if receiver._confirming else receiver._landing

        def unarrived() -> int:
            # Batches are numbered 0, 1, … in the order sent (one send task each); the receiver
            # holds only this run's.
            if receiver._confirming:
                return len(sends) - 1 - self.confirmed_upto
            return len(sends) - len(receiver.landed)

        started = time.perf_counter()
        due = [started + i / rate for i in range(count)]
        sends: list[asyncio.Task[Any]] = []
        next_seq = 0
        while next_seq < count:
            if unarrived() >= window:
                waker.clear()
                try:
                    await asyncio.wait_for(waker.wait(), drain)
                except TimeoutError:
                    break  # the homeservers stopped carrying: the rest counts as lost
                continue
            now = time.perf_counter()
            if due[next_seq] > now:
                await asyncio.sleep(due[next_seq] - now)
                continue
            last = min(count, next_seq + max_per_event, int((now - started) * rate) + 1)
            seqs = list(range(next_seq, last))
            next_seq = last
            batch = len(sends)
            content = {"run": self._run, "batch": batch, "seqs": seqs, "bodies": [body] * len(seqs)}
            sends.append(loop.create_task(self._send_batch(batch, content)))
        await asyncio.gather(*sends, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(receiver._done.wait(), drain)
        measured = [s for s in range(count) if due[s] - started >= warmup]
        arrivals = receiver.arrivals
        latencies = sorted(
            (arrivals[s] - due[s]) * 1000 if s in arrivals else math.inf for s in measured
        )
        return {
            "measured": len(measured),
            "received": sum(1 for s in measured if s in arrivals),
            "events": len(sends),
            "messages_per_event": round(count / max(1, len(sends)), 1),
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

"""A hostile crowd beside the honest one (bench/hostile.py's third arm, issue 41).

Four parties at once, for the whole warm-up and window:

- ``poison``: one runtime, 10 times a second: ``subscribe X`` (a stream nobody holds), a
  message to X with a float ``id`` (1.5) and a body nested ~1,000 deep, ``unsubscribe X``; the
  message's address has gone by the time it is delivered (row 1 of issue 41);
- ``flood``: one host opens sessions, each with a fresh runtimeURL, allocates 1,000 addresses in
  each and leaves them detached (rows 3 and 5);
- ``idle``: 1,000 WebSockets that never send ``{cmd:'connect'}`` (row 4);
- ``peer``: a peer domain's node pushes, once a second, an event of 30 ``subscribe`` requests x 5
  streams, each for a fresh runtime of its own, and unsubscribes (naming only the runtime) those
  of the event ``PEER_HOLDS_EVENTS`` before, against a quota it reaches (rows 10 and 11). The
  bench has no second homeserver: the events come as the homeserver's push would bring them (a
  transaction to the node's appservice port, with the homeserver's token), from the peer's bot
  in a room of its own that the node adopts.

What each party obtained is counted beside the honest crowd's figures (bench/hostile.py), with
the node's resident memory (sampled every second) and the node's refusals
(``rethink_mn_quota_refusals_total``, ``rethink_mn_stub_*``) as its /metrics tells them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from adapter.config import StubConfig

# The bench's stand-in peer domain (configured on the node; no homeserver serves it).
PEER_DOMAIN = "peer.bench.example"
PEER_BOT = f"@_rethink_bot:{PEER_DOMAIN}"
PEER_MAX_SUBSCRIPTIONS = 500
# The peer unsubscribes the runtimes of the event this many before: it holds about this many
# events' worth (150 each), so its quota is reached and refused from the fourth event on.
PEER_HOLDS_EVENTS = 5
BATCH_EVENT = "eu.rethink-project.mn.batch"
LANE_FORMAT = 2
POISON_PER_S = 10.0
POISON_DEPTH = 1_000


@dataclass(frozen=True)
class Sizes:
    flood_sessions_per_s: float = 20.0
    flood_addresses: int = 1_000
    idle_sockets: int = 1_000
    peer_requests: int = 30
    peer_streams: int = 5


FULL = Sizes()
QUICK = Sizes(flood_sessions_per_s=5.0, flood_addresses=100, idle_sockets=100)


def node_settings() -> dict[str, Any]:
    """What the node of every arm is configured with (the same, so the arms compare): the
    stand-in peer, a subscription quota the burst reaches, and one client's rate as shipped
    (bench/run.py turns it off for its crowds): the honest crowd (200 x 5 msg/s) and every
    hostile party together send a fraction of it from loopback, so the honest crowd is not
    paced by it, and the hostile parties meet the node as deployed."""
    defaults = StubConfig.model_fields
    return {
        **{
            f"stub.{key}": defaults[key].default
            for key in ("client_messages_per_second", "client_bytes_per_second")
        },
        "federation.peers": {
            PEER_DOMAIN: {"server_name": PEER_DOMAIN, "max_subscriptions": PEER_MAX_SUBSCRIPTIONS}
        },
    }


def poison_frame(msg_from: str, to: str) -> str:
    """The message of row 1: a float id and a body nested POISON_DEPTH deep (JSON as text: the
    standard library's encoder would not write it)."""
    nested = "[" * (POISON_DEPTH - 2) + "]" * (POISON_DEPTH - 2)
    return f'{{"id":1.5,"type":"ping","from":"{msg_from}","to":"{to}","body":{{"n":{nested}}}}}'


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Crowd:
    url: str  # the stub's WebSocket URL
    domain: str
    appservice_url: str  # the node's appservice (the homeserver's push goes there)
    hs_token: str
    node_pid: int
    metrics_url: str
    sizes: Sizes = FULL
    counts: Counter[str] = field(default_factory=Counter)
    rss: list[float] = field(default_factory=list)

    async def run(self, start_at: float, seconds: float) -> dict[str, Any]:
        from bench.hostile import Client  # the bench's stub client (v1 handshake)

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            before = await self._metrics(http)
            poisoner = Client(http, self.url, f"runtime://{self.domain}/crowd-poison", False)
            await poisoner.connect()
            reply = await poisoner.request(
                f"domain://msg-node.{self.domain}/hyperty-address-allocation",
                "create",
                {"scheme": "hyperty", "value": {"number": 1}},
            )
            hyperty = str(reply["body"]["value"]["allocated"][0])
            rss_start = rss_mib(self.node_pid)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            until = time.time() + seconds
            idle: list[aiohttp.ClientWebSocketResponse] = []
            parties = [
                self._poison(poisoner, hyperty, until),
                self._flood(http, until),
                self._idle(http, idle, until),
                self._peer(http, until),
                self._sample_rss(until),
            ]
            await asyncio.gather(*parties)
            await asyncio.sleep(3)  # what the last frames started comes through
            after = await self._metrics(http)
            for ws in idle:
                with contextlib.suppress(Exception):
                    await ws.close()
            await poisoner.close()
        answers = Counter(
            str(m.get("body", {}).get("code"))
            for m in poisoner.inbox
            if isinstance(m.get("body"), dict) and m.get("type") == "response"
        )
        return {
            "sizes": self.sizes.__dict__,
            "counts": dict(self.counts),
            "poison_answers": dict(answers),
            "poison_close_codes": dict(poisoner.close_codes),
            "node_rss_mib": {
                "start": rss_start,
                "peak": max(self.rss, default=None),
                "end": self.rss[-1] if self.rss else None,
            },
            "node_metrics_moved": {
                k: after.get(k, 0.0) - before.get(k, 0.0)
                for k in sorted(set(before) | set(after))
                if after.get(k, 0.0) != before.get(k, 0.0)
            },
        }

    # -- the parties ----------------------------------------------------------------------------

    async def _poison(self, client: Any, hyperty: str, until: float) -> None:
        sm = f"domain://msg-node.{self.domain}/sm"
        for n in itertools.count():
            if time.time() >= until:
                return
            x = f"comm://{self.domain}/crowd-poison-{n}/changes"
            await client.send(
                {
                    "id": f"ps{n}",
                    "type": "subscribe",
                    "from": hyperty,
                    "to": sm,
                    "body": {"resources": [x]},
                }
            )
            await client.send_raw(poison_frame(hyperty, x))
            await client.send(
                {
                    "id": f"pu{n}",
                    "type": "unsubscribe",
                    "from": hyperty,
                    "to": sm,
                    "body": {"resources": [x]},
                }
            )
            self.counts["poison_sent"] += 1
            await asyncio.sleep(1 / POISON_PER_S)

    async def _flood(self, http: aiohttp.ClientSession, until: float) -> None:
        from bench.hostile import Client

        pending: set[asyncio.Task[None]] = set()
        tag = os.urandom(3).hex()

        async def one(n: int) -> None:
            client = Client(http, self.url, f"runtime://{self.domain}/crowd-flood-{tag}-{n}")
            try:
                await client.connect()
            except Exception:  # noqa: BLE001 - refused: what the node should do past a bound
                self.counts["flood_sessions_refused"] += 1
                return
            self.counts["flood_sessions_opened"] += 1
            reply = await client.request(
                f"domain://msg-node.{self.domain}/hyperty-address-allocation",
                "create",
                {"scheme": "hyperty", "value": {"number": self.sizes.flood_addresses}},
            )
            body = reply.get("body") if isinstance(reply, dict) else None
            allocated = body.get("value", {}).get("allocated") if isinstance(body, dict) else None
            if isinstance(allocated, list):
                self.counts["flood_addresses_allocated"] += len(allocated)
            else:
                code = body.get("code") if isinstance(body, dict) else None
                self.counts[f"flood_allocations_answered_{code}"] += 1
            await client.close()  # detached, its addresses held

        for n in itertools.count():
            if time.time() >= until:
                break
            if len(pending) < 50:
                task = asyncio.create_task(one(n))
                pending.add(task)
                task.add_done_callback(pending.discard)
            else:
                self.counts["flood_skipped_busy"] += 1
            await asyncio.sleep(1 / self.sizes.flood_sessions_per_s)
        await asyncio.gather(*pending, return_exceptions=True)

    async def _idle(
        self,
        http: aiohttp.ClientSession,
        sockets: list[aiohttp.ClientWebSocketResponse],
        until: float,
    ) -> None:
        """Open the idle sockets (a tenth of a second apart in tens), then watch which the
        node closes before the end."""
        watchers: list[asyncio.Task[None]] = []

        async def watch(ws: aiohttp.ClientWebSocketResponse) -> None:
            async for _frame in ws:
                pass
            if time.time() < until:
                self.counts["idle_closed_by_node"] += 1

        for start in range(0, self.sizes.idle_sockets, 10):
            for _ in range(min(10, self.sizes.idle_sockets - start)):
                try:
                    ws = await http.ws_connect(self.url, heartbeat=None)
                except aiohttp.WSServerHandshakeError as exc:
                    self.counts[f"idle_refused_{exc.status}"] += 1
                    continue
                except aiohttp.ClientError:
                    self.counts["idle_refused_connection"] += 1
                    continue
                self.counts["idle_opened"] += 1
                sockets.append(ws)
                watchers.append(asyncio.create_task(watch(ws)))
            await asyncio.sleep(0.1)
            if time.time() >= until:
                break
        await asyncio.sleep(max(0.0, until - time.time()))
        for task in watchers:
            if not task.done():
                task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)

    async def _peer(self, http: aiohttp.ClientSession, until: float) -> None:
        room = f"!crowd-{os.urandom(4).hex()}:{PEER_DOMAIN}"
        sm_a = f"domain://msg-node.{self.domain}/sm"
        sm_b = f"domain://msg-node.{PEER_DOMAIN}/sm"
        seq = itertools.count(1)
        sent: list[list[str]] = []
        for n in itertools.count(1):
            if time.time() >= until:
                return
            runtimes = [
                f"runtime://{PEER_DOMAIN}/burst{n}-{i}" for i in range(self.sizes.peer_requests)
            ]
            texts = [
                _peer_request(f"u{n}-{r}", "unsubscribe", sm_b, sm_a, {"source": r})
                for r in (sent[-PEER_HOLDS_EVENTS] if len(sent) >= PEER_HOLDS_EVENTS else [])
            ]
            texts += [
                _peer_request(
                    f"s{n}-{i}",
                    "subscribe",
                    sm_b,
                    sm_a,
                    {
                        "resources": [
                            f"comm://{self.domain}/crowd-peer-{n}-{i}-{k}/changes"
                            for k in range(self.sizes.peer_streams)
                        ],
                        "source": r,
                    },
                )
                for i, r in enumerate(runtimes)
            ]
            content = {
                "v": LANE_FORMAT,
                "n": n,
                "count": len(texts),
                "senders": [["crowd-peer-node", f"runtime://{PEER_DOMAIN}/node", PEER_BOT]],
                "messages": [[0, next(seq), [sm_a], t] for t in texts],
            }
            event = {
                "type": BATCH_EVENT,
                "room_id": room,
                "sender": PEER_BOT,
                "event_id": f"$crowd-{os.urandom(6).hex()}",
                "origin_server_ts": int(time.time() * 1000),
                "content": content,
            }
            txn = f"crowd-{os.urandom(6).hex()}"
            try:
                async with http.put(
                    f"{self.appservice_url}/_matrix/app/v1/transactions/{txn}",
                    json={"events": [event]},
                    headers={"Authorization": f"Bearer {self.hs_token}"},
                ) as resp:
                    self.counts[f"peer_transactions_{resp.status}"] += 1
            except aiohttp.ClientError:
                self.counts["peer_transactions_failed"] += 1
            self.counts["peer_subscribe_requests"] += len(runtimes)
            sent.append(runtimes)
            await asyncio.sleep(1.0)

    async def _sample_rss(self, until: float) -> None:
        while time.time() < until:
            found = rss_mib(self.node_pid)
            if found is not None:
                self.rss.append(found)
            await asyncio.sleep(1.0)

    async def _metrics(self, http: aiohttp.ClientSession) -> dict[str, float]:
        """The node's counters this crowd moves (refusals, connections)."""
        wanted = ("rethink_mn_quota_refusals_total", "rethink_mn_stub_", "rethink_mn_peer_events")
        try:
            async with http.get(self.metrics_url) as resp:
                text = await resp.text()
        except aiohttp.ClientError:
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(wanted) and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    found[name] = float(value)
        return found


def _peer_request(msg_id: str, kind: str, frm: str, to: str, body: dict[str, Any]) -> str:
    import json

    return json.dumps({"id": msg_id, "type": kind, "from": frm, "to": to, "body": body})

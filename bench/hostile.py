"""A hostile runtime in the crowd (bench/run.py's ``hostile`` group, issues 22 and 41).

The same crowd cell runs three times on fresh stacks, in one run: once alone (the baseline),
once with one hostile party beside it that sends 100 frames a second for the whole warm-up and
window, cycling through the attacks of issue 22 and the fuzzer's frames
(tests/support/grammar.py), and once beside a hostile crowd (bench/hostile_crowd.py: the poison
message at 10/s, a session and allocation flood from one host, 1,000 idle handshakes and a peer
domain's subscription burst). The honest crowd's latency and loss of the three runs are reported
side by side, and what the hostile parties obtained. It runs
two runtimes: one sends the fuzzer's frames and the overflowing numbered frame, the other the
targeted requests, so that the node closing the fuzzer's socket (as it does for some frames)
does not leave the requests without an answer.

The attacks aim at a victim pair of its own (so that what leaked can be counted exactly): the
victim holds a hyperty, a learned address and a registration; its partner sends to the
victim's addresses once a second, and the victim answers through them.

- ``seq_overflow``: a numbered frame whose number is 2^53 + 1 (stalled every lane before);
- ``subscribe_hyperty`` / ``subscribe_runtime``: the victim's hyperty address or runtimeURL;
- ``take_address``: a message from the victim's learned address;
- ``registry_update`` / ``registry_delete`` / ``registry_keepalive``: the victim's registration;
- ``foreign_origin``: a WebSocket upgrade from a web page of another origin;
- ``fuzz``: the fuzzer's frames.

"Obtained" counts what an attack got: copies of the victim's traffic, the victim's address
(messages to it reaching the attacker, or the victim's own messages refused), registry entries
changed, connections opened, frames answered with a server error, connections closed 1011 (a
failure inside the node), requests answered without an error code or never answered while the
attacker's socket stayed open (a message sent from the victim's address and routed gets no
answer); and whether the victim pair kept routing (``victim_pings_lost``).

An attack counts as refused only when the node answered it with an error code. A request whose
answer could not come because the attacker's own socket had closed meanwhile (its fuzzed frames
make the node close it) is reported as such (``closed_before_answer``), neither refused nor
obtained; an attack of which no attempt was answered shows nothing and fails the check.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench import hostile_crowd

RATE = 100.0  # hostile frames per second
# What Client.request returns when no answer came: the client's own socket closed first, or
# the node stayed silent on an open socket. Neither is an answer of the node.
CLOSED: dict[str, Any] = {"outcome": "attacker's socket closed before an answer"}
UNANSWERED: dict[str, Any] = {"outcome": "no answer in time, the socket open"}
ANSWER_SECONDS = 10.0  # how long a request waits for the node's answer
MAX_NUMBER = 2**53 - 1
FUZZ_FRAMES = 600


def fuzz_frames(known: list[str], count: int = FUZZ_FRAMES) -> list[str]:
    """Frames drawn from the fuzzer's grammar (Hypothesis' strategies, drawn outside a test)."""
    from hypothesis.errors import NonInteractiveExampleWarning

    from tests.support.grammar import frames

    strategy = frames(known)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        return [strategy.example() for _ in range(count)]


class Client:
    """One stub connection (v1 handshake, acknowledged protocol) spoken from Python."""

    _ids = itertools.count(1)

    def __init__(
        self, http: aiohttp.ClientSession, url: str, runtime_url: str, numbered: bool = True
    ) -> None:
        self.http, self.url, self.runtime_url = http, url, runtime_url
        # The hostile runtimes send plain frames: the fuzzer's numbered frames (up to 2^53 - 1)
        # leave no numbers for its own, and the attacker's requests are each asked once.
        self.numbered = numbered
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.seq = 0
        self.inbox: list[dict[str, Any]] = []
        # request id -> (the connection it was sent on, its answer)
        self.waiters: dict[Any, tuple[int, asyncio.Future[dict[str, Any]]]] = {}
        self.closes = 0
        self.close_codes: Counter[str] = Counter()  # how the node closed this client's sockets
        self.generation = 0  # bumped by every connection
        self._reader: asyncio.Task[None] | None = None
        self.token: str | None = None

    async def connect(self) -> None:
        self.ws = await self.http.ws_connect(self.url)
        data: dict[str, Any] = {
            "runtimeURL": self.runtime_url,
            "ack": {"v": 1, "stub": f"bench{next(self._ids):08d}", "received": 0},
        }
        if self.token:
            data["token"] = self.token
        await self.ws.send_json({"cmd": "connect", "data": data})
        answer = await self.ws.receive_json(timeout=10)
        if answer.get("response") != 200 and self.token:
            self.token = None
            await self.ws.close()
            return await self.connect()
        if answer.get("response") != 200:
            raise RuntimeError(f"{self.runtime_url} refused: {answer}")
        self.token = answer["data"]["token"]
        self.seq = 0
        self.generation += 1
        self._reader = asyncio.create_task(self._read(self.ws, self.generation))

    async def _read(self, ws: aiohttp.ClientWebSocketResponse, generation: int) -> None:
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            parsed = json.loads(frame.data)
            if isinstance(parsed, list) and len(parsed) == 4:
                await ws.send_str(f'{{"cmd":"ack","received":{parsed[0]}}}')
                parsed = parsed[3]
            if not isinstance(parsed, dict):
                continue
            waiting = self.waiters.get(parsed.get("id"))
            if waiting is not None and parsed.get("type") == "response" and not waiting[1].done():
                waiting[1].set_result(parsed)
            else:
                self.inbox.append(parsed)
        self.closes += 1
        self.close_codes[str(ws.close_code)] += 1
        # What was asked on this socket can no longer be answered on it.
        for sent_on, waiter in self.waiters.values():
            if sent_on == generation and not waiter.done():
                waiter.set_result(CLOSED)

    async def ensure(self) -> None:
        if self.ws is None or self.ws.closed:
            await self.connect()

    async def send_raw(self, text: str) -> None:
        await self.ensure()
        assert self.ws is not None
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await self.ws.send_str(text)

    async def send(self, message: dict[str, Any]) -> None:
        if not self.numbered:
            await self.send_raw(json.dumps(message))
            return
        self.seq += 1
        await self.send_raw(f"[{self.seq},{json.dumps(message)}]")

    async def request(
        self, to: str, type_: str, body: dict[str, Any], from_: str | None = None
    ) -> dict[str, Any]:
        """The node's answer; CLOSED when this client's socket closed before one came (the
        answer could not come), UNANSWERED when none came within ANSWER_SECONDS on an open
        socket."""
        msg_id = f"q{next(self._ids)}"
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await self.ensure()
        generation = self.generation
        self.waiters[msg_id] = (generation, waiter)
        await self.send(
            {
                "id": msg_id,
                "type": type_,
                "from": from_ or f"{self.runtime_url}/registry",
                "to": to,
                "body": body,
            }
        )
        try:
            return await asyncio.wait_for(waiter, ANSWER_SECONDS)
        except TimeoutError:
            closed = self.generation != generation or self.ws is None or self.ws.closed
            return CLOSED if closed else UNANSWERED
        finally:
            self.waiters.pop(msg_id, None)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)


class Hostile:
    """The hostile runtime and the victim pair it aims at."""

    def __init__(self, url: str, domain: str) -> None:
        self.url, self.domain = url, domain
        self.mn = f"domain://msg-node.{domain}"
        self.attempts: Counter[str] = Counter()
        self.answers: dict[str, Counter[str]] = {}  # attack -> the node's answer codes
        self.refused: Counter[str] = Counter()  # attack -> attempts answered with an error code
        self.closed_before_answer: Counter[str] = Counter()
        self.obtained: Counter[str] = Counter()
        self.pings_sent = 0
        self.pings_got = 0

    @property
    def clients(self) -> tuple[Client, ...]:
        return (self.victim, self.partner, self.attacker, self.fuzzer)

    async def _setup(self, http: aiohttp.ClientSession) -> None:
        d = self.domain
        self.victim = Client(http, self.url, f"runtime://{d}/hostile-bench-victim")
        self.partner = Client(http, self.url, f"runtime://{d}/hostile-bench-partner")
        self.attacker = Client(
            http, self.url, f"runtime://{d}/hostile-bench-attacker", numbered=False
        )
        self.fuzzer = Client(http, self.url, f"runtime://{d}/hostile-bench-fuzzer", numbered=False)
        for client in self.clients:
            await client.connect()
        self.v_hyperty = await self._allocate(self.victim)
        self.p_hyperty = await self._allocate(self.partner)
        self.v_user = f"user://{d}/hostile-bench-victim"
        # An address of a domain the node knows nothing about: learned by the victim when it
        # speaks from it (a user address is learned only by its verified identity).
        self.v_learned = "hyperty://elsewhere.example/hostile-bench-victim"
        # The victim speaks from its learned address and registers its hyperty.
        await self.victim.send(
            {"id": "hello", "type": "ping", "from": self.v_learned, "to": self.p_hyperty}
        )
        reply = await self.victim.request(
            f"domain://registry.{d}",
            "create",
            {
                "value": {
                    "user": self.v_user,
                    "url": self.v_hyperty,
                    "descriptor": "hyperty-catalogue://catalogue.example/hyperty/Chat",
                    "expires": 3600,
                    "resources": ["chat"],
                    "dataSchemes": ["comm"],
                    "runtime": self.victim.runtime_url,
                    "status": "live",
                }
            },
        )
        if reply["body"]["code"] != 200:
            raise RuntimeError(f"victim's registration refused: {reply}")
        self.registration = await self._registration()

    async def _allocate(self, client: Client) -> str:
        reply = await client.request(
            f"{self.mn}/hyperty-address-allocation",
            "create",
            {"scheme": "hyperty", "value": {"number": 1}},
        )
        return str(reply["body"]["value"]["allocated"][0])

    async def _registration(self) -> Any:
        reply = await self.partner.request(
            f"domain://registry.{self.domain}", "read", {"resource": self.v_hyperty}
        )
        return reply["body"].get("value")

    def _answered(self, attack: str, reply: dict[str, Any]) -> None:
        """Refused only with an error code from the node; any other answer, or silence on an
        open socket, is what the attack obtained."""
        if reply is CLOSED:
            self.closed_before_answer[attack] += 1
            return
        if reply is UNANSWERED:
            self.obtained[f"{attack}: not answered (the socket open)"] += 1
            return
        body = reply.get("body")
        code = body.get("code") if isinstance(body, dict) else None
        self.answers.setdefault(attack, Counter())[str(code)] += 1
        if not isinstance(code, int) or code < 400:
            self.obtained[f"{attack}: answered {code}"] += 1
        elif code >= 500:
            self.obtained[f"{attack}: server errors"] += 1
        else:
            self.refused[attack] += 1

    # -- the attacks --------------------------------------------------------------------------

    async def seq_overflow(self) -> None:
        message = {"id": "big", "type": "ping", "from": self.v_hyperty, "to": self.p_hyperty}
        await self.fuzzer.send_raw(f"[{MAX_NUMBER + 2},{json.dumps(message)}]")

    async def subscribe_hyperty(self) -> None:
        reply = await self.attacker.request(
            f"{self.mn}/sm", "subscribe", {"resources": [self.v_hyperty]}
        )
        self._answered("subscribe_hyperty", reply)

    async def subscribe_runtime(self) -> None:
        reply = await self.attacker.request(
            f"{self.mn}/sm", "subscribe", {"subscribe": [self.victim.runtime_url]}
        )
        self._answered("subscribe_runtime", reply)

    async def take_address(self) -> None:
        reply = await self.attacker.request(self.p_hyperty, "ping", {}, from_=self.v_learned)
        self._answered("take_address", reply)

    async def _registry(self, attack: str, type_: str, body: dict[str, Any]) -> None:
        reply = await self.attacker.request(f"domain://registry.{self.domain}", type_, body)
        self._answered(attack, reply)

    async def registry_update(self) -> None:
        await self._registry(
            "registry_update",
            "update",
            {"resource": self.v_hyperty, "value": {"runtime": self.attacker.runtime_url}},
        )

    async def registry_delete(self) -> None:
        await self._registry(
            "registry_delete", "delete", {"value": {"url": self.v_hyperty, "user": self.v_user}}
        )

    async def registry_keepalive(self) -> None:
        await self._registry("registry_keepalive", "update", {"resource": self.v_hyperty})

    async def foreign_origin(self) -> None:
        try:
            ws = await self.victim.http.ws_connect(
                self.url,
                params={"runtimeURL": f"runtime://{self.domain}/hostile-bench-page"},
                headers={"Origin": "https://evil.example"},
            )
        except aiohttp.WSServerHandshakeError as exc:
            self.answers.setdefault("foreign_origin", Counter())[str(exc.status)] += 1
            if 400 <= exc.status < 500:
                self.refused["foreign_origin"] += 1
            else:
                self.obtained[f"foreign_origin: answered {exc.status}"] += 1
            return
        self.obtained["foreign_origin: connections opened"] += 1
        await ws.close()

    # -- the run ------------------------------------------------------------------------------

    async def _victim_traffic(self, until: float) -> None:
        """The partner writes to the victim's hyperty and user address once a second."""
        while time.time() < until:
            for to in (self.v_hyperty, self.v_learned):
                self.pings_sent += 1
                await self.partner.send(
                    {"id": f"v{self.pings_sent}", "type": "ping", "from": self.p_hyperty, "to": to}
                )
            await asyncio.sleep(1.0)

    async def run(self, start_at: float, seconds: float, fuzz: list[str]) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            await self._setup(http)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            until = time.time() + seconds
            traffic = asyncio.create_task(self._victim_traffic(until))
            attacks: list[tuple[str, Callable[[], Any]]] = [
                ("seq_overflow", self.seq_overflow),
                ("subscribe_hyperty", self.subscribe_hyperty),
                ("subscribe_runtime", self.subscribe_runtime),
                ("take_address", self.take_address),
                ("registry_update", self.registry_update),
                ("registry_delete", self.registry_delete),
                ("registry_keepalive", self.registry_keepalive),
                ("foreign_origin", self.foreign_origin),
            ]
            fuzzed = iter(itertools.cycle(fuzz))
            rng = random.Random(22)
            tick = 0
            pending: set[asyncio.Task[Any]] = set()
            while time.time() < until:
                tick += 1
                # Every tenth frame a targeted attack, the rest the fuzzer's frames.
                if tick % 10 == 0:
                    name, attack = attacks[rng.randrange(len(attacks))]
                    self.attempts[name] += 1
                    task = asyncio.create_task(attack())
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                else:
                    self.attempts["fuzz"] += 1
                    await self.fuzzer.send_raw(next(fuzzed))
                await asyncio.sleep(1 / RATE)
            await asyncio.gather(*pending, return_exceptions=True)
            await traffic
            await asyncio.sleep(3)  # the last pings' way through
            return await self._verdict()

    async def _verdict(self) -> dict[str, Any]:
        victim_got = {
            m.get("id") for m in self.victim.inbox if str(m.get("id", "")).startswith("v")
        }
        self.pings_got = len(victim_got)
        hostile = self.attacker.inbox + self.fuzzer.inbox
        leaked = [m for m in hostile if str(m.get("id", "")).startswith("v")]
        self.obtained["copies of the victim's traffic"] += len(leaked)
        if await self._registration() != self.registration:
            self.obtained["registry: victim's entry changed"] += 1
        for message in hostile:
            body = message.get("body")
            code = body.get("code") if isinstance(body, dict) else message.get("response")
            # An unconfigured global registry answers 503: its documented answer.
            unconfigured = str(message.get("from", "")).startswith("global://") and code == 503
            if isinstance(code, int) and code >= 500 and not unconfigured:
                self.obtained["fuzz: server errors"] += 1
        internal = sum(c.close_codes.get("1011", 0) for c in (self.attacker, self.fuzzer))
        if internal:
            self.obtained["connections closed 1011 (a failure inside the node)"] += internal
        for client in self.clients:
            await client.close()
        return {
            "rate_per_s": RATE,
            "attempts": dict(self.attempts),
            "answers": {k: dict(v) for k, v in self.answers.items()},
            "refused": dict(self.refused),
            "closed_before_answer": dict(self.closed_before_answer),
            "obtained": {k: v for k, v in self.obtained.items() if v},
            "victim_pings_sent": self.pings_sent,
            "victim_pings_lost": self.pings_sent - self.pings_got,
            "attacker_reconnects": self.attacker.closes,
            "attacker_close_codes": dict(self.attacker.close_codes),
            "fuzzer_reconnects": self.fuzzer.closes,
            "fuzzer_close_codes": dict(self.fuzzer.close_codes),
        }


# -- the group (bench/run.py --only hostile) -----------------------------------------------------

# The attacks answered by the node (requests, and the foreign page's upgrade): each must be seen
# refused. seq_overflow gets no answer of its own; the victim pair's pings show what it did.
ANSWERED_ATTACKS = frozenset(
    {
        "subscribe_hyperty",
        "subscribe_runtime",
        "take_address",
        "registry_update",
        "registry_delete",
        "registry_keepalive",
        "foreign_origin",
    }
)
FULL_CELL = (200, 5.0, 60.0)
QUICK_CELL = (10, 2.0, 5.0)
P99_LIMIT = 1.5  # honest p99 with the hostile runtime, as a multiple of the crowd's alone
# The arms, each on a fresh stack, in one run: the honest crowd alone (the baseline), beside one
# hostile runtime, and beside a hostile crowd (bench/hostile_crowd.py).
ARMS = ("alone", "with", "crowd")
# The node's resident memory the hostile crowd may bring it to (MiB): what the honest crowd
# alone takes plus the node-wide bounds' worth of sessions, addresses and sockets.
RSS_LIMIT_MIB = 600.0


async def run_group(
    stack: Any,
    launcher: tuple[Callable[[Path], list[str]], bool],
    results: Any,
    domain: str,
    work: Path,
    say: Callable[[str], None],
    quick: bool = False,
) -> None:
    from bench import crowd

    senders, rate, seconds = QUICK_CELL if quick else FULL_CELL
    cell = crowd.Cell(senders, rate, duration=seconds, warmup=2.0 if quick else 5.0)
    command, journal = launcher
    say("[bold]hostile: drawing the fuzzer's frames")
    known = [f"hyperty://{domain}/x", f"runtime://{domain}/hostile-bench-victim"]
    fuzz = await asyncio.to_thread(fuzz_frames, known, 60 if quick else FUZZ_FRAMES)
    # Every arm's node is configured alike (the crowd's stand-in peer among its peers), so the
    # baseline is the same node the hostile parties meet.
    settings = hostile_crowd.node_settings()
    sizes = hostile_crowd.QUICK if quick else hostile_crowd.FULL
    for arm in ARMS:
        phase = f"hostile-{arm}"
        beside = {
            "alone": " (baseline)",
            "with": f" one hostile runtime at {RATE:g} frames/s",
            "crowd": " a hostile crowd (poison, session flood, idle sockets, a peer's burst)",
        }[arm]
        say(f"[bold]hostile: {cell.label} on the node, {arm}{beside}")

        async def scenarios(url: str, service: Any, phase: str = phase, arm: str = arm) -> None:
            synapse = stack.synapses.get(phase)
            pids: crowd.Roots = {
                "node": service.proc.pid,
                "synapse": synapse.all_pids if synapse else None,
            }
            metrics = service.health_url.replace("/health", "/metrics")

            async def one_runtime(url: str, start_at: float, seconds: float) -> dict[str, Any]:
                return await Hostile(url, domain).run(start_at, seconds, fuzz)

            async def the_crowd(url: str, start_at: float, seconds: float) -> dict[str, Any]:
                party = hostile_crowd.Crowd(
                    url,
                    domain,
                    service.health_url.removesuffix("/health"),
                    stack.hs_token,
                    service.proc.pid,
                    metrics,
                    sizes,
                )
                return await party.run(start_at, seconds)

            companions = {"alone": None, "with": one_runtime, "crowd": the_crowd}
            await crowd.run_cell(
                cell,
                "node",
                url,
                domain,
                pids,
                results,
                work,
                say,
                metrics,
                test=f"hostile_{cell.label}_{arm}",
                companion=companions[arm],
            )

        try:
            await stack.run_node_like(
                "node", command, journal, phase=phase, scenarios=scenarios, settings=settings
            )
        except Exception as exc:  # noqa: BLE001 - report the arm as failed, keep the others
            say(f"  [red]hostile {arm} failed: {exc!r} (logs in {work})")
            results.add(f"hostile_{cell.label}_{arm}", target="node", error=repr(exc))


def is_hostile_row(row: dict[str, Any]) -> bool:
    return str(row["test"]).startswith("hostile_")


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    alone = next((r for r in rows if is_hostile_row(r) and r["test"].endswith("_alone")), None)
    beside = next((r for r in rows if is_hostile_row(r) and r["test"].endswith("_with")), None)
    if alone is None or beside is None:
        return []
    if "error" in alone or "error" in beside:
        return [{"check": "hostile: both arms ran", "node": None, "limit": None, "met": False}]
    limit = None if alone["p99_ms"] is None else P99_LIMIT * alone["p99_ms"]
    report = beside.get("companion", {})
    return runtime_checks(alone, beside, limit, report) + crowd_checks(rows, alone, limit)


def crowd_checks(
    rows: list[dict[str, Any]], alone: dict[str, Any], limit: float | None
) -> list[dict[str, Any]]:
    """The honest crowd beside the hostile crowd, against the same crowd alone (issue 41)."""
    arm = next((r for r in rows if is_hostile_row(r) and r["test"].endswith("_crowd")), None)
    if arm is None:
        return []
    if "error" in arm:
        return [{"check": "hostile crowd: the arm ran", "node": None, "limit": None, "met": False}]
    peak = arm.get("companion", {}).get("node_rss_mib", {}).get("peak")
    return [
        {
            "check": "hostile crowd: every honest message delivered",
            "node": arm["lost"],
            "limit": 0,
            "met": arm["lost"] == 0,
        },
        {
            "check": f"hostile crowd: honest p99 <= {P99_LIMIT:g} x the crowd alone (ms)",
            "node": arm["p99_ms"],
            "limit": limit,
            "met": limit is not None and arm["p99_ms"] is not None and arm["p99_ms"] <= limit,
        },
        {
            "check": "hostile crowd: node RSS peak (MiB)",
            "node": None if peak is None else round(peak, 1),
            "limit": RSS_LIMIT_MIB,
            "met": peak is not None and peak <= RSS_LIMIT_MIB,
        },
    ]


def runtime_checks(
    alone: dict[str, Any], beside: dict[str, Any], limit: float | None, report: dict[str, Any]
) -> list[dict[str, Any]]:
    return [
        {
            "check": "hostile: every honest message delivered",
            "node": beside["lost"],
            "limit": 0,
            "met": beside["lost"] == 0 and alone["lost"] == 0,
        },
        {
            "check": f"hostile: honest p99 <= {P99_LIMIT:g} x the crowd alone (ms)",
            "node": beside["p99_ms"],
            "limit": limit,
            "met": limit is not None and beside["p99_ms"] is not None and beside["p99_ms"] <= limit,
        },
        {
            "check": "hostile: the attacks obtained nothing",
            "node": sum(report.get("obtained", {}).values()),
            "limit": 0,
            "met": not report.get("obtained") and report.get("victim_pings_lost") == 0,
        },
        {
            # Nothing obtained means something only for an attack the node was seen to refuse.
            "check": "hostile: every targeted attack refused with an error code at least once",
            "node": sorted(unproven(report)),
            "limit": [],
            "met": bool(report) and not unproven(report),
        },
    ]


def unproven(report: dict[str, Any]) -> set[str]:
    """The targeted attacks tried and never answered with an error code (each attempt's answer
    lost with the attacker's socket, say): nothing shows they were refused."""
    answered = ANSWERED_ATTACKS & set(report.get("attempts", {}))
    return {a for a in answered if not report.get("refused", {}).get(a)}


def print_report(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    arms = [r for r in rows if is_hostile_row(r)]
    if not arms:
        return
    table = Table(title="hostile runtime in the crowd (honest traffic; ms)")
    for col in (
        "arm",
        "msg/s offered / sent / delivered",
        "p50 / p99 / max",
        "loss",
        "CPU node / synapse",
    ):
        table.add_column(col)
    for r in arms:
        if "error" in r:
            table.add_row(r["test"], f"[red]failed: {r['error']}")
            continue
        from bench import crowd

        text = crowd.cell_text(r)
        cpu = r["cpu_pct"]
        table.add_row(
            r["test"],
            text[0],
            text[1],
            text[2],
            f"{cpu.get('node', 0):.0f} / {cpu.get('synapse', 0):.0f}",
        )
    console.print(table)
    beside = next((r for r in arms if r["test"].endswith("_with") and "companion" in r), None)
    if beside is not None:
        report = beside["companion"]
        attacks = Table(title="what each attack obtained")
        for col in ("attack", "attempts", "refused", "answers", "socket closed first", "obtained"):
            attacks.add_column(col)
        for name, attempts in sorted(report["attempts"].items()):
            got = {k: v for k, v in report["obtained"].items() if k.startswith(name)}
            attacks.add_row(
                name,
                str(attempts),
                str(report.get("refused", {}).get(name, 0)),
                json.dumps(report["answers"].get(name, {})),
                str(report.get("closed_before_answer", {}).get(name, 0)),
                json.dumps(got) if got else "nothing",
            )
        others = {
            k: v
            for k, v in report["obtained"].items()
            if not any(k.startswith(a) for a in report["attempts"])
        }
        attacks.add_row(
            "victim pair",
            str(report["victim_pings_sent"]),
            "",
            f"{report['victim_pings_lost']} lost",
            "",
            json.dumps(others) if others else "nothing",
        )
        console.print(attacks)
    party = next((r for r in arms if r["test"].endswith("_crowd") and "companion" in r), None)
    if party is not None:
        report = party["companion"]
        table = Table(title="what the hostile crowd did, and what the node said")
        table.add_column("figure")
        table.add_column("value")
        for key, value in sorted(report["counts"].items()):
            table.add_row(key, str(value))
        table.add_row("poison: answers by code", json.dumps(report["poison_answers"]))
        table.add_row(
            "poison: sockets closed by the node", json.dumps(report["poison_close_codes"])
        )
        table.add_row("node RSS MiB (start / peak / end)", json.dumps(report["node_rss_mib"]))
        for key, value in report["node_metrics_moved"].items():
            table.add_row(key, f"+{value:g}")
        console.print(table)
    for c in verdicts:
        mark = {True: "[green]yes", False: "[red]NO", None: "—"}[c["met"]]
        console.print(f"  {c['check']}: {c['node']} (limit {c['limit']}) {mark}")

"""A model of the domain, run against the real node and Synapse (issue 43).

A Hypothesis state machine drives one node (fresh database per example) with honest runtimes
(alice, bob, carol, and dave who connects late) and a hostile one (mallory): any operation on
any address, in any spelling, reloads, reconnects, clean disconnects, session floods, idle
sockets, a poisoned message, a flooded inbox, a restart of the node. The model
(tests/support/domain_model.py) holds the promises; after every step the machine waits (a
bound, never a threshold) until what must arrive has arrived, then checks the invariants
against what each runtime actually saw.

Budget and seed: ``RETHINK_MODEL_SECONDS`` (default 150: CI) is the time after which no new
example starts; ``RETHINK_MODEL_SECONDS=1800`` is the 30-minute run. The seed is the fuzzers'
(``RETHINK_FUZZ_SEED``, fresh and printed every run, tests/support/fuzzing.py); failing
examples are kept in the Hypothesis database and replayed first (``RETHINK_FUZZ_KEEP=1`` keeps
them in tests/fuzz-corpus/). Attacks the model found are kept as explicit regression tests at the
end of this file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import aiohttp
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from adapter.node import Node

from ..conftest import Databases, Homeserver
from ..support.domain_model import (
    HYPERTY_ALLOCATION,
    OBJECT_ALLOCATION,
    REGISTRY,
    SM,
    Actor,
    D,
    Domain,
    SeeingRuntime,
    Sent,
    guid,
    spellings,
    wait_for,
)
from ..support.fuzzing import fuzz_seed, model_settings, run_for_budget
from ..support.node_faults import DatabaseAway, kill, start_homeserver, stop_homeserver

pytestmark = [pytest.mark.integration]
T = TypeVar("T")

BUDGET = float(os.environ.get("RETHINK_MODEL_SECONDS", "150"))
# How long a step may wait for what must arrive (a bound: a slow machine waits longer, never
# fails sooner; a message missing after it is lost).
SETTLE = float(os.environ.get("RETHINK_MODEL_SETTLE", "30"))
STEPS = int(os.environ.get("RETHINK_MODEL_STEPS", "30"))
HONEST = ("alice", "bob", "carol", "dave")
# Small limits, so that a short run reaches them: what the node promises must hold at any limit.
LIMITS: dict[str, Any] = {
    "stub.max_detached_sessions": 6,
    "stub.max_connections": 48,
    "stub.max_connections_per_client": 48,
    # Every runtime connects from loopback, as through a reverse proxy on this machine that
    # names each runtime's own host (HOSTS): the promises between clients (one never crowds
    # out another) can only be seen when they are not all one client.
    "stub.trusted_proxies": ["127.0.0.1"],
    "quotas.waiting_bytes": 64 * 1024,
}
FLOOD = 8
# The host each runtime connects from (X-Forwarded-For, believed from the proxy on loopback):
# each honest runtime its own, and one for everything mallory does.
HOSTS = {name: f"192.0.2.{i}" for i, name in enumerate(HONEST, start=1)}
MALLORY_HOST = "198.51.100.66"
# Every rule runs by default. RETHINK_MODEL_SKIP names rules to leave out (any of the hostile
# runtime's and the faults: RETHINK_MODEL_SKIP=poison,session_flood), for a run that looks
# elsewhere once one attack is found.
_SKIP = os.environ.get("RETHINK_MODEL_SKIP")
SKIPPED = frozenset(_SKIP.split(",") if _SKIP else ())
# Addresses a runtime must never speak from, beyond every honest runtime's (found by the model:
# test_nobody_speaks_from_this_domains_bare_stub_host).
FORBIDDEN_ADDRESSES = (f"hyperty-runtime://{D}",)
# Shrinking a failure re-runs its example many times (minutes on a real node);
# RETHINK_MODEL_SHRINK=0 reports the first failing example as found (how long finding takes).
SHRINK = os.environ.get("RETHINK_MODEL_SHRINK", "1") != "0"
# Examples per Hypothesis run (one seed); runs follow each other until the budget is spent.
ROUND = int(os.environ.get("RETHINK_MODEL_ROUND", "4"))
IDLE_SOCKETS = 48


@dataclass
class Context:
    loop: asyncio.AbstractEventLoop
    homeserver: Homeserver
    databases: Databases
    deadline: float


class DomainMachine(RuleBasedStateMachine):
    ctx: ClassVar[Context]
    examples: ClassVar[int] = 0
    steps: ClassVar[int] = 0
    # What came of every attempted message over the run (Domain.tally), duplicates among it.
    totals: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.node: Node | None = None
        self.database = ""
        self.model = Domain(uuid.uuid4().hex[:8])
        for name in HONEST:
            self.model.actor(name, honest=True)
        self.mallory = self.model.actor("mallory", honest=False)
        self.extra: list[SeeingRuntime] = []  # the flood's runtimes
        self.idle: list[aiohttp.ClientWebSocketResponse] = []
        self.idle_session: aiohttp.ClientSession | None = None
        self.asked: list[Sent] = []

    # -- plumbing ---------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T], limit: float = 180) -> T:
        """Run ``coro`` on the tests' event loop, where the node and the runtimes live. What
        fails is printed at once (a failure on a real node may replay otherwise, and Hypothesis
        then reports only that its replay was flaky)."""
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.ctx.loop).result(limit)
        except BaseException as exc:
            print(f"domain model: a step failed: {exc!r}"[:3000], flush=True)
            raise

    def stub_url(self) -> str:
        assert self.node is not None
        return f"ws://127.0.0.1:{self.node.stub_port}/stub/connect"

    def runtime(self, url: str, seen: list[Any], host: str = MALLORY_HOST) -> SeeingRuntime:
        """A stub instance for ``url``, connecting from ``host``."""
        rt = SeeingRuntime(self.stub_url(), url, seen)
        rt.headers = {"X-Forwarded-For": host}
        return rt

    def a(self, name: str) -> Actor:
        return self.model.actors[name]

    def live(self, name: str) -> bool:
        return self.a(name).state == "live"

    async def _connect(self, actor: Actor, fresh: bool, expect: str | None) -> None:
        """Connect ``actor`` (a new stub instance when ``fresh``, as a reloaded page; else the
        same one again), retrying a refusal for want of room (503, a closed upgrade) within the
        bound, as a real stub reconnects with back-off."""
        if fresh or actor.rt is None:
            old = actor.rt
            rt = self.runtime(actor.url, actor.seen, HOSTS.get(actor.name, MALLORY_HOST))
            rt.token = actor.token
            if old is not None and expect == "resumed":
                # What the bundled stub keeps across a reload (docs/stub-protocol.md).
                rt.restore(old.kept())
            if old is not None:
                actor.duplicates += old.duplicates
                await old.close()
            actor.rt = rt
        rt = actor.rt
        rt.stub_url = self.stub_url()
        rt.close_code = None
        loop = asyncio.get_running_loop()
        end = loop.time() + SETTLE
        while True:
            try:
                await rt.connect()
                answer = rt.connect_answer or {}
                if answer.get("response") != 503:
                    break
            except (aiohttp.ClientError, TimeoutError) as exc:
                answer = {"error": repr(exc)}
            if loop.time() >= end:
                raise AssertionError(f"{actor.name} could not connect within {SETTLE} s: {answer}")
            await rt.drop()
            await asyncio.sleep(0.5)
        assert answer.get("response") == 200, f"{actor.name}'s connect was refused: {answer}"
        session = answer["data"]["session"]
        if expect is not None:
            assert session == expect, (
                f"{actor.name} reconnected with its token and got session {session!r}, not "
                f"{expect!r}: its session (and what was kept for it) was taken"
            )
        actor.token = rt.token
        actor.state = "live"

    async def _request(
        self, actor: Actor, to: str, type_: str, body: Any, *, what: str, frm: str | None = None
    ) -> dict[str, Any]:
        """An MN service request; its answer."""
        s = self.model.expect(actor, frm or f"{actor.url}/registry", to, refused=None, what=what)
        assert actor.rt is not None
        message = {"id": s.id, "type": type_, "from": s.frm, "to": to, "body": body}
        await actor.rt.send(message)
        ok = await wait_for(lambda: bool(actor.answers_to(s.id)), SETTLE)
        assert ok, f"{actor.name}'s {what} ({s.id}) was never answered"
        return actor.answers_to(s.id)[0]

    async def _send(self, sender: Actor, s: Sent, type_: str = "ping", body: Any = None) -> None:
        assert sender.rt is not None
        message: dict[str, Any] = {"id": s.id, "type": type_, "from": s.frm, "to": s.to}
        message["body"] = body if body is not None else {"n": s.n}
        await sender.rt.send(message)

    def code(self, answer: dict[str, Any]) -> Any:
        return (answer.get("body") or {}).get("code")

    # -- the node ---------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        type(self).examples += 1

        async def go() -> None:
            self.database = await self.ctx.databases.migrated_sqlite()
            self.node = Node(self.ctx.homeserver.node_config(self.database, **LIMITS))
            await self.node.start()
            for name in ("alice", "bob", "carol", "mallory"):
                await self._connect(self.a(name), fresh=True, expect="new")
                await self._allocate(self.a(name), "hyperty")

        self.run(go())

    def teardown(self) -> None:
        for key, value in self.model.tally().items():
            self.totals[key] = self.totals.get(key, 0) + value

        async def go() -> None:
            for rt in [a.rt for a in self.model.actors.values()] + self.extra:
                if rt is not None:
                    await _close(rt)
            for ws in self.idle:
                with contextlib.suppress(Exception):
                    await ws.close()
            if self.idle_session is not None:
                await self.idle_session.close()
            if self.node is not None:
                await self.node.stop()

        self.run(go())

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def promises_hold(self) -> None:
        if self.node is None:
            return
        type(self).steps += 1
        settled = self.run(wait_for(lambda: not self.model.pending(), SETTLE), SETTLE + 60)
        broken = self.model.violations()
        if not settled:
            broken += [f"lost (after {SETTLE} s): {p}" for p in self.model.pending()]
        if broken:
            # Printed at once: a failure on a real node may replay otherwise, and Hypothesis
            # then reports only that its replay was flaky.
            print("domain model: broken:\n  " + "\n  ".join(broken), flush=True)
        assert not broken, "\n".join(broken)

    # -- honest runtimes --------------------------------------------------------------------

    async def _allocate(self, actor: Actor, kind: str) -> str:
        if kind == "hyperty":
            answer = await self._request(
                actor,
                HYPERTY_ALLOCATION,
                "create",
                {"scheme": "hyperty", "value": {"number": 1}},
                what="allocate hyperty",
            )
        else:
            answer = await self._request(
                actor,
                OBJECT_ALLOCATION,
                "create",
                {"scheme": "comm", "value": {"number": 1}},
                what="allocate object",
            )
        assert self.code(answer) == 200, f"{actor.name}: allocation refused: {answer}"
        [address] = answer["body"]["value"]["allocated"]
        assert isinstance(address, str)
        (actor.hyperties if kind == "hyperty" else actor.objects).append(address)
        return address

    @rule(name=st.sampled_from(HONEST), kind=st.sampled_from(["hyperty", "object"]))
    def allocate(self, name: str, kind: str) -> None:
        actor = self.a(name)
        if not (actor.state == "live" and len(actor.addresses) < 4):
            return
        self.run(self._allocate(actor, kind))

    @rule(name=st.sampled_from(HONEST), how=st.sampled_from(["subscribe", "speak"]))
    def claim_guid(self, name: str, how: str) -> None:
        """A runtime names a hyperty address itself (runtime-core's GUIDs) and claims it."""
        actor = self.a(name)
        if not (actor.state == "live" and len(actor.addresses) < 4):
            return
        address = f"hyperty://{D}/{guid()}"

        async def go() -> None:
            if how == "subscribe":
                answer = await self._request(
                    actor, SM, "subscribe", {"resources": [address]}, what="claim by subscribe"
                )
                assert self.code(answer) == 200, f"{name}: claim of {address} refused: {answer}"
                actor.hyperties.append(address)
            else:
                # Speaking from it claims it. To another runtime: the node hands a runtime
                # nothing it sent to itself (docs/stub-protocol.md "Receive at").
                peers = [self.a(n) for n in HONEST if n != name and self.live(n)]
                to = peers[0].url if peers else self.mallory.url
                who = peers[0].name if peers else "mallory"
                actor.hyperties.append(address)
                s = self.model.expect(
                    actor, address, to, refused=False, must={who}, what="claim by speaking"
                )
                await self._send(actor, s)

        self.run(go())

    @rule(
        sender=st.sampled_from(HONEST),
        dest=st.sampled_from(HONEST),
        kind=st.sampled_from(["hyperty", "runtime", "channel", "released", "spelling", "ask"]),
        pick=st.integers(0, 7),
        count=st.integers(1, 3),
    )
    def send(self, sender: str, dest: str, kind: str, pick: int, count: int) -> None:
        """An honest runtime sends to another's address (or one gone, or misspelled)."""
        s_actor, t_actor = self.a(sender), self.a(dest)
        if s_actor.state != "live" or sender == dest:
            return
        canonical = True
        if kind in ("hyperty", "ask"):
            if not (t_actor.hyperties):
                return
            to = t_actor.hyperties[pick % len(t_actor.hyperties)]
        elif kind == "runtime":
            to = t_actor.url
        elif kind == "channel":
            if not (t_actor.objects):
                return
            to = t_actor.objects[pick % len(t_actor.objects)] + "/subscription"
        elif kind == "released":
            if not (self.model.released):
                return
            gone = sorted(self.model.released)
            to = gone[pick % len(gone)]
        else:
            if not (t_actor.hyperties):
                return
            variants = spellings(t_actor.hyperties[pick % len(t_actor.hyperties)])
            to, canonical = variants[pick % len(variants)], False
        frm = s_actor.hyperties[0] if s_actor.hyperties else s_actor.url
        receivers = self.model.receivers(to) if canonical else set()

        async def go() -> None:
            for _ in range(count):
                s = self.model.expect(
                    s_actor,
                    frm,
                    to,
                    refused=not receivers,
                    must=receivers,
                    what=f"{kind} {sender}->{dest}" if canonical else f"spelling {to!r}",
                )
                s.canonical = canonical
                if kind == "ask":
                    self.asked.append(s)
                await self._send(s_actor, s, "read" if kind == "ask" else "ping")

        self.run(go())

    @rule(name=st.sampled_from(HONEST), pick=st.integers(0, 7))
    def publish(self, name: str, pick: int) -> None:
        """A reporter publishes a change of its object to its subscribers."""
        actor = self.a(name)
        if not (actor.state == "live" and actor.objects):
            return
        obj = actor.objects[pick % len(actor.objects)]
        to = f"{obj}/changes"
        receivers = self.model.receivers(to)
        s = self.model.expect(
            actor,
            obj,
            to,
            refused=None if not receivers else False,
            must=receivers,
            what=f"publication of {name}'s object",
        )
        self.run(self._send(actor, s, "update", {"n": s.n, "value": "changed"}))

    @rule(
        observer=st.sampled_from([*HONEST, "mallory"]),
        owner=st.sampled_from(HONEST),
        pick=st.integers(0, 7),
    )
    def subscribe_changes(self, observer: str, owner: str, pick: int) -> None:
        """Anybody may observe a data object's changes."""
        o_actor, owner_actor = self.a(observer), self.a(owner)
        if not (o_actor.state == "live" and owner_actor.objects):
            return
        stream = owner_actor.objects[pick % len(owner_actor.objects)] + "/changes"

        async def go() -> None:
            answer = await self._request(
                o_actor, SM, "subscribe", {"resources": [stream]}, what="subscribe to changes"
            )
            assert self.code(answer) == 200, f"{observer}: subscription to {stream}: {answer}"
            self.model.subscribers.setdefault(stream, set()).add(observer)

        self.run(go())

    @rule(observer=st.sampled_from([*HONEST, "mallory"]), pick=st.integers(0, 7))
    def unsubscribe_changes(self, observer: str, pick: int) -> None:
        o_actor = self.a(observer)
        streams = sorted(s for s, who in self.model.subscribers.items() if observer in who)
        if not (o_actor.state == "live" and streams):
            return
        stream = streams[pick % len(streams)]

        async def go() -> None:
            answer = await self._request(
                o_actor, SM, "unsubscribe", {"resources": [stream]}, what="unsubscribe"
            )
            assert self.code(answer) == 200, f"{observer}: unsubscribe {stream}: {answer}"
            self.model.subscribers[stream].discard(observer)

        self.run(go())

    @rule(name=st.sampled_from(HONEST), pick=st.integers(0, 7))
    def release(self, name: str, pick: int) -> None:
        """A runtime lets one of its addresses go."""
        actor = self.a(name)
        if not (actor.state == "live" and actor.addresses):
            return
        address = actor.addresses[pick % len(actor.addresses)]
        if not (address not in actor.registered):
            return

        async def go() -> None:
            answer = await self._request(
                actor, HYPERTY_ALLOCATION, "delete", {"resource": address}, what="release"
            )
            assert self.code(answer) == 200, f"{name}: release of {address}: {answer}"
            for kept in (actor.hyperties, actor.objects):
                if address in kept:
                    kept.remove(address)
            self.model.released.add(address)
            for s in self.model.sent.values():
                if name in s.must and (s.to == address or s.to.startswith(address + "/")):
                    s.excused.add(name)

        self.run(go())

    @rule(name=st.sampled_from(HONEST))
    def register(self, name: str) -> None:
        """A runtime registers one of its hyperties in the built-in registry."""
        actor = self.a(name)
        todo = [h for h in actor.hyperties if h not in actor.registered]
        if not (actor.state == "live" and todo):
            return
        hyperty = todo[0]

        async def go() -> None:
            answer = await self._request(
                actor, REGISTRY, "create", _hyperty(hyperty, actor.url, name), what="register"
            )
            assert self.code(answer) == 200, f"{name}: registering {hyperty}: {answer}"
            actor.registered.append(hyperty)
            self.model.registry[hyperty] = name

        self.run(go())

    @rule(name=st.sampled_from(HONEST))
    def drop(self, name: str) -> None:
        """The socket closes without `disconnect` (a network loss): the session is kept."""
        actor = self.a(name)
        if actor.state != "live":
            return
        assert actor.rt is not None
        self.run(actor.rt.drop())
        actor.state = "away"

    @rule(name=st.sampled_from(HONEST), fresh=st.booleans())
    def come_back(self, name: str, fresh: bool) -> None:
        """An away runtime reconnects (the same stub instance) or reloads (a new one, with the
        token and delivery number it kept): its session resumes."""
        actor = self.a(name)
        if actor.state != "away":
            return
        # A reloaded page has lost what its stub had not got acknowledged: only reload one
        # that had nothing outstanding.
        if fresh and actor.rt is not None and actor.rt.unacked:
            return
        self.run(self._connect(actor, fresh=fresh, expect="resumed"))

    @rule(name=st.sampled_from(HONEST))
    def reload(self, name: str) -> None:
        """A live runtime's page reloads: a new stub instance takes its session over."""
        actor = self.a(name)
        if not (actor.state == "live" and actor.rt is not None and not actor.rt.unacked):
            return
        self.run(self._connect(actor, fresh=True, expect="resumed"))

    @rule(name=st.sampled_from(HONEST))
    def disconnect(self, name: str) -> None:
        """A clean `disconnect`: the session and its addresses are released."""
        actor = self.a(name)
        if actor.state != "live":
            return
        assert actor.rt is not None
        rt = actor.rt

        async def go() -> None:
            await wait_for(lambda: not rt.unacked, SETTLE)
            await rt.disconnect()

        self.run(go())
        actor.state = "released"
        self.model.released_session(actor)
        for h in actor.registered:
            self.model.registry.pop(h, None)
        actor.registered = []

    @rule(name=st.sampled_from(HONEST))
    def connect_anew(self, name: str) -> None:
        """A runtime that never connected, or disconnected, connects: a new session."""
        actor = self.a(name)
        if actor.state not in ("none", "released"):
            return
        self.run(self._connect(actor, fresh=True, expect="new"))

    # -- the hostile runtime ----------------------------------------------------------------

    def _victim_addresses(self) -> list[str]:
        out = []
        for name in HONEST:
            v = self.a(name)
            out += [v.url, *v.addresses, *(f"{o}/subscription" for o in v.objects)]
            out.append(f"user://gmail.com/{name}")
        out += sorted(self.model.released)
        out += [REGISTRY, f"domain://msg-node.{D}/sm", "global://registry/"]
        out += [f"runtime://other.example/{self.model.run}-x"]
        out += list(FORBIDDEN_ADDRESSES)
        return out

    @precondition(lambda self: "forge_from" not in SKIPPED)
    @rule(pick=st.integers(0, 200), spelled=st.integers(0, 5), dest=st.sampled_from(HONEST))
    def forge_from(self, pick: int, spelled: int, dest: str) -> None:
        """Mallory speaks from an address that is not its own (any spelling of it)."""
        victims = self._victim_addresses()
        frm = victims[pick % len(victims)]
        if spelled:
            frm = spellings(frm)[spelled - 1]
        self.forge(frm, dest)

    def forge(self, frm: str, dest: str) -> None:
        m, t = self.mallory, self.a(dest)
        if m.state != "live" or not t.hyperties:
            return
        s = self.model.expect(
            m, frm, t.hyperties[0], refused=True, what=f"mallory speaking from {frm!r}"
        )
        self.run(self._send(m, s))

    @precondition(lambda self: "mallory_subscribes" not in SKIPPED)
    @rule(pick=st.integers(0, 200), spelled=st.integers(0, 5))
    def mallory_subscribes(self, pick: int, spelled: int) -> None:
        """Mallory subscribes to what is not a stream: somebody's hyperty, runtimeURL, object,
        request channel, a user, an address let go, nobody's address (any spelling)."""
        m = self.mallory
        if m.state != "live":
            return
        victims = self._victim_addresses()
        target = victims[pick % len(victims)]
        if spelled:
            target = spellings(target)[spelled - 1]

        async def go() -> None:
            answer = await self._request(
                m, SM, "subscribe", {"resources": [target]}, what=f"mallory subscribing {target!r}"
            )
            code = self.code(answer)
            assert isinstance(code, int) and code >= 400, (
                f"mallory was let subscribe to {target!r}: {answer}"
            )

        self.run(go())

    @precondition(lambda self: "mallory_connects_as" not in SKIPPED)
    @rule(name=st.sampled_from(HONEST), how=st.sampled_from(["v1", "v2", "own-token"]))
    def mallory_connects_as(self, name: str, how: str) -> None:
        """Mallory connects with a victim's runtimeURL, without the victim's credential."""
        v = self.a(name)
        if self.mallory.state != "live":
            return
        if not (v.session_alive or (v.state == "released" and v.registered)):
            return

        async def go() -> None:
            rt = self.runtime(v.url, [])
            self.extra.append(rt)
            if how == "own-token":
                rt.token = self.mallory.token
            try:
                if how == "v2":
                    rt.acked = False
                    await rt.connect("v2")
                    answer: dict[str, Any] = {"response": 200}
                else:
                    await rt.connect()
                    answer = rt.connect_answer or {}
            except aiohttp.WSServerHandshakeError as exc:
                answer = {"response": exc.status}
            await _close(rt)
            assert answer.get("response") != 200, (
                f"mallory took {name}'s runtimeURL ({v.state}) with {how}: {answer}"
            )
            if v.state == "live":
                assert v.rt is not None and v.rt.close_code is None, (
                    f"{name}'s live connection was closed ({v.rt.close_code if v.rt else None})"
                )

        self.run(go())

    @precondition(lambda self: "mallory_registry" not in SKIPPED)
    @rule(name=st.sampled_from(HONEST), op=st.sampled_from(["create", "name", "update", "delete"]))
    def mallory_registry(self, name: str, op: str) -> None:
        """Mallory registers a victim's hyperty, or one of its own naming the victim's runtime,
        or updates or deletes the victim's entry: all refused; discovery names the victim."""
        v, m = self.a(name), self.mallory
        if not (m.state == "live" and m.hyperties):
            return
        if op == "create":
            if not (v.hyperties):
                return
            body: Any = _hyperty(v.hyperties[0], m.url, "mallory")
        elif op == "name":
            body = _hyperty(m.hyperties[0], v.url, name)
        else:
            if not (v.registered):
                return
            resource = v.registered[0]
            body = {"resource": resource}
            if op == "update":
                body["value"] = {"p2pHandler": f"{m.url}/p2p", "status": "live"}

        async def go() -> None:
            type_ = "update" if op == "update" else "delete" if op == "delete" else "create"
            answer = await self._request(m, REGISTRY, type_, body, what=f"mallory registry {op}")
            code = self.code(answer)
            assert isinstance(code, int) and code >= 400, f"mallory's registry {op}: {answer}"
            await self._registry_holds()

        self.run(go())

    async def _registry_holds(self) -> None:
        """Every entry the model knows names the runtime that registered it."""
        reader = next((a for a in self.model.actors.values() if a.state == "live"), None)
        if reader is None:
            return
        for hyperty, owner in sorted(self.model.registry.items()):
            answer = await self._request(
                reader, REGISTRY, "read", {"resource": hyperty}, what="registry read"
            )
            assert self.code(answer) == 200, f"registry entry {hyperty} of {owner}: {answer}"
            value = answer["body"]["value"]
            assert value.get("runtime") == self.a(owner).url, (
                f"registry entry {hyperty} names {value.get('runtime')!r}, not {owner}'s runtime"
            )

    @precondition(lambda self: "mallory_releases" not in SKIPPED)
    @rule(name=st.sampled_from(HONEST), pick=st.integers(0, 7))
    def mallory_releases(self, name: str, pick: int) -> None:
        """Mallory deletes a victim's allocation."""
        v, m = self.a(name), self.mallory
        if not (m.state == "live" and v.addresses):
            return
        address = v.addresses[pick % len(v.addresses)]

        async def go() -> None:
            answer = await self._request(
                m, HYPERTY_ALLOCATION, "delete", {"resource": address}, what="mallory releases"
            )
            code = self.code(answer)
            assert isinstance(code, int) and code >= 400, f"mallory released {address}: {answer}"

        self.run(go())

    @precondition(lambda self: "mallory_answers" not in SKIPPED)
    @rule(pick=st.integers(0, 50), spelled=st.integers(0, 5))
    def mallory_answers(self, pick: int, spelled: int) -> None:
        """Mallory forges the answer to an honest runtime's request to another runtime."""
        m = self.mallory
        if not (m.state == "live" and self.asked):
            return
        s = self.asked[pick % len(self.asked)]
        frm = [s.to, REGISTRY, *spellings(REGISTRY), *spellings(s.to)][spelled]
        forged = {
            "id": s.id,
            "type": "response",
            "from": frm,
            "to": s.frm,
            "body": {"code": 200, "value": "forged"},
        }
        self.model.forged.add(s.id)
        assert m.rt is not None
        self.run(m.rt.send(forged))

    @precondition(lambda self: "poison" not in SKIPPED)
    @rule(depth=st.sampled_from([900, 1000]))
    def poison(self, depth: int) -> None:
        """Issue 41 row 1: a float id and a deep body, to an address that goes away before
        delivery, while the honest runtimes send to each other."""
        m = self.mallory
        if not (m.state == "live" and m.hyperties):
            return
        senders = [self.a(n) for n in HONEST if self.live(n)]
        targets = [a for a in senders if a.hyperties]
        if not (targets):
            return

        async def go() -> None:
            doomed = await self._allocate(m, "hyperty")
            # As text: orjson (the client's) writes at most 255 levels; the node's parser reads
            # 1,024.
            deep = "[" * depth + '"x"' + "]" * depth
            poison = (
                f'{{"id":1.5,"type":"ping","from":"{m.hyperties[0]}","to":"{doomed}",'
                f'"body":{{"deep":{deep}}}}}'
            )
            assert m.rt is not None
            pairs = []
            for sender in senders:
                others = [t for t in targets if t is not sender]
                if others:
                    pairs.append((sender, others[0]))

            async def honest(tag: str) -> None:
                for sender, target in pairs:
                    s = self.model.expect(
                        sender,
                        sender.hyperties[0] if sender.hyperties else sender.url,
                        target.hyperties[0],
                        refused=False,
                        must={target.name},
                        what=f"honest {tag} a poison ({sender.name}->{target.name})",
                    )
                    await self._send(sender, s)

            # The first message goes to the homeserver alone; what queues behind it (the poison,
            # then the honest messages) travels in the next event together.
            await honest("before")
            await m.rt.send(poison)
            await honest("beside")
            released = await self._request(
                m, HYPERTY_ALLOCATION, "delete", {"resource": doomed}, what="poison release"
            )
            assert self.code(released) == 200, f"mallory could not let {doomed} go: {released}"
            m.hyperties.remove(doomed)
            self.model.released.add(doomed)
            # Mallory's own message must come to something too: delivered (before the
            # release) or answered 404 (its destination left, docs/stub-protocol.md).
            came = await wait_for(
                lambda: any(isinstance(x, dict) and x.get("id") == 1.5 for x in m.seen), SETTLE
            )
            assert came, (
                "mallory's message (id 1.5, body nested deep) to its released hyperty was "
                f"neither delivered nor answered within {SETTLE} s: lost silently"
            )

        self.run(go())

    @precondition(lambda self: self.mallory.state == "live" and "session_flood" not in SKIPPED)
    @rule()
    def session_flood(self) -> None:
        """Issue 41 rows 3 and 5: fresh runtimeURLs, each allocating and leaving."""

        async def go() -> None:
            for _ in range(FLOOD):
                url = f"runtime://{D}/{self.model.run}-flood-{guid()[:8]}"
                rt = self.runtime(url, [])
                self.extra.append(rt)
                try:
                    await rt.connect()
                    if (rt.connect_answer or {}).get("response") == 200:
                        await rt.send(
                            {
                                "id": f"mallory:f{len(self.extra)}",
                                "type": "create",
                                "from": f"{url}/registry",
                                "to": HYPERTY_ALLOCATION,
                                "body": {"scheme": "hyperty", "value": {"number": 3}},
                            }
                        )
                        await wait_for(lambda rt=rt: bool(rt.seen), SETTLE)
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await _close(rt)

        self.run(go())

    @precondition(lambda self: "fill_inbox" not in SKIPPED)
    @rule(name=st.sampled_from(HONEST), size=st.sampled_from([20_000, 40_000]))
    def fill_inbox(self, name: str, size: int) -> None:
        """Issue 41 row 7: mallory fills an away runtime's inbox; honest senders must still be
        heard (a fair share), so the model expects their messages delivered."""
        v, m = self.a(name), self.mallory
        if not (v.state == "away" and v.hyperties and m.state == "live" and m.hyperties):
            return

        async def go() -> None:
            for _ in range(4):
                s = self.model.expect(
                    m,
                    m.hyperties[0],
                    v.hyperties[0],
                    refused=None,
                    must={name},
                    what=f"mallory's bulk to {name}",
                )
                await self._send(m, s, body={"n": s.n, "bulk": "x" * size})

        self.run(go())

    @precondition(lambda self: not self.idle and "idle_sockets" not in SKIPPED)
    @rule()
    def idle_sockets(self) -> None:
        """Issue 41 row 4: sockets that never send `connect`, as many as the node takes."""

        async def go() -> None:
            self.idle_session = aiohttp.ClientSession()
            for _ in range(IDLE_SOCKETS):
                try:
                    self.idle.append(
                        await self.idle_session.ws_connect(
                            self.stub_url(), headers={"X-Forwarded-For": MALLORY_HOST}
                        )
                    )
                except aiohttp.ClientError:
                    break

        self.run(go())

    # -- faults -----------------------------------------------------------------------------

    async def _exchange(self, what: str, *, refused: bool | None, count: int) -> None:
        """Each live honest runtime sends ``count`` messages to the first hyperty of each other
        honest runtime that has one and a session (live or away): each must be delivered once
        (``refused`` False), or delivered or refused but not both (None)."""
        for sender in [self.a(n) for n in HONEST if self.live(n)]:
            frm = sender.hyperties[0] if sender.hyperties else sender.url
            for target in [self.a(n) for n in HONEST if n != sender.name]:
                if not (target.session_alive and target.hyperties):
                    continue
                to = target.hyperties[0]
                receivers = self.model.receivers(to)
                for _ in range(count):
                    s = self.model.expect(
                        sender,
                        frm,
                        to,
                        refused=refused,
                        must=receivers,
                        what=f"{what} ({sender.name}->{target.name})",
                    )
                    s.either = refused is None
                    await self._send(sender, s)

    async def _reconnect_all(self) -> None:
        """After the node came back: every runtime that was live connects again with its token
        (the same stub instance, which sends again what the node had not acknowledged)."""
        self.idle = []
        for actor in self.model.actors.values():
            if actor.state == "live":
                assert actor.rt is not None
                await actor.rt.drop()
                await self._connect(actor, fresh=False, expect="resumed")

    @precondition(lambda self: "restart_node" not in SKIPPED)
    @rule()
    def restart_node(self) -> None:
        """The node stops (gracefully) and starts again on its database: runtimes reconnect
        with their tokens and resume; nothing is lost."""

        async def go() -> None:
            assert self.node is not None
            await self.node.stop()
            self.node = Node(self.ctx.homeserver.node_config(self.database, **LIMITS))
            await self.node.start()
            await self._reconnect_all()

        self.run(go())

    @precondition(lambda self: "kill_node" not in SKIPPED)
    @rule(burst=st.integers(0, 2))
    def kill_node(self, burst: int) -> None:
        """The node dies as by SIGKILL (its stub sockets cut, nothing flushed, no final
        checkpoint) right after honest runtimes sent to each other, and starts again on its
        database: every session resumes, and every message is delivered once, in order —
        what the node had acknowledged from what it stored, the rest sent again by the stubs.
        A stub's filter may drop a delivery the node sends again (allowed after a crash); a
        message handed to a runtime twice is a broken promise."""

        async def go() -> None:
            assert self.node is not None
            await self._exchange("sent as the node is killed", refused=False, count=burst)
            await kill(self.node)
            self.model.crashed = True
            self.node = Node(self.ctx.homeserver.node_config(self.database, **LIMITS))
            await self.node.start()
            await self._reconnect_all()

        self.run(go())

    @precondition(lambda self: "restart_synapse" not in SKIPPED)
    @rule(how=st.sampled_from(["SIGKILL", "SIGTERM"]), burst=st.integers(0, 2))
    def restart_synapse(self, how: str, burst: int) -> None:
        """The homeserver is killed (or stopped) and started again while honest runtimes send:
        nothing is lost or refused, nothing arrives twice."""
        process = self.ctx.homeserver.process

        async def go() -> None:
            try:
                await stop_homeserver(process, signal.Signals[how])
                await self._exchange("sent while Synapse is down", refused=False, count=burst)
            finally:
                await start_homeserver(process)

        self.run(go())

    @precondition(lambda self: "database_outage" not in SKIPPED)
    @rule(seconds=st.sampled_from([1.0, 7.0]), burst=st.integers(1, 2))
    def database_outage(self, seconds: float, burst: int) -> None:
        """The node's database is away (another process holds SQLite's write lock, for 7 s
        longer than the node's busy timeout) while honest runtimes send to each other, live or
        away: each message is delivered once or answered with a coded error (503), never
        both, never lost."""
        away = DatabaseAway(self.database)

        async def go() -> None:
            await away.begin()
            try:
                await self._exchange("sent while the database is away", refused=None, count=burst)
                await asyncio.sleep(seconds)
            finally:
                await away.end()

        self.run(go())


async def _close(rt: SeeingRuntime) -> None:
    """Close a runtime's socket and its client session, whatever state either is in."""
    with contextlib.suppress(Exception):
        await rt.drop()
    if rt.session is not None:
        with contextlib.suppress(Exception):
            await rt.session.close()
        rt.session = None


def _hyperty(url: str, runtime: str, user: str) -> dict[str, Any]:
    return {
        "value": {
            "user": f"user://{D}/{user}",
            "descriptor": "hyperty-catalogue://catalogue.mn.test/.well-known/hyperty/Chat",
            "url": url,
            "expires": 120,
            "resources": ["chat"],
            "dataSchemes": ["comm"],
            "runtime": runtime,
            "status": "live",
        },
        "policy": "policy",
    }


# Beyond the budget: the last example's steps, and shrinking a failure (minutes on a real node).
@pytest.mark.timeout(int(BUDGET) + 1500)
async def test_the_node_keeps_the_domains_promises(
    homeserver: Homeserver, databases: Databases
) -> None:
    """The model against the real node, for the time budget (RETHINK_MODEL_SECONDS)."""
    seed = fuzz_seed()
    print(
        f"domain model: seed {seed} (RETHINK_FUZZ_SEED={seed}), budget {BUDGET:.0f} s, "
        f"rules left out: {', '.join(sorted(SKIPPED)) or 'none'}",
        flush=True,
    )
    DomainMachine.ctx = Context(
        asyncio.get_running_loop(), homeserver, databases, time.monotonic() + BUDGET
    )
    DomainMachine.examples = DomainMachine.steps = 0
    DomainMachine.totals = {}
    started = time.monotonic()
    try:
        rounds = await asyncio.to_thread(
            run_for_budget,
            DomainMachine,
            "domain model",
            seed,
            DomainMachine.ctx.deadline,
            model_settings(ROUND, STEPS, SHRINK),
        )
    finally:
        print(f"domain model: messages {DomainMachine.totals}", flush=True)
    print(
        f"domain model: {rounds} rounds, {DomainMachine.examples} examples, "
        f"{DomainMachine.steps} steps in {time.monotonic() - started:.0f} s, no promise broken"
    )


# -- what the model found, kept as regression tests ------------------------------------------
#
# Each replays, step by step, a failing example the model found (shrunk by hand to its steps),
# on a fresh node: each failed on the main it was found on (issues 41 and 42), and passes since
# their fixes.


async def _replay(
    homeserver: Homeserver, databases: Databases, *steps: tuple[str, dict[str, Any]]
) -> None:
    DomainMachine.ctx = Context(
        asyncio.get_running_loop(), homeserver, databases, time.monotonic() + 3600
    )

    def run() -> None:
        machine = DomainMachine()
        try:
            machine.start()
            machine.promises_hold()
            for name, arguments in steps:
                getattr(machine, name)(**arguments)
                machine.promises_hold()
        finally:
            machine.teardown()

    await asyncio.to_thread(run)


async def test_an_away_runtimes_session_outlives_a_session_flood(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Issue 41 row 5, as the model found it: carol's socket drops, mallory opens fresh
    sessions beyond `stub.max_detached_sessions`, carol comes back with her token — and must
    resume (with what was kept for her)."""
    await _replay(
        homeserver,
        databases,
        ("drop", {"name": "carol"}),
        ("session_flood", {}),
        ("come_back", {"name": "carol", "fresh": False}),
    )


async def test_a_session_flood_never_frees_an_away_runtimes_url(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Issue 41 row 5 opening an issue-42 takeover, as the model found it: alice's socket
    drops, a session flood evicts her session, and with it her claim on her runtimeURL:
    mallory connects with it and gets `200 new`."""
    await _replay(
        homeserver,
        databases,
        ("drop", {"name": "alice"}),
        ("session_flood", {}),
        ("mallory_connects_as", {"name": "alice", "how": "v1"}),
    )


async def test_a_session_flood_from_one_host_never_frees_another_hosts_unused_session(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Issue 41 row 5, as the model found it once the flood's sessions each sent a request:
    dave connects and drops before sending anything, and the node, over its bound on detached
    sessions, let his session go (never used goes first) and with it his runtimeURL."""
    await _replay(
        homeserver,
        databases,
        ("drop", {"name": "alice"}),
        ("session_flood", {}),
        ("connect_anew", {"name": "dave"}),
        ("drop", {"name": "dave"}),
        ("mallory_connects_as", {"name": "dave", "how": "v1"}),
    )


async def test_idle_sockets_never_keep_a_runtime_out(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Issue 41 row 4, as the model found it: sockets that never send `connect`, as many as
    `stub.max_connections`, and dave (retrying with back-off for the settle bound) never gets
    in."""
    await _replay(
        homeserver,
        databases,
        ("idle_sockets", {}),
        ("connect_anew", {"name": "dave"}),
    )


async def test_nobody_speaks_from_this_domains_bare_stub_host(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Found by the model on main: mallory sends `from: hyperty-runtime://mn.test` (the bare
    stub host of this domain: no stub's URL, `hyperty-runtime://<domain>/protostub/<n>`, and the
    older runtimeURL form's parent) and the node delivers it to bob instead of refusing 403:
    the node learns it as mallory's route."""
    await _replay(
        homeserver, databases, ("forge", {"frm": f"hyperty-runtime://{D}", "dest": "bob"})
    )


async def test_a_poisoned_message_harms_no_other(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Issue 41 row 1 as the model drives it: a message with a float id and a body nested
    1,000 deep, to mallory's own hyperty that it lets go before delivery, in one event with
    honest messages: each honest message must still arrive, and mallory must be answered 404.
    On this main the honest messages arrive, but the answer's re-parse of the frame raises
    RecursionError, the lane event's delivery fails three times, and mallory hears nothing."""
    await _replay(homeserver, databases, ("poison", {"depth": 1000}))


async def test_a_graceful_restart_costs_no_live_runtime_its_session(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Found by the model while fixing issue 43: alice is away, mallory's flood leaves the
    detached sessions at their bound, dave connects (and sends nothing yet), the node stops
    gracefully: closing every socket detached each live runtime's session in turn, and the
    bound let the newest never used go, dave's. He came back to the next start with his token
    and got a new session."""
    await _replay(
        homeserver,
        databases,
        ("drop", {"name": "alice"}),
        ("session_flood", {}),
        ("connect_anew", {"name": "dave"}),
        ("restart_node", {}),
    )


async def test_a_full_inbox_still_takes_an_honest_senders_message(
    homeserver: Homeserver, databases: Databases
) -> None:
    """Issue 41 row 7 as the model drives it: bob is away, mallory fills his inbox
    (`quotas.waiting_bytes`), alice's small message to bob must still be taken and delivered
    when he is back."""
    await _replay(
        homeserver,
        databases,
        ("drop", {"name": "bob"}),
        ("fill_inbox", {"name": "bob", "size": 40_000}),
        ("send", {"sender": "alice", "dest": "bob", "kind": "hyperty", "pick": 0, "count": 1}),
        ("come_back", {"name": "bob", "fresh": False}),
    )

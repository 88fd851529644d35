"""A model of one domain's promises, and the runtimes that check the real node against it.

The model (``Domain``) holds what the node promises (docs/stub-protocol.md, "Who may do what";
DESIGN §10, the trust model):

- **who owns each address**: a runtimeURL is its credential holder's; hyperty and object
  addresses are the runtime's the node allocated them to, or that claimed a GUID of its own
  making first; a released address is nobody's (and nobody takes it up again);
- **who may receive what**: the holder receives what is sent to its addresses; subscribers
  receive a data object's changes; nobody else receives anything;
- **what every attempted message comes to**: delivered once to each rightful receiver, in order
  per sender, or answered to its sender with a coded error; never lost silently, never
  duplicated, never delivered to anyone else;
- **what the registry holds**: an entry names the runtime that registered it.

``Actor`` is one runtime as the model knows it (its runtimeURL, its credential, what it
holds), with every message any of its stub instances was handed (``seen``): the invariants are
checked against what the runtimes actually saw, never against the node's own view.

Message ids carry their real sender (``<actor>:<n>``): whatever a hostile runtime writes in
``from``, the model knows who sent what. The state machine that drives a real node with these is
tests/integration/test_domain_model.py."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .runtime import PyRuntime

D = "mn.test"
SM = f"domain://msg-node.{D}/sm"
REGISTRY = f"domain://registry.{D}"
HYPERTY_ALLOCATION = f"domain://msg-node.{D}/hyperty-address-allocation"
OBJECT_ALLOCATION = f"domain://msg-node.{D}/object-address-allocation"


class SeeingRuntime(PyRuntime):
    """A PyRuntime that also appends everything it hands on to its actor's log, which outlives
    the stub instance (a reload is a new instance for the same runtime)."""

    def __init__(self, stub_url: str, runtime_url: str, seen: list[Any]) -> None:
        super().__init__(stub_url, runtime_url, acked=True)
        self.seen = seen
        # The model counts duplicates itself, across instances; the autouse per-test check of
        # tests/integration/conftest.py would only repeat it.
        self.twice_allowed = True

    async def _hand_on(self, message: Any) -> None:
        self.seen.append(message)
        await super()._hand_on(message)


@dataclass
class Actor:
    """One runtime of the model. ``state``: ``none`` (never connected), ``live``, ``away``
    (socket closed without `disconnect`: its session and what is sent to it are kept),
    ``released`` (clean `disconnect`: nothing of the session is kept, the token stays its
    credential)."""

    name: str
    url: str
    honest: bool
    state: str = "none"
    rt: SeeingRuntime | None = None
    token: str | None = None
    seen: list[Any] = field(default_factory=list)
    hyperties: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    # Node-side filter drops across stub instances (the node sent again what the stub had).
    duplicates: int = 0

    @property
    def addresses(self) -> list[str]:
        return [*self.hyperties, *self.objects]

    @property
    def session_alive(self) -> bool:
        return self.state in ("live", "away")

    def answers_to(self, msg_id: Any) -> list[dict[str, Any]]:
        return [
            m
            for m in self.seen
            if isinstance(m, dict) and m.get("type") == "response" and m.get("id") == msg_id
        ]


@dataclass
class Sent:
    """One attempted message and what it must come to.

    ``must``: actors that must receive it, once. ``may``: actors that may (``must`` ⊆ ``may``).
    ``refused``: True, its sender must get a coded error answer (and nobody the message);
    False, no error answer; None, either (the node may decide). ``excused``: receivers whose
    session ended before they got it: the sender's 404 answer then meets their share."""

    id: str
    sender: str
    frm: str
    to: str
    n: int
    must: set[str]
    may: set[str]
    refused: bool | None
    excused: set[str] = field(default_factory=set)
    what: str = ""
    # False when `to` is spelled another way on purpose: the refusal may come from anywhere.
    canonical: bool = True
    # Sent while a fault was on (``refused`` None): delivered, or refused, never both (a sender
    # told "no" that sends again would make a duplicate of it).
    either: bool = False


def guid() -> str:
    return str(uuid.uuid4())


def spellings(address: str) -> list[str]:
    """Other spellings of one address, each of which the node must refuse (400): the scheme
    or host in capitals, a trailing dot on the host, a zero-width space, a NEL control."""
    scheme, rest = address.split("://", 1)
    host, _, path = rest.partition("/")
    tail = f"/{path}" if path else ""
    return [
        f"{scheme.upper()}://{host}{tail}",
        f"{scheme}://{host.upper()}{tail}",
        f"{scheme}://{host}.{tail}",
        f"{address}\u200b",
        f"{scheme}://{host}\u0085{tail}",
    ]


class Domain:
    """The model's state: actors, subscriptions, attempted messages, registry entries."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.actors: dict[str, Actor] = {}
        self.sent: dict[str, Sent] = {}
        self.counter = itertools.count(1)
        # subscribers of each stream address (actor names)
        self.subscribers: dict[str, set[str]] = {}
        self.released: set[str] = set()
        # registry entries: hyperty url -> the actor that registered it
        self.registry: dict[str, str] = {}
        # honest request ids whose answer mallory forged (its refusal carries that id)
        self.forged: set[str] = set()
        # a crash of the node allows a stub's filter to drop a delivery sent again
        self.crashed = False

    def actor(self, name: str, honest: bool) -> Actor:
        a = Actor(name, f"runtime://{D}/{self.run}-{name}", honest)
        self.actors[name] = a
        return a

    def next_id(self, sender: str) -> tuple[str, int]:
        n = next(self.counter)
        return f"{sender}:{n}", n

    # -- who owns what ---------------------------------------------------------------------

    def holder(self, address: str) -> Actor | None:
        """The actor holding ``address`` (its runtimeURL subtree, or an allocated or claimed
        address or anything under it), with a live or kept session."""
        for a in self.actors.values():
            if not a.session_alive:
                continue
            if address == a.url or address.startswith(a.url + "/"):
                return a
            for own in a.addresses:
                if address == own or address.startswith(own + "/"):
                    return a
        return None

    def object_of(self, address: str) -> str | None:
        for a in self.actors.values():
            for obj in a.objects:
                if address.startswith(obj + "/"):
                    return obj
        return None

    def receivers(self, to: str) -> set[str]:
        """Who must receive what is sent to ``to`` now."""
        if to.endswith("/changes") and self.object_of(to) is not None:
            return {s for s in self.subscribers.get(to, set()) if self.actors[s].session_alive}
        holder = self.holder(to)
        return {holder.name} if holder else set()

    def expect(
        self,
        sender: Actor,
        frm: str,
        to: str,
        *,
        refused: bool | None,
        must: Iterable[str] = (),
        may: Iterable[str] | None = None,
        what: str = "",
    ) -> Sent:
        msg_id, n = self.next_id(sender.name)
        must_set = set(must)
        sent = Sent(
            msg_id,
            sender.name,
            frm,
            to,
            n,
            must_set,
            set(may) if may is not None else set(must_set),
            refused,
            what=what,
        )
        sent.may |= sent.must
        self.sent[msg_id] = sent
        return sent

    def released_session(self, actor: Actor) -> None:
        """``actor`` disconnected cleanly: its addresses are let go, its subscriptions end, and
        what was on its way to it may be answered 404 to its sender instead."""
        self.released.update(actor.addresses)
        actor.hyperties, actor.objects = [], []
        for subs in self.subscribers.values():
            subs.discard(actor.name)
        for s in self.sent.values():
            if actor.name in s.must and not self.got(actor, s.id):
                s.excused.add(actor.name)

    # -- what the runtimes saw -------------------------------------------------------------

    @staticmethod
    def got(actor: Actor, msg_id: str) -> bool:
        return any(
            isinstance(m, dict) and m.get("id") == msg_id and m.get("type") != "response"
            for m in actor.seen
        )

    def error_answer(self, s: Sent) -> dict[str, Any] | None:
        for m in self.actors[s.sender].answers_to(s.id):
            code = (m.get("body") or {}).get("code")
            if isinstance(code, int) and code >= 400:
                return m
        return None

    def pending(self) -> list[str]:
        """What the model still waits for, now (bounded waits end when this is empty)."""
        out = []
        for s in self.sent.values():
            sender = self.actors[s.sender]
            answered = self.error_answer(s) is not None
            if s.refused is True and not answered and sender.state == "live":
                out.append(f"{s.id} ({s.what}): no error answer yet")
            for r in sorted(s.must):
                receiver = self.actors[r]
                if receiver.state != "live" or self.got(receiver, s.id):
                    continue
                if answered and (r in s.excused or s.refused is None):
                    continue
                out.append(f"{s.id} ({s.what}) from {s.frm} to {s.to}: not yet at {r}")
        for a in self.actors.values():
            if a.state == "live" and a.rt is not None and a.rt.unacked:
                out.append(f"{a.name}: {len(a.rt.unacked)} sent, not acknowledged")
        return out

    def violations(self) -> list[str]:
        """Promises broken by what the runtimes saw (no waiting: these never heal)."""
        out: list[str] = []
        for a in self.actors.values():
            counts: dict[str, int] = {}
            last_from: dict[str, int] = {}
            for m in a.seen:
                if not isinstance(m, dict) or "type" not in m:
                    continue  # a control frame ({cmd: …}), not a reTHINK message
                mid = m.get("id")
                if not isinstance(mid, str):
                    if a.honest:
                        out.append(f"{a.name} was handed a message nobody sent: {str(m)[:300]}")
                    continue  # mallory's own poison, or its answer
                if m.get("type") == "response" and not a.honest and mid in self.forged:
                    continue  # the refusal of a forged answer
                if m.get("type") == "response" and not (
                    isinstance(mid, str) and mid.split(":", 1)[0] in self.actors
                ):
                    continue  # an MN service answer to a request of the harness's own numbering
                if m.get("type") == "response":
                    out.extend(self._answer_violations(a, m))
                    continue
                s = self.sent.get(mid) if isinstance(mid, str) else None
                if s is None:
                    out.append(f"{a.name} was handed a message nobody sent: {str(m)[:300]}")
                    continue
                counts[s.id] = counts.get(s.id, 0) + 1
                if counts[s.id] == 2:
                    out.append(f"{a.name} was handed {s.id} ({s.what}) twice")
                if a.name not in s.may:
                    out.append(
                        f"{a.name} received {s.id} ({s.what}, from {s.frm!r} by {s.sender} to "
                        f"{s.to!r}), which was not for it (rightful: {sorted(s.may) or 'nobody'})"
                    )
                if self.actors[s.sender].honest:
                    prev = last_from.get(s.sender, 0)
                    if s.n < prev:
                        out.append(f"{a.name} received {s.sender}'s {s.id} after a later one")
                    last_from[s.sender] = max(prev, s.n)
            dropped = a.duplicates + (a.rt.duplicates if a.rt is not None else 0)
            if dropped and not self.crashed:
                out.append(f"{a.name}'s stub dropped {dropped} deliveries sent twice")
        for s in self.sent.values():
            err = self.error_answer(s)
            if s.either and err is not None:
                takers = [a.name for a in self.actors.values() if self.got(a, s.id)]
                if takers:
                    out.append(
                        f"{s.id} ({s.what}) was refused {err.get('body')}, yet reached {takers}"
                    )
            if s.refused is False and err is not None:
                out.append(f"{s.id} ({s.what}, {s.frm} -> {s.to}) was refused: {err.get('body')}")
            if s.refused is True:
                takers = [a.name for a in self.actors.values() if self.got(a, s.id)]
                if takers:
                    out.append(f"{s.id} ({s.what}) must be refused, yet reached {takers}")
        return out

    def tally(self) -> dict[str, int]:
        """What came of the attempted messages, for the run's summary: duplicates counted (a
        message handed to a runtime twice, which ``violations`` fails; and deliveries a stub's
        filter dropped, allowed only after a kill of the node)."""
        out = {"attempted": 0, "delivered": 0, "refused": 0, "handed twice": 0, "filter drops": 0}
        for s in self.sent.values():
            out["attempted"] += 1
            if self.error_answer(s) is not None:
                out["refused"] += 1
        for a in self.actors.values():
            counts: dict[str, int] = {}
            for m in a.seen:
                if isinstance(m, dict) and m.get("type") not in (None, "response"):
                    mid = m.get("id")
                    if isinstance(mid, str) and mid in self.sent:
                        counts[mid] = counts.get(mid, 0) + 1
            out["delivered"] += len(counts)
            out["handed twice"] += sum(n - 1 for n in counts.values())
            out["filter drops"] += a.duplicates + (a.rt.duplicates if a.rt is not None else 0)
        return out

    def _answer_violations(self, a: Actor, m: dict[str, Any]) -> list[str]:
        s = self.sent.get(m["id"])
        if s is None or s.sender != a.name:
            return [f"{a.name} was handed an answer to someone else's request: {str(m)[:300]}"]
        answers = a.answers_to(m["id"])
        out = []
        if len(answers) > 1 and answers[0] is m:
            out.append(f"{a.name}'s {s.id} ({s.what}) was answered {len(answers)} times: {answers}")
        if m.get("from") != s.to and s.canonical:
            out.append(
                f"{a.name}'s {s.id} ({s.what}) answered from {m.get('from')!r}, not {s.to!r}"
            )
        code = (m.get("body") or {}).get("code")
        if s.what.startswith("ask") and not (isinstance(code, int) and code >= 400):
            out.append(f"{a.name}'s {s.id} ({s.what}) got an answer nobody gave: {m}")
        return out


async def wait_for(predicate: Any, limit: float, step: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``limit`` seconds passed (a bound, not a threshold:
    a slower machine only waits longer)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while True:
        if predicate():
            return True
        if loop.time() >= end:
            return False
        await asyncio.sleep(step)

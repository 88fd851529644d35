"""Traffic between reTHINK domains: the trapezoid runtime A → node A → Matrix federation →
node B → runtime B, through rooms both domains' homeservers keep.

Each node writes what it sends to a peer domain into a room of its own for that peer (created
once, the peer's node invited; federated), and reads what the peer writes into the peer's room
for it. One writer per room: the room's order is the writer's order, so each runtime's messages
keep their order across, and nothing is set up per message. Outbound, a ``PeerLink`` batches
like a lane and acknowledges a runtime's message once this node's homeserver has persisted the
event (federation then carries it, retrying, to the peer). Inbound, a ``PeerFeed`` takes the
peer's events in order — from the homeserver's push, or read from the room when the push lost
some (each event carries its writer's consecutive number ``n``) or after a restart — and delivers
them here like a lane's, answering from this node: 404 for an address it does not know, 403
when a policy refuses. Another domain's subscription to an address of this one is recorded here;
an update to it then goes to that domain once, and its node fans it out to its subscribers.
docs/matrix-mapping.md has the design and its reasons.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog

from appservice.api import MatrixError
from appservice.intent import Intent

from .. import carrier
from ..carrier import LaneEncoder, Routed
from ..envelope import InvalidMessage, Message, address_domain, answer, parse
from ..observability import NodeMetrics
from ..routing_table import RoutingTable
from ..services.base import MnService, Requester, ServiceReply
from ..services.registry import domain_registry_address, is_service_address, node_addresses
from ..storage.remote import RemoteSubscriptionStore
from .delivery import Delivery
from .lanes import Outgoing, StreamOutbox
from .peers import Peer, PeerRefused, Peers
from .policy import PolicyEngine
from .publisher import Publisher
from .rooms import RoomDirectory
from .settlement import Settlement
from .stream import BatchStream, StreamLimits, Traffic

log = structlog.get_logger(__name__)

PAGE = 100
# A peer's node asks to be sent what is published to these addresses, or not any more.
SUBSCRIBE, UNSUBSCRIBE = "subscribe", "unsubscribe"
# How long a subscription to another domain's address waits for that domain's node to confirm
# it before the runtime is answered anyway (below the runtime's own 15 s request timeout).
SUBSCRIPTION_CONFIRM_SECONDS = 5.0
# How long a new room to a peer holds its first events while the peer's node joins it.
PEER_JOIN_WAIT_SECONDS = 10.0


def _number(content: Any) -> int:
    n = content.get("n") if isinstance(content, dict) else None
    return n if isinstance(n, int) else 0


# -- outbound -----------------------------------------------------------------------------------


class PeerLink(StreamOutbox):
    """This node's stream to one peer domain's node."""

    def __init__(
        self,
        peer: Peer,
        rooms: RoomDirectory,
        bot: Intent,
        metrics: NodeMetrics,
        limits: StreamLimits,
        traffic: Traffic,
    ) -> None:
        self.peer = peer
        self._rooms = rooms
        self._bot = bot
        self.ready = asyncio.Event()
        self._n = 0
        self.stream: BatchStream[Outgoing] = BatchStream(
            f"to-{peer.domain}",
            LaneEncoder(),
            self._header,
            self._target,
            metrics,
            limits,
            on_sent=self._on_sent,
            traffic=traffic,
            ready=self.ready,
        )

    def _header(self) -> dict[str, Any]:
        self._n += 1
        return {"n": self._n}

    async def _target(self, refresh: bool) -> tuple[Intent, str]:
        return await self._rooms.to_peer(self.peer.domain, self.peer.bot, refresh)

    @staticmethod
    def _on_sent(batch: list[Outgoing], _event_id: str) -> None:
        # Persisted on this node's homeserver: federation takes it from here, retrying.
        for item in batch:
            item.done()

    async def start(self) -> None:
        """Find (or create) the room and continue its numbering, then open for sending."""
        delay = 0.25
        while True:
            try:
                _intent, room_id = await self._target(False)
                page = await self._bot.messages(
                    room_id,
                    direction="b",
                    limit=1,
                    event_filter={"types": [carrier.BATCH_EVENT], "senders": [self._bot.user_id]},
                )
                self._n = max((_number(e.get("content")) for e in page["chunk"]), default=0)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the homeserver may not be up yet
                log.warning("peer link not ready; retrying", peer=self.peer.domain, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        await self._await_peer_join()
        self.ready.set()
        log.info("peer link ready", peer=self.peer.domain, last_event=self._n)

    async def _await_peer_join(self) -> None:
        """Hold the first events until the peer's bot has joined (at once for a room it is
        in). What a room receives before a server joins reaches that server only as history
        it must fetch, never in the homeserver's push: sending after the join keeps the push
        the path of every event. Bounded, for a peer whose node is away: then its node finds
        those events reading the room when it joins."""
        deadline = asyncio.get_running_loop().time() + PEER_JOIN_WAIT_SECONDS
        delay = 0.05
        while asyncio.get_running_loop().time() < deadline:
            try:
                _intent, room_id = await self._target(False)
                if self.peer.bot in await self._bot.joined_members(room_id):
                    return
            except MatrixError as exc:
                log.warning("peer membership unknown", peer=self.peer.domain, error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        log.warning("peer has not joined yet; sending anyway", peer=self.peer.domain)


class Federation:
    """The links to peer domains, made on first use."""

    def __init__(
        self,
        peers: Peers,
        rooms: RoomDirectory,
        bot: Intent,
        metrics: NodeMetrics,
        limits: StreamLimits,
        traffic: Traffic,
    ) -> None:
        self.peers = peers
        self._rooms = rooms
        self._bot = bot
        self._metrics = metrics
        self._limits = limits
        self._traffic = traffic
        self._links: dict[str, PeerLink] = {}
        self._starting: set[asyncio.Task[None]] = set()

    async def link(self, domain: str) -> PeerLink:
        """The stream to ``domain``; raises PeerRefused (403, 404, 504)."""
        link = self._links.get(domain)
        if link is None:
            peer = await self.peers.resolve(domain)
            link = self._links.get(domain)
            if link is None:
                link = self._links[domain] = PeerLink(
                    peer, self._rooms, self._bot, self._metrics, self._limits, self._traffic
                )
                task = asyncio.create_task(link.start(), name=f"peer-link-{domain}")
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)
        return link

    async def flush(self, timeout: float) -> None:
        await asyncio.gather(*(link.stream.flush(timeout) for link in self._links.values()))

    async def close(self) -> None:
        for task in self._starting:
            task.cancel()
        for link in self._links.values():
            await link.stream.close()


# -- inbound ------------------------------------------------------------------------------------


class PeerFeed:
    """One peer's room for this node: its events delivered here strictly in the order of the
    writer's numbers ``n`` (consecutive), however they arrive.

    The push brings most events. An event that arrives early (its predecessors are missing:
    the push lost them at a restart of the homeserver, or the homeserver has not fetched them
    over federation yet) is held; the missing ones are looked for in the room, reading it
    backwards from its newest event (which makes Synapse fetch what it lacks from the peer's
    server), again and again with back-off until the gap is filled. Nothing is skipped."""

    def __init__(
        self,
        room_id: str,
        peer: Peer,
        position: str | None,
        handle: Callable[[dict[str, Any]], Awaitable[None]],
        bot: Intent,
        last_n: int = 0,
    ) -> None:
        self.room_id = room_id
        self.peer = peer
        self._position = position  # the last event handled (recovery starts after it)
        self._handle = handle
        self._bot = bot
        self._filter = {"types": [carrier.BATCH_EVENT], "senders": [peer.bot]}
        self._last_n = last_n
        self._queue: deque[dict[str, Any]] = deque()
        self._held: dict[int, dict[str, Any]] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def push(self, events: list[dict[str, Any]]) -> None:
        self._queue.extend(events)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"peer-feed-{self.peer.domain}")

    def start_here(self) -> None:
        """Take pushed events from now on, without reading what the room held before (a room
        this node's database did not know: its history was for another database's sessions)."""
        self._ready.set()

    async def start(self) -> None:
        """Read what the room holds after the last event handled (everything, for a room just
        joined), then take pushed events."""
        delay = 0.25
        while True:
            try:
                if self._position is None:
                    # Just joined: what the peer sent before the join is not on this server
                    # yet, and reading backwards is what makes it fetch that history.
                    await self._read_backward()
                    await self._deliver_held()
                else:
                    await self._read_forward()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the homeserver may not be up yet
                log.warning("peer feed not ready; retrying", peer=self.peer.domain, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        self._ready.set()
        self.push([])

    def _hold(self, event: dict[str, Any]) -> None:
        if event.get("sender") != self.peer.bot:
            return
        n = _number(event.get("content"))
        if n > self._last_n:
            self._held.setdefault(n, event)

    async def _read_forward(self) -> None:
        """What the room holds after the position, into the held events (then delivered)."""
        start: str | None = None
        if self._position is not None:
            found = await self._bot.context(self.room_id, self._position)
            if found is not None:
                start = found.get("end")
                self._last_n = max(self._last_n, _number(found.get("event", {}).get("content")))
        while True:
            page = await self._bot.messages(
                self.room_id, start=start, direction="f", limit=PAGE, event_filter=self._filter
            )
            for event in page["chunk"]:
                self._hold(event)
            end = page.get("end")
            if not page["chunk"] or not isinstance(end, str) or end == start:
                break
            start = end
        await self._deliver_held()

    async def _run(self) -> None:
        try:
            await self._ready.wait()
            while self._queue:
                while self._queue:
                    self._hold(self._queue.popleft())
                await self._deliver_held()
                delay = 0.25
                while self._held:
                    # A gap: the events before the held ones are not here yet.
                    await self._find_missing()
                    if not await self._deliver_held():
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 5.0)
                    while self._queue:
                        self._hold(self._queue.popleft())
                    await self._deliver_held()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("peer feed failed", peer=self.peer.domain)
        finally:
            self._task = None

    async def _deliver_held(self) -> bool:
        """Deliver the held events that follow on; whether any was."""
        delivered = False
        while (self._last_n + 1) in self._held:
            event = self._held.pop(self._last_n + 1)
            await self._handle(event)
            self._last_n += 1
            event_id = event.get("event_id")
            if isinstance(event_id, str):
                self._position = event_id
            delivered = True
        return delivered

    async def _find_missing(self) -> None:
        """Read the room backwards from its newest event down to what was delivered,
        holding what is missing. Paginating backwards is what makes Synapse fetch events it
        lacks from the server that sent them."""
        first_held = min(self._held)
        log.info(
            "events missing; reading the room for them",
            peer=self.peer.domain,
            missing=f"{self._last_n + 1}..{first_held - 1}",
        )
        await self._read_backward()

    async def _read_backward(self) -> None:
        """Hold what the room has after the last event delivered, reading from its newest."""
        start: str | None = None
        while True:
            page = await self._bot.messages(
                self.room_id, start=start, direction="b", limit=PAGE, event_filter=self._filter
            )
            lowest = None
            for event in page["chunk"]:
                self._hold(event)
                n = _number(event.get("content"))
                lowest = n if lowest is None else min(lowest, n)
            end = page.get("end")
            if (
                not page["chunk"]
                or not isinstance(end, str)
                or (lowest is not None and lowest <= self._last_n + 1)
            ):
                return
            start = end


class PeerFeeds:
    """What peer domains' nodes send this one: their invitations, and their events."""

    def __init__(
        self,
        local_domain: str,
        federation: Federation,
        rooms: RoomDirectory,
        bot: Intent,
        delivery: Delivery,
        settlement: Settlement,
        table: RoutingTable,
        remote: RemoteSubscriptionStore,
        policy: PolicyEngine,
        publisher: Publisher,
        registry: MnService,
        metrics: NodeMetrics,
    ) -> None:
        self._local = local_domain
        self._federation = federation
        self._rooms = rooms
        self._bot = bot
        self._delivery = delivery
        self._settlement = settlement
        self._table = table
        self._remote = remote
        self._policy = policy
        self._publisher = publisher
        self._registry = registry
        self._metrics = metrics
        self._sm = f"domain://msg-node.{local_domain}/sm"
        self._registry_address = domain_registry_address(local_domain)
        self._is_node_address = node_addresses(local_domain)
        self._feeds: dict[str, PeerFeed] = {}
        # Subscriptions sent to peers, by request id, until they confirm them.
        self._confirmations: dict[str, asyncio.Future[Any]] = {}
        self._background: set[asyncio.Task[None]] = set()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._background.discard)  # type: ignore[arg-type]

    async def start(self, positions: dict[str, str]) -> None:
        """Follow every peer room this node joined before."""
        for room_id, domain in await self._rooms.from_peer_rooms():
            try:
                peer = await self._federation.peers.resolve(domain)
            except PeerRefused as refused:
                log.warning("not following a former peer", peer=domain, reason=refused.reason)
                continue
            self._follow(room_id, peer, positions.get(room_id))

    def _follow(self, room_id: str, peer: Peer, position: str | None) -> PeerFeed:
        feed = self._feeds.get(room_id)
        if feed is None:
            feed = self._feeds[room_id] = PeerFeed(
                room_id, peer, position, functools.partial(self._deliver, peer, room_id), self._bot
            )
            self._spawn(feed.start())
        return feed

    # -- the homeserver's push ----------------------------------------------------------------

    async def on_member_events(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        """A peer's node invites this one into its room for it: join and follow it."""
        for event in events:
            content = event.get("content")
            membership = content.get("membership") if isinstance(content, dict) else None
            if event.get("state_key") != self._bot.user_id or membership != "invite":
                continue
            peer = self._federation.peers.by_bot(str(event.get("sender")))
            room_id = event.get("room_id")
            if peer is None or not isinstance(room_id, str):
                log.warning("invitation from a stranger ignored", sender=event.get("sender"))
                continue
            self._spawn(self._join(room_id, peer))

    async def _join(self, room_id: str, peer: Peer) -> None:
        delay = 0.5
        while True:
            try:
                await self._bot.join(room_id)
                break
            except MatrixError as exc:
                log.warning("joining a peer's room failed", peer=peer.domain, error=str(exc))
            except Exception as exc:  # noqa: BLE001 - the homeserver may be away: retry
                log.warning("joining a peer's room failed", peer=peer.domain, error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        await self._rooms.joined_from_peer(room_id, peer.domain)
        log.info("following a peer's room", peer=peer.domain, room=room_id)
        self._follow(room_id, peer, None)

    async def on_batch_events(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        """The push of peers' events: each to its room's feed, which keeps their order."""
        by_room: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            room_id = event.get("room_id")
            if not isinstance(room_id, str):
                continue
            if room_id not in self._feeds and not await self._adopt(room_id, event):
                continue
            by_room.setdefault(room_id, []).append(event)
        for room_id, batch in by_room.items():
            self._feeds[room_id].push(batch)

    async def _adopt(self, room_id: str, event: dict[str, Any]) -> bool:
        """A peer's room this node's bot is in but its database does not know (restored, or
        new): follow it from this event on."""
        peer = self._federation.peers.by_bot(str(event.get("sender")))
        if peer is None:
            return False
        await self._rooms.joined_from_peer(room_id, peer.domain)
        feed = PeerFeed(
            room_id,
            peer,
            None,
            functools.partial(self._deliver, peer, room_id),
            self._bot,
            last_n=_number(event.get("content")) - 1,
        )
        self._feeds[room_id] = feed
        feed.start_here()
        log.info("following a peer's room found in the push", peer=peer.domain, room=room_id)
        return True

    # -- one event of a peer ------------------------------------------------------------------

    async def _deliver(self, peer: Peer, room_id: str, event: dict[str, Any]) -> None:
        event_id = event.get("event_id")
        try:
            routed = await carrier.decode_batch(event.get("content"), self._bot.download)
        except carrier.CarrierError as exc:
            log.warning("unreadable peer event skipped", peer=peer.domain, error=str(exc))
            self._metrics.matrix_events_in.labels("undecodable").inc()
            return
        if not isinstance(event_id, str):
            return
        ticket = self._settlement.ledger(room_id).open(event_id)
        await self._delivery.deliver(routed, ticket, inspect=functools.partial(self._admit, peer))

    def _admit(self, peer: Peer, routed: Routed) -> bool:
        """Whether a peer's message is delivered here; the node answers or acts on the rest."""
        try:
            message = parse(routed.text)
        except InvalidMessage:
            self._metrics.messages_out.labels("malformed").inc()
            return False
        if address_domain(message.from_) != peer.domain:
            # A peer speaks for its own domain's addresses only: never for this domain's
            # runtimes nor a third domain's.
            log.warning("peer message from a foreign address dropped", peer=peer.domain)
            self._metrics.messages_in.labels("peer_foreign_sender").inc()
            return False
        if message.to_first == self._sm and message.from_.startswith(
            f"domain://msg-node.{peer.domain}/"
        ):
            if message.type == "response":
                self._confirmed(message)
            else:
                self._spawn(self._peer_subscription(peer, message))
            return False
        denial = self._policy.check_remote(message)
        if denial is not None:
            self._answer(peer, message, denial.code, denial.reason)
            return False
        if self._is_node_address(message.to_first):
            if message.type != "response":
                self._serve(peer, message)
            return False
        if not self._table.destinations(message.to, None).known:
            if message.type != "response":
                self._answer(peer, message, 404, f"no route to {' '.join(message.to)}")
            return False
        return True

    def _serve(self, peer: Peer, message: Message) -> None:
        """A request of a peer's runtime to this node's services: other domains' runtimes find
        hyperties and data objects in this domain's registry (reTHINK's discovery reads
        ``domain://registry.<their domain>``); everything else serves this domain's runtimes."""
        if is_service_address(message.to_first, self._registry_address) and (
            message.type == "read"
        ):
            self._spawn(self._read_registry(peer, message))
            return
        self._answer(
            peer, message, 403, f"{message.to_first} serves runtimes of {self._local} only"
        )

    async def _read_registry(self, peer: Peer, message: Message) -> None:
        requester = Requester(0, f"domain://msg-node.{peer.domain}")
        try:
            reply = await self._registry.handle(message, requester)
        except Exception:
            log.exception("registry read for a peer failed", peer=peer.domain, id=message.id)
            reply = ServiceReply(500, desc="internal error in the MN")
        text = answer(message, reply.code, value=reply.value, desc=reply.desc, extra=reply.extra)
        await self.send_as_node(peer.domain, text, (message.from_,))

    def _answer(self, peer: Peer, message: Message, code: int, reason: str) -> None:
        text = answer(message, code, desc=reason)
        self._spawn(self.send_as_node(peer.domain, text, (message.from_,)))

    async def _peer_subscription(self, peer: Peer, message: Message) -> None:
        resources = message.body.get("resources")
        if not isinstance(resources, list):
            return
        addresses = [r for r in resources if isinstance(r, str) and r]
        if message.type == SUBSCRIBE:
            await self._remote.subscribe(peer.domain, addresses)
            self._table.subscribe_domain(peer.domain, addresses)
        elif message.type == UNSUBSCRIBE:
            await self._remote.unsubscribe(peer.domain, addresses)
            self._table.unsubscribe_domain(peer.domain, addresses)
        else:
            return
        # From now on this domain's publications to them reach the peer: say so.
        self._answer(peer, message, 200, f"{message.type}d")

    def _confirmed(self, message: Message) -> None:
        waiter = self._confirmations.pop(str(message.id), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(message.body.get("code"))

    async def send_as_node(self, domain: str, text: str, to: tuple[str, ...]) -> None:
        """A message the node itself sends to a peer domain (an answer, a subscription)."""
        try:
            link = await self._federation.link(domain)
        except PeerRefused:
            return
        link.push(self._publisher.outgoing(text, to))

    async def subscription_changed(self, kind: str, addresses: list[str]) -> None:
        """This node's runtimes subscribed to (or left) addresses of other domains: their nodes
        are asked to send what is published there once to this domain."""
        by_domain: dict[str, list[str]] = {}
        for address in addresses:
            domain = self._federation.peers.remote_domain(address)
            if domain is not None:
                if kind == UNSUBSCRIBE and self._table.has_subscribers(address):
                    continue  # another runtime here still follows it
                by_domain.setdefault(domain, []).append(address)
        waiting: list[tuple[str, str, asyncio.Future[Any]]] = []
        for domain, resources in by_domain.items():
            request_id = f"sub-{self._publisher.next_id()}"
            text = orjson.dumps(
                {
                    "id": request_id,
                    "type": kind,
                    "from": self._sm,
                    "to": f"domain://msg-node.{domain}/sm",
                    "body": {"resources": resources},
                }
            ).decode()
            if kind == SUBSCRIBE:
                waiter = asyncio.get_running_loop().create_future()
                self._confirmations[request_id] = waiter
                waiting.append((domain, request_id, waiter))
            await self.send_as_node(domain, text, (f"domain://msg-node.{domain}/sm",))
        # A runtime told "subscribed" gets every update published after that, also in another
        # domain: wait until its node has recorded this domain (bounded: when it is away the
        # request is durable here and takes effect once it is back).
        for domain, request_id, waiter in waiting:
            try:
                await asyncio.wait_for(waiter, SUBSCRIPTION_CONFIRM_SECONDS)
            except TimeoutError:
                log.warning("peer has not confirmed a subscription yet", peer=domain)
            finally:
                self._confirmations.pop(request_id, None)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

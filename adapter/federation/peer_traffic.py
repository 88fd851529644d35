"""What peer domains' nodes send this one, and what it may do here.

A peer's node invites this node's bot into the room it writes for it (joined, then followed by a
``PeerFeed``); its events come in order and each message is judged here as a local one is,
on this node's side (DESIGN §10):

- it speaks for its own domain only: a ``from`` of this domain or a third one is dropped;
- its destinations are read from the message itself, never from the list its node wrote beside
  it, then the same policy, node-address and known-address checks apply: 404 for an address this
  node does not know, 403 when a rule refuses, and what is sent to a runtime's own address
  reaches only that runtime (routing_table.py);
- its sender ids and sequence marks live in the peer's namespace (``peer:<domain>:<origin>``):
  nothing it sends touches a local runtime's dedupe state, and a mark moves only for a message
  this node admitted;
- it vouches only for identities of its own domain or of the identity providers the operator
  lists for it; any other ``assertedIdentity`` arrives as false;
- its runtimes subscribe only to this domain's streams (``…/changes``, ``…/children/…``,
  ``…/registration``; access.py decides); each subscription names the peer runtime that asked,
  ends with it, passes this node's policy, and the peer's count is capped.

Events in rooms this node writes itself are not the peer's to send: ignored (and refused by the
rooms' power levels before they reach here).

A peer's work never waits in this domain's line: ``bot`` here acts through a pool of homeserver
connections of its own (core/core.py), a peer's event has one deadline for all its media waits
(peer_feed.py), and a peer may have this node follow at most ``max_rooms`` rooms (an invitation
beyond is refused and counted). A room counts while the peer's node is in it: when its bot
leaves (or this node's bot is put out), this node leaves it too and the room no longer counts;
a former peer's rooms are left at the next start. A room the peer's node stays in is never left
for being quiet: its node invites once, and would write on into a room nobody here reads. So a
peer that churns rooms and keeps them is refused beyond its bound; one that reuses a room, or
leaves those it is done with, never is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import structlog

from appservice.intent import Intent

from .. import carrier
from ..access import AccessMonitor
from ..addresses import domain_of as address_domain
from ..carrier import Routed, Sender
from ..envelope import (
    MAX_ADDRESS_BYTES,
    InvalidMessage,
    Message,
    answer,
    parse,
    with_body_fields,
)
from ..identity.assertion import asserted_domains
from ..observability import NodeMetrics
from ..retry import Backoff, retry
from ..routing.delivery import Delivery, passing
from ..routing.inbound import RetryTransaction
from ..routing.lanes import Outbox, Outgoing
from ..routing.numbering import event_number
from ..routing.policy import MessageGate
from ..routing.publisher import Publisher
from ..routing.rooms import RoomDirectory
from ..routing.settlement import Settlement, Ticket
from ..routing.way_abroad import PEER_ORIGIN_PREFIX
from ..routing_table import RoutingTable
from ..services.base import MnService, Requester, ServiceReply
from ..services.registry import domain_registry_address, is_service_address, node_addresses
from ..storage.remote import RemoteSubscriptionStore
from ..tasks import BackgroundTasks
from .links import Federation
from .peer_feed import PeerFeed
from .peer_origins import PeerOrigins
from .peer_requests import (
    SUBSCRIBE,
    UNSUBSCRIBE,
    by_domain,
    subscription_manager,
    subscription_request,
)
from .peers import Peer, PeerRefused, Peers

log = structlog.get_logger(__name__)

# How long a subscription to another domain's address waits for that domain's node to confirm
# it before the runtime is answered anyway (below the runtime's own 15 s request timeout).
SUBSCRIPTION_CONFIRM_SECONDS = 5.0
MAX_PEER_RUNTIME_BYTES = 512
# How long relaying a peer's message waits for room in the lane before it pushes anyway.
RELAY_ROOM_SECONDS = 30.0
# The sender marks' key holds at most this many characters (storage/models.py SenderMark).
MAX_ORIGIN = 128


def peer_origin(domain: str, origin: str) -> str:
    """Where a peer's sender numbering lives here: never a local session's origin."""
    spelled = f"{PEER_ORIGIN_PREFIX}{domain}:{origin}"
    if len(spelled) <= MAX_ORIGIN:
        return spelled
    return f"{PEER_ORIGIN_PREFIX}{hashlib.sha256(domain.encode()).hexdigest()[:24]}:{origin}"


def peer_origin_prefixes(domain: str) -> tuple[str, ...]:
    """How the origins ``peer_origin`` makes for ``domain`` start, both spellings."""
    return (
        f"{PEER_ORIGIN_PREFIX}{domain}:",
        f"{PEER_ORIGIN_PREFIX}{hashlib.sha256(domain.encode()).hexdigest()[:24]}:",
    )


class PeerFeeds:
    """The peer rooms this node follows, and the judgement of every message they carry."""

    def __init__(
        self,
        local_domain: str,
        federation: Federation,
        rooms: RoomDirectory,
        bot: Intent,
        delivery: Delivery,
        settlement: Settlement,
        table: RoutingTable,
        monitor: AccessMonitor,
        remote: RemoteSubscriptionStore,
        policy: MessageGate,
        publisher: Publisher,
        registry: MnService,
        metrics: NodeMetrics,
        relay: Outbox | None = None,
    ) -> None:
        self._local = local_domain
        self._federation = federation
        self._rooms = rooms
        self._bot = bot
        self._delivery = delivery
        self._settlement = settlement
        self._table = table
        self._monitor = monitor
        self._remote = remote
        self._policy = policy
        self._publisher = publisher
        self._registry = registry
        self._metrics = metrics
        # A domain on several processes: what peers send goes to this process's lane, read by
        # every process, which delivers it to the runtimes it holds (None: delivered here).
        self._relay = relay
        # Per peer origin, the highest number relayed and not yet delivered from the lane.
        self._relayed: dict[str, int] = {}
        self._sm = subscription_manager(local_domain)
        self._registry_address = domain_registry_address(local_domain)
        self._is_node_address = node_addresses(local_domain)
        self._feeds: dict[str, PeerFeed] = {}
        # Per peer domain, the rooms followed or being joined (bounded by its max_rooms).
        self._rooms_of: dict[str, set[str]] = {}
        # Subscriptions sent to peers, by request id, until they answer them.
        # Keyed by (peer domain, request id): only the peer a request went to confirms it.
        self._confirmations: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self._background = BackgroundTasks(
            "peer_traffic", metrics.background_failures.labels("peer_traffic").inc
        )
        # Which of each peer's sender ids keep their marks (bounded: peer_origins.py).
        self._origins = PeerOrigins(
            peer_origin_prefixes,
            self._drop_origins,
            metrics.quota_refusals.labels("peer_origins").inc,
        )
        # One per peer domain (the configured peers): see _subscriptions_lock.
        self._subscription_locks: dict[str, asyncio.Lock] = {}

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    async def start(self, positions: dict[str, str]) -> None:
        """Follow every peer room this node joined before (within each peer's bound)."""
        for room_id, domain in await self._rooms.from_peer_rooms():
            try:
                peer = await self._federation.peers.resolve(domain)
            except PeerRefused as refused:
                log.warning("leaving a former peer's room", peer=domain, reason=refused.reason)
                self._spawn(self._leave(room_id, domain))
                continue
            if not self._take_room(peer, room_id):
                continue
            self._follow(room_id, peer, positions.get(room_id))

    def _take_room(self, peer: Peer, room_id: str) -> bool:
        """Whether this node follows one more room of ``peer``: checked and taken at once (the
        invitations of one push are judged side by side). Refused beyond ``max_rooms``."""
        rooms = self._rooms_of.setdefault(peer.domain, set())
        if room_id in rooms:
            return True
        if len(rooms) >= peer.max_rooms:
            self._metrics.quota_refusals.labels("peer_rooms").inc()
            log.warning(
                "a peer's room refused: it has this node follow the most allowed",
                peer=peer.domain,
                room=room_id,
                max_rooms=peer.max_rooms,
            )
            return False
        rooms.add(room_id)
        return True

    def _feed(self, room_id: str, peer: Peer, position: str | None, last_n: int = 0) -> PeerFeed:
        feed = PeerFeed(
            room_id,
            peer,
            position,
            functools.partial(self._deliver, peer, room_id),
            self._bot,
            self._metrics,
            last_n,
            confirm=self._federation.flow_control,
        )
        self._feeds[room_id] = feed
        return feed

    def _follow(self, room_id: str, peer: Peer, position: str | None) -> PeerFeed:
        feed = self._feeds.get(room_id)
        if feed is None:
            feed = self._feed(room_id, peer, position)
            feed.start()
        return feed

    # -- the homeserver's push ----------------------------------------------------------------

    async def on_member_events(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        """A peer's node invites this one into its room for it: join and follow it. A peer's
        node that leaves a room it wrote in for this one (or puts this node's bot out) gives
        it back: this node leaves it too."""
        for event in events:
            content = event.get("content")
            membership = content.get("membership") if isinstance(content, dict) else None
            if membership in ("leave", "ban"):
                self._left(event)
                continue
            if event.get("state_key") != self._bot.user_id or membership != "invite":
                continue
            peer = self._federation.peers.by_bot(str(event.get("sender")))
            room_id = event.get("room_id")
            if peer is None or not isinstance(room_id, str):
                log.warning("invitation from a stranger ignored", sender=event.get("sender"))
                continue
            if room_id in self._rooms_of.get(peer.domain, ()):
                continue  # followed already, or being joined
            if not self._take_room(peer, room_id):
                self._spawn(self._refuse_room(room_id, peer))
                continue
            self._spawn(self._join(room_id, peer))

    def _left(self, event: dict[str, Any]) -> None:
        """A membership ended in a room a peer's node writes in for this one: the peer's bot
        left it, or this node's bot was put out (by the peer, whose room it is)."""
        room_id, member = event.get("room_id"), event.get("state_key")
        if not isinstance(room_id, str) or not isinstance(member, str):
            return
        peer = self._federation.peers.by_bot(member)
        if peer is None and member == self._bot.user_id:
            peer = self._federation.peers.by_bot(str(event.get("sender")))
        if peer is None or room_id not in self._rooms_of.get(peer.domain, ()):
            return
        self._give_room(peer.domain, room_id)
        self._spawn(self._leave(room_id, peer.domain))

    def _give_room(self, domain: str, room_id: str) -> None:
        """The room no longer counts towards the peer's bound, nor is it followed."""
        rooms = self._rooms_of.get(domain)
        if rooms is not None:
            rooms.discard(room_id)
        feed = self._feeds.pop(room_id, None)
        if feed is not None:
            self._spawn(feed.close())

    async def _leave(self, room_id: str, domain: str) -> None:
        """Leave a peer's room this node no longer follows, and forget it."""
        try:
            await self._rooms.left_from_peer(room_id)
            await self._bot.leave_and_forget(room_id)
            log.info("left a peer's room", peer=domain, room=room_id)
        except Exception as exc:  # noqa: BLE001 - left at the next start, or when it leaves
            log.info("leaving a peer's room failed", peer=domain, error=str(exc))

    async def _refuse_room(self, room_id: str, peer: Peer) -> None:
        """Decline an invitation beyond the peer's bound (once: a peer that invites again is
        refused again)."""
        try:
            await self._bot.leave_and_forget(room_id)
        except Exception as exc:  # noqa: BLE001 - the invitation stays unanswered: harmless
            log.info("declining a peer's room failed", peer=peer.domain, error=str(exc))

    async def _join(self, room_id: str, peer: Peer) -> None:

        def join_failed(exc: Exception, _delay: float) -> None:
            # Refused, or the homeserver away: tried again either way.
            log.warning("joining a peer's room failed", peer=peer.domain, error=str(exc))

        await retry(lambda: self._bot.join(room_id), Backoff(0.5, 30.0), on_retry=join_failed)
        await self._rooms.joined_from_peer(room_id, peer.domain)
        log.info("following a peer's room", peer=peer.domain, room=room_id)
        self._follow(room_id, peer, None)

    async def on_batch_events(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        """The push of peers' events: each to its room's feed, which keeps their order. An
        event this node cannot place is ignored on its own; the others go on."""
        by_room: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            room_id = event.get("room_id")
            if not isinstance(room_id, str):
                continue
            if room_id not in self._feeds:
                try:
                    adopted = await self._adopt(room_id, event)
                except Exception:
                    log.exception("a peer event's room could not be followed", room=room_id)
                    adopted = False
                if not adopted:
                    self._metrics.peer_events.labels("ignored").inc()
                    continue
            by_room.setdefault(room_id, []).append(event)
        for room_id, batch in by_room.items():
            self._feeds[room_id].push(batch)

    async def _adopt(self, room_id: str, event: dict[str, Any]) -> bool:
        """A peer's room this node's bot is in but its database does not know (restored, or
        new): follow it from this event on. Never a room this node writes itself."""
        peer = self._federation.peers.by_bot(str(event.get("sender")))
        if peer is None:
            return False
        if await self._rooms.writes_in(room_id):
            log.warning("a peer's event in a room this node writes ignored", peer=peer.domain)
            return False
        if room_id in self._feeds:
            return True  # adopted meanwhile (the same push)
        if not self._take_room(peer, room_id):
            return False
        await self._rooms.joined_from_peer(room_id, peer.domain)
        feed = self._feed(room_id, peer, None, last_n=event_number(event.get("content")) - 1)
        feed.start_here()
        log.info("following a peer's room found in the push", peer=peer.domain, room=room_id)
        return True

    # -- one event of a peer ------------------------------------------------------------------

    async def _deliver(
        self, peer: Peer, room_id: str, event: dict[str, Any], deadline: float
    ) -> None:
        """Raises what fetching the event's media raised (the feed retries), and TimeoutError
        once ``deadline`` (the loop's clock) passes while it waits for them: the homeserver
        client's own retries stop there too."""
        event_id = event.get("event_id")

        async def download(uri: str) -> bytes:
            async with asyncio.timeout_at(deadline):
                return await self._bot.download(uri)

        try:
            routed = await carrier.decode_batch(event.get("content"), download)
        except carrier.CarrierError as exc:
            log.warning("unreadable peer event skipped", peer=peer.domain, error=str(exc))
            self._metrics.matrix_events_in.labels("undecodable").inc()
            return
        if not isinstance(event_id, str):
            return
        ticket = self._settlement.ledger(room_id).open(event_id)
        senders: dict[Sender, Sender] = {}
        for i, message in enumerate(routed):
            own = senders.get(message.sender)
            if own is None:
                own = senders[message.sender] = dataclasses.replace(
                    message.sender, origin=peer_origin(peer.domain, message.sender.origin)
                )
            routed[i] = dataclasses.replace(message, sender=own)
        admit = functools.partial(self._admit, peer)
        if self._relay is None:
            await self._delivery.deliver(routed, ticket, admit=admit)
        else:
            await self._relay_event(self._relay, routed, ticket, admit)
        self._origins.seen(peer, [sender.origin for sender in senders.values()])

    def restore_marks(self, origins: Iterable[str]) -> None:
        """At a start, the peers' marks the database kept: held to each peer's bound."""
        self._origins.restore(self._federation.peers.configured(), origins)

    def _drop_origins(self, origins: list[str], peer: Peer | None) -> None:
        """Let those sender ids' marks go, from memory and from the database."""
        for origin in origins:
            self._relayed.pop(origin, None)
        rooms = self._rooms_of.get(peer.domain, ()) if peer is not None else ()
        self._settlement.drop(origins, rooms)
        log.info(
            "a peer's sender marks let go",
            peer=peer.domain if peer is not None else "(no peer any more)",
            origins=len(origins),
        )

    async def _relay_event(
        self,
        relay: Outbox,
        routed: list[Routed],
        ticket: Ticket,
        admit: Callable[[Routed], Routed | None],
    ) -> None:
        """A peer's event on a domain of several processes: each new message the node admits
        goes to this process's lane, judged here once. The event settles once that lane holds
        all of them (its room is read again from before it after a stop)."""
        relayed = self._relayed
        for message in routed:
            origin = message.sender.origin
            delivered = self._delivery.routed_through(origin)
            through = relayed.get(origin, 0)
            if through <= delivered:
                # Delivered from the lane since: the delivery's mark says it all (and this
                # holds only origins with messages on their way).
                relayed.pop(origin, None)
                through = delivered
            if message.oseq <= through:
                self._metrics.duplicates.labels("delivery").inc()
                continue
            try:
                admitted = admit(message)
            except Exception as exc:
                if passing(exc):
                    raise
                # One message's failure: skipped (its sender is a peer's runtime), counted,
                # and the event's others go on.
                self._metrics.failed_items.labels("peer").inc()
                log.error("judging a peer's message failed", error=repr(exc)[:300])
                continue
            if admitted is None:
                continue
            relayed[origin] = message.oseq
            size = len(admitted.text)
            if not relay.has_room_for(size):
                await relay.wait_for_room(size, RELAY_ROOM_SECONDS)
            ticket.hold()
            relay.push(Outgoing(admitted, 0, settles=ticket))
        ticket.seal()

    def _admit(self, peer: Peer, routed: Routed) -> Routed | None:
        """The message as it is delivered here, or None: the node answers or acts on it
        itself, or drops it."""
        try:
            message = parse(routed.text)
        except InvalidMessage:
            self._metrics.messages_out.labels("malformed").inc()
            return None
        if address_domain(message.from_) != peer.domain:
            # A peer speaks for its own domain's addresses only: never for this domain's
            # runtimes nor a third domain's.
            log.warning("peer message from a foreign address dropped", peer=peer.domain)
            self._metrics.messages_in.labels("peer_foreign_sender").inc()
            return None
        for address in message.to:
            refused = self._monitor.send_to(None, address, peer.domain)
            if refused is not None:
                if message.type != "response":
                    self._answer(peer, message, refused.code, refused.reason)
                return None
        if message.type == "response" and (
            self._monitor.answer(message.to, message.id, message.from_) is not None
        ):
            # Nobody here asked that address: not an answer, whatever it says.
            self._metrics.messages_in.labels("peer_unasked_response").inc()
            return None
        if message.to_first == self._sm and message.from_.startswith(
            f"domain://msg-node.{peer.domain}/"
        ):
            if message.type == "response":
                self._confirmed(peer, message)
            else:
                self._spawn(self._peer_subscription(peer, message))
            return None
        denial = self._policy.check_remote(message)
        if denial is not None:
            self._answer(peer, message, denial.code, denial.reason)
            return None
        if self._is_node_address(message.to_first):
            if message.type != "response":
                self._serve(peer, message)
            return None
        if not self._monitor.receivers(message.to, None).known:
            if message.type != "response":
                self._answer(peer, message, 404, f"no route to {' '.join(message.to)}")
            return None
        text = self._judge_identity(peer, message)
        return Routed(text, message.to, routed.sender, routed.oseq)

    def _judge_identity(self, peer: Peer, message: Message) -> str:
        """The text to deliver: ``assertedIdentity`` kept only for identities the peer may
        vouch for."""
        if message.body.get("assertedIdentity") is not True:
            return message.raw
        domains = asserted_domains(message.body)
        if domains and domains <= peer.vouches_for:
            return message.raw
        self._metrics.messages_in.labels("peer_identity_not_vouched").inc()
        return with_body_fields(message.raw, {"assertedIdentity": False})

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

    # -- subscriptions across domains ---------------------------------------------------------

    async def _peer_subscription(self, peer: Peer, message: Message) -> None:
        try:
            code, reason = await self._take_subscription(peer, message)
        except Exception:
            log.exception("a peer's subscription failed", peer=peer.domain)
            code, reason = 503, "the subscription could not be recorded; try again"
        self._answer(peer, message, code, reason)

    async def _take_subscription(self, peer: Peer, message: Message) -> tuple[int, str]:
        """(code, reason) for a peer runtime's (un)subscription to this domain's streams."""
        if message.type not in (SUBSCRIBE, UNSUBSCRIBE):
            return 405, f"the subscription manager does not support '{message.type}'"
        resources, runtime = message.body.get("resources"), message.body.get("source")
        if not (
            isinstance(runtime, str)
            and address_domain(runtime) == peer.domain
            and len(runtime.encode()) <= MAX_PEER_RUNTIME_BYTES
        ):
            return 400, f"body.source must name the {peer.domain} runtime that asks"
        if message.type == UNSUBSCRIBE and resources is None:
            # The runtime's session ended: everything it held here ends with it.
            self._table.unsubscribe_domain(peer.domain, runtime)
            async with self._subscriptions_lock(peer.domain):
                await self._remote.unsubscribe(peer.domain, runtime)
            return 200, "unsubscribed"
        if not isinstance(resources, list) or not resources:
            return 400, "body.resources must be a non-empty list of addresses"
        addresses = list(dict.fromkeys(r for r in resources if isinstance(r, str)))
        if message.type == UNSUBSCRIBE:
            self._table.unsubscribe_domain(peer.domain, runtime, addresses)
            async with self._subscriptions_lock(peer.domain):
                await self._remote.unsubscribe(peer.domain, runtime, addresses)
            return 200, "unsubscribed"
        for address in resources:
            if not isinstance(address, str) or len(address.encode()) > MAX_ADDRESS_BYTES:
                return 400, "body.resources must be a list of addresses"
            refused = self._monitor.peer_subscribe_to(address)
            if refused is not None:
                return refused.code, refused.reason
            denied = self._policy.check_subscription(runtime, None, address)
            if denied is not None:
                return 403, denied
        # Checked and taken in one step, before any wait: the requests of one batch run side by
        # side, and each must see what the others took (the table is the count, kept in step
        # with the database, which is written after).
        new = [a for a in addresses if not self._table.remote_holds(peer.domain, runtime, a)]
        held = self._table.remote_held(peer.domain)
        if held + len(new) > peer.max_subscriptions:
            self._metrics.quota_refusals.labels("peer_subscriptions").inc()
            return 429, f"{peer.domain}'s runtimes hold {held} subscriptions here, the most allowed"
        # From now on this domain's publications to them reach the peer.
        taken = self._table.subscribe_domain(peer.domain, runtime, new)
        try:
            async with self._subscriptions_lock(peer.domain):
                await self._remote.subscribe(peer.domain, runtime, addresses)
        except BaseException:
            self._table.unsubscribe_domain(peer.domain, runtime, taken)
            raise
        return 200, "subscribed"

    def _subscriptions_lock(self, domain: str) -> asyncio.Lock:
        """One peer's subscription writes reach the database in the order its requests were
        taken (an unsubscription never overtakes the subscription it ends)."""
        lock = self._subscription_locks.get(domain)
        if lock is None:
            lock = self._subscription_locks[domain] = asyncio.Lock()
        return lock

    def _confirmed(self, peer: Peer, message: Message) -> None:
        waiter = self._confirmations.pop((peer.domain, str(message.id)), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(message.body)

    async def send_as_node(self, domain: str, text: str, to: tuple[str, ...]) -> None:
        """A message the node itself sends to a peer domain (an answer, a subscription)."""
        try:
            link = await self._federation.link(domain)
        except PeerRefused:
            return
        link.push(self._publisher.outgoing(text, to))

    def _subscription_request(
        self, domain: str, kind: str, body: dict[str, Any]
    ) -> tuple[str, str]:
        request_id = f"sub-{self._publisher.next_id()}"
        return request_id, subscription_request(request_id, self._local, domain, kind, body)

    async def subscription_changed(
        self, kind: str, addresses: list[str], runtime: str
    ) -> str | None:
        """A runtime of this node subscribes to (or leaves) streams of other domains: their
        nodes are asked to send what is published there once to this domain. Returns why a
        peer refused a subscription, or None (also when a peer did not answer in time: the
        request is durable here and takes effect once it is back)."""
        waiting: list[tuple[str, str, asyncio.Future[Any]]] = []
        for domain, resources in by_domain(self._federation.peers, addresses).items():
            request_id, text = self._subscription_request(
                domain, kind, {"resources": resources, "source": runtime}
            )
            if kind == SUBSCRIBE:
                waiter = asyncio.get_running_loop().create_future()
                self._confirmations[(domain, request_id)] = waiter
                waiting.append((domain, request_id, waiter))
            await self.send_as_node(domain, text, (subscription_manager(domain),))
        refusal: str | None = None
        for domain, request_id, waiter in waiting:
            try:
                body = await asyncio.wait_for(waiter, SUBSCRIPTION_CONFIRM_SECONDS)
            except TimeoutError:
                log.warning("peer has not confirmed a subscription yet", peer=domain)
                continue
            finally:
                self._confirmations.pop((domain, request_id), None)
            code = body.get("code") if isinstance(body, dict) else None
            if code != 200:
                desc = body.get("desc") if isinstance(body, dict) else None
                refusal = f"{domain} refused the subscription ({code}): {desc}"
        return refusal

    def runtime_left(self, runtime: str, subscriptions: set[str]) -> None:
        """A runtime of this node is gone: its subscriptions in other domains end too."""
        for domain in by_domain(self._federation.peers, sorted(subscriptions)):
            _id, text = self._subscription_request(domain, UNSUBSCRIBE, {"source": runtime})
            self._spawn(self.send_as_node(domain, text, (subscription_manager(domain),)))

    async def close(self) -> None:
        for feed in self._feeds.values():
            await feed.close()
        await self._background.stop()


class PeersPushedElsewhere:
    """A process of a domain on several that is not its federation process takes no peer's
    events: only that process follows the peers' rooms. Should the homeserver push them here
    (its registration names the wrong process), the transaction fails, so the homeserver keeps
    it and nothing is lost, and the error says what to fix."""

    def __init__(self, peers: Peers, federation_process: str) -> None:
        self._peers = peers
        self._federation_process = federation_process

    async def __call__(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        for event in events:
            if self._peers.by_bot(str(event.get("sender"))) is not None:
                log.error(
                    "a peer's event was pushed to a process that does not federate: the "
                    "appservice registration's url must reach cluster.federation_process",
                    federation_process=self._federation_process,
                )
                raise RetryTransaction("peer events go to the federation process")

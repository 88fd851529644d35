"""Where a runtime's message is decided.

Every frame a stub sends that is a reTHINK message comes here, and one of three things happens:
- it is for an MN service (allocation, subscription manager, registry, global registry, IdM):
  the service answers directly, without waiting for Matrix, and the exchange is journalled;
- it has destinations: it goes to its sender's lane, and so through Matrix (delivery happens once
  the homeserver has persisted the event, see ``lanes.py`` and ``delivery.py``);
- it is refused (bad header 400, policy 403/429, unknown destination 404, backlog 503): the
  sender gets an error response at once and the refusal is journalled.

A message from a stub that numbers its messages is done — and acknowledged to the stub — when it
is durable: answered, refused, or in a persisted event. The node's answers go through the
session's mailbox, so a stub that acknowledges deliveries gets them again after a reconnect.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from time import time
from typing import Any, Protocol

import structlog

from ..access import LEARN, AccessMonitor, Claim, Principal, Refusal, SpeakFrom, no_claims
from ..bounds import Bound, SessionShares
from ..carrier import Routed
from ..config import QuotaConfig
from ..envelope import (
    InvalidMessage,
    Message,
    answer,
    check_header,
    control_error,
    reply_origin,
    response,
    with_body_fields,
)
from ..identity.assertion import check_assertion
from ..identity.model import Identity
from ..observability import NodeMetrics
from ..routing_table import RoutingTable
from ..services.base import MnService, Requester
from ..services.registry import (
    GLOBAL_REGISTRY_ADDRESS,
    domain_registry_address,
    idm_address,
    is_service_address,
)
from ..sessions.link import Link
from ..sessions.mailbox import Parcel, Waiting, WaitingBounds, waiting_refusal
from ..sessions.session import CREDENTIAL_EXPIRED, Attachment, Session
from ..sessions.upstream import Pending, Settles
from ..storage.database import unavailable as database_unavailable
from ..storage.routes import RouteStore
from .journal import Journal
from .lanes import Outbox, Outboxes, Outgoing
from .policy import MessageGate
from .way_abroad import Abroad, PeerRefused, remote_domains

log = structlog.get_logger(__name__)

# A numbered message that fails inside the node is given back to its stub (resent after the
# reconnect) this many times before it is answered 500: a bug must not make one stub reconnect
# for ever. While the database is away it is given back for this long (the stub's reconnect
# back-off paces the resends), then answered 503.
MAX_GIVE_BACKS = 3
DATABASE_GIVE_BACK_SECONDS = 60.0


# What a runtime hears of a request that took effect when the answer's value could not be
# written (its code stands).
ANSWER_NOT_WRITTEN = "done; the node could not write the answer's value"

# The schemes of every address a service of the node has.
_SERVICE_SCHEMES = ("domain://", "global://")

HOMESERVER_BEHIND = "the node is waiting for the homeserver; retry later"


class Refused(Protocol):
    """A refusal from any of the checks (access, policy, bounds): what its sender is told."""

    @property
    def code(self) -> int: ...

    @property
    def reason(self) -> str: ...


class ServiceDirectory:
    """Which MN service an address belongs to, if any."""

    def __init__(self, domain: str) -> None:
        self._msg_node = f"domain://msg-node.{domain}/"
        self._registry = domain_registry_address(domain)
        self._idm = idm_address(domain)
        self._endpoints: dict[str, MnService] = {}
        self._registry_service: MnService | None = None
        self._global_service: MnService | None = None
        self._idm_service: MnService | None = None
        self._unknown: MnService | None = None

    def add_endpoint(self, name: str, service: MnService) -> None:
        """A service at ``domain://msg-node.<domain>/<name>``."""
        self._endpoints[name] = service

    def set_connectors(
        self, registry: MnService, global_registry: MnService, idm: MnService, unknown: MnService
    ) -> None:
        self._registry_service = registry
        self._global_service = global_registry
        self._idm_service = idm
        self._unknown = unknown

    def lookup(self, address: str) -> MnService | None:
        # Asked of every message: most are to hyperty:// or other runtime addresses.
        if not address.startswith(_SERVICE_SCHEMES):
            return None
        if address.startswith(self._msg_node):
            return self._endpoints.get(address[len(self._msg_node) :].strip("/"), self._unknown)
        if is_service_address(address, self._registry):
            return self._registry_service
        if is_service_address(address, GLOBAL_REGISTRY_ADDRESS):
            return self._global_service
        if is_service_address(address, self._idm):
            return self._idm_service
        return None


class Ingress:
    def __init__(
        self,
        table: RoutingTable,
        monitor: AccessMonitor,
        services: ServiceDirectory,
        outboxes: Outboxes,
        journal: Journal,
        routes: RouteStore,
        policy: MessageGate,
        routed_through: Callable[[str], int],
        metrics: NodeMetrics,
        quotas: QuotaConfig,
        # Bytes waiting for a session (and its client's, and the node's), and of them those
        # from a sender (its key).
        waiting_bytes: Callable[[int, str], Waiting],
        waiting_bounds: WaitingBounds,
        backpressure_timeout: float = 10.0,
        abroad: Abroad | None = None,
        catch_up: Callable[[], Awaitable[None]] | None = None,
        claim: Callable[[Principal, str], Awaitable[Refusal | None]] = no_claims,
        learned: SessionShares | None = None,
    ) -> None:
        self._table = table
        # Learned routes per client and in total, beside the per-session quota; what a session
        # learned goes back as its routes go (the table tells, also when it is released).
        self.learned = learned or SessionShares(
            Bound("learned_routes", 1 << 62, 1 << 62), lambda _session: ""
        )
        table.on_learned_removed = self.learned.give
        self._monitor = monitor
        # Allocates a self-made address a runtime speaks from (access.py, "Claim").
        self._claim = claim
        # With several node processes: waits until what the others changed in the routing
        # state has reached the table (an address allocated there a moment ago).
        self._catch_up = catch_up
        self._services = services
        self._outboxes = outboxes
        self._journal = journal
        self._routes = routes
        self._policy = policy
        self._routed_through = routed_through
        self._metrics = metrics
        self._routed = metrics.messages_in.labels("routed")  # bound once: every message
        self._quotas = quotas
        # Bytes kept for a session that is away or slow (its mailbox).
        self._waiting_bytes = waiting_bytes
        self._waiting_bounds = waiting_bounds
        self._backpressure_timeout = backpressure_timeout
        # The way to other reTHINK domains' nodes (None: this node routes inside its domain).
        self._abroad = abroad

    async def on_message(
        self,
        attachment: Attachment,
        raw: str,
        parsed: dict[str, Any],
        pending: Pending | None = None,
    ) -> None:
        """Decide one message. ``pending`` is its place in the stub's numbering, when the stub
        numbers its messages; it is marked done once the message is durable."""
        upstream = attachment.upstream
        if pending is not None and upstream is not None:
            if pending.seq <= self._routed_through(upstream.origin):
                # Carried before a restart of the node; its stub missed the acknowledgement.
                self._metrics.duplicates.labels("ingress").inc()
                upstream.done(pending)
                return
            try:
                routed = await self._decide(attachment, raw, parsed, pending)
            except Exception as exc:
                times, seconds = upstream.give_back(pending)
                if database_unavailable(exc):
                    again = seconds < DATABASE_GIVE_BACK_SECONDS
                else:
                    again = times < MAX_GIVE_BACKS
                if again:
                    raise  # the connection closes (1011); the stub sends it again
                await self._failed(attachment, raw, parsed, exc)
                routed = False
            if not routed:
                upstream.done(pending)
            return
        try:
            await self._decide(attachment, raw, parsed, None)
        except Exception as exc:  # noqa: BLE001 - logged and answered 500
            await self._failed(attachment, raw, parsed, exc)

    async def _failed(
        self, attachment: Attachment, raw: str, parsed: dict[str, Any], exc: Exception
    ) -> None:
        """A message the node could not decide: its sender is answered 503 when the database
        is away, else 500."""
        log.error(
            "deciding a message failed", runtime=attachment.session.runtime_url, error=repr(exc)
        )
        refusal = (
            InvalidMessage(503, "the node's database is unavailable; send it again later", parsed)
            if database_unavailable(exc)
            else InvalidMessage(500, "internal error in the node", parsed)
        )
        await self.refuse_frame(attachment, attachment.link, raw, refusal)

    async def _decide(
        self, attachment: Attachment, raw: str, parsed: dict[str, Any], pending: Pending | None
    ) -> bool:
        """Returns whether the message is done later: when the events carrying it are
        persisted, or when the node's answer to it is settled (acknowledged by its stub, or
        stored), so that an acknowledged request never has an answer that lives only in
        memory.

        The steps, each of which may refuse it: is the message well formed, may its sender
        send it (credential, address, policy, asserted identity), is it for an MN service,
        may it go to each addressee (learning the address it comes from), where does it go
        (sessions here, peer domains), is there room for it there; then it goes to its
        lanes. Every runtime message comes this way: the steps that wait (a claim, learning,
        catching up, peer domains, backpressure) are taken only when they are needed."""
        session = attachment.session
        try:
            message = check_header(raw, parsed)
        except InvalidMessage as exc:
            await self.refuse_frame(attachment, attachment.link, raw, exc)
            return False
        if session.vouched_until <= time():
            # The node no longer vouches for the identity: nothing goes out in its name until
            # the runtime presents a fresh credential ({cmd: 'auth'}).
            return await self._refuse(attachment, message, 401, CREDENTIAL_EXPIRED, pending)
        speaking = self._monitor.speak_from(session, message.from_)
        if isinstance(speaking, Claim):
            claimed = await self._claim(session, speaking.address)
            if claimed is not None:
                speaking = claimed
        refused = self._sender_refusal(session, message, speaking)
        if refused is not None:
            return await self._refuse(attachment, message, refused.code, refused.reason, pending)
        raw, refusal = self._assert_identity(session.identity, message)
        if refusal is not None:
            return await self._refuse(attachment, message, 403, refusal, pending)

        service = self._services.lookup(message.to_first)
        if service is not None:
            if message.type == "response":
                # The MN sends no requests, so a response to one of its services answers nothing.
                self._metrics.messages_in.labels("response_to_service").inc()
                return False
            return await self._serve(service, attachment, message, pending)

        refused = self._addressee_refusal(session.id, message)
        if refused is None and speaking is LEARN:
            refused = await self._learn(session.id, message.from_)
        if refused is not None:
            return await self._refuse(attachment, message, refused.code, refused.reason, pending)

        destinations = self._monitor.receivers(message.to, session.id)
        remote = self._remote_domains(message.to, destinations.domains, session.id)
        if not destinations.known and not remote and self._catch_up is not None:
            await self._catch_up()
            destinations = self._monitor.receivers(message.to, session.id)
        if not destinations.known and not remote:
            if message.type == "response":
                # Answering a response would start a loop of error answers; count and drop.
                self._metrics.messages_in.labels("unroutable_response").inc()
                return False
            return await self._refuse(
                attachment, message, 404, f"no route to {' '.join(message.to)}", pending
            )
        try:
            outboxes = await self._peer_outboxes(remote) if remote else []
        except PeerRefused as peer:
            return await self._refuse(attachment, message, peer.code, peer.reason, pending)
        if destinations.sessions or not outboxes:
            outboxes.insert(0, self._outboxes.for_session(session))

        full = self._waiting_refusal(destinations.owners, session.key, len(raw))
        if full is not None:
            return await self._refuse(attachment, message, *full, pending)
        for outbox in outboxes:
            if not outbox.has_room_for(len(raw)) and not await self._wait_for_room(
                outbox, len(raw), attachment
            ):
                return await self._refuse(attachment, message, 503, HOMESERVER_BEHIND, pending)
        self._push(attachment, message, raw, outboxes, pending)
        return True

    def _sender_refusal(
        self, session: Session, message: Message, speaking: SpeakFrom
    ) -> Refused | None:
        """Why the session may not send this message as it is: not from that address, or
        not by the node's policy (rates, rules)."""
        if isinstance(speaking, Refusal):
            return speaking
        return self._policy.check(session.id, message, session.identity)

    def _addressee_refusal(self, session_id: int, message: Message) -> Refused | None:
        """Why the message may not go to one of its addressees: a stream it may not publish
        on, or (a response) a requester that did not ask its sender."""
        for address in message.to:
            refused = self._monitor.send_to(session_id, address)
            if refused is not None:
                return refused
        if message.type == "response":
            return self._monitor.answer(message.to, message.id, message.from_)
        return None

    async def _learn(self, session_id: int, address: str) -> Refused | None:
        """The session speaks from an address nobody holds: it becomes the session's (its
        route learned and stored), unless the session, its client or the node holds its most
        learned addresses."""
        if self._table.holdings(session_id).learned >= self._quotas.learned_routes:
            self._metrics.quota_refusals.labels("learned_routes").inc()
            return Refusal(
                429,
                f"a runtime may send from at most {self._quotas.learned_routes} addresses "
                "it was not allocated",
            )
        bounded = self.learned.take(session_id)
        if bounded is not None:
            return bounded
        if not self._table.learn(session_id, address):
            self.learned.give(session_id)
            return None
        try:
            await self._routes.learn(session_id, address)
        except BaseException:
            # Not stored: not learned either (the message is sent again, or refused); the
            # table gives its place back.
            self._table.unlearn(session_id, address)
            raise
        return None

    async def _peer_outboxes(self, remote: set[str]) -> list[Outbox]:
        """The outboxes to each peer domain the message goes to (raises PeerRefused when one
        refuses it)."""
        assert self._abroad is not None  # there are remote domains only with it
        outboxes: list[Outbox] = []
        for domain in sorted(remote):
            link = await self._abroad.outbox(domain)
            if link is not None:
                outboxes.append(link)
        return outboxes

    def _waiting_refusal(
        self, owners: Iterable[int], sender_key: str, size: int
    ) -> tuple[int, str] | None:
        """Why the message may not wait for one of the sessions it goes to: that session (its
        client, the node) keeps too much already, or too much of this sender's."""
        for owner in owners:
            problem = waiting_refusal(
                self._waiting_bytes(owner, sender_key), size, self._waiting_bounds
            )
            if problem is not None:
                self._metrics.quota_refusals.labels("waiting_bytes").inc()
                return problem
        return None

    def _push(
        self,
        attachment: Attachment,
        message: Message,
        raw: str,
        outboxes: list[Outbox],
        pending: Pending | None,
    ) -> None:
        """The message goes to its lanes, numbered as its sender's: by its stub, or (a stub
        that does not number its messages) by the node."""
        session = attachment.session
        upstream = attachment.upstream
        if upstream is not None and pending is not None:
            sender, oseq = session.sender(upstream.origin), pending.seq
        else:
            origin, oseq = session.node_numbered()
            sender = session.sender(origin)
        routed = Routed(raw, message.to, sender, oseq)
        # Durable once every event carrying it is: the local lane's and each peer domain's.
        parts = [len(outboxes)] if len(outboxes) > 1 else None
        for outbox in outboxes:
            outbox.push(Outgoing(routed, session.id, upstream, pending, parts=parts))
        if message.type != "response":
            session.asked.note(message.id, message.to)
        self._routed.inc()

    def _remote_domains(
        self, addresses: tuple[str, ...], subscribed: frozenset[str], session_id: int
    ) -> set[str]:
        """The peer domains a message goes to (abroad.remote_domains)."""
        if self._abroad is None:
            return set()
        return remote_domains(self._abroad.peers, self._monitor, addresses, session_id, subscribed)

    @staticmethod
    def _assert_identity(identity: Identity | None, message: Message) -> tuple[str, str | None]:
        """(the message's text as it goes on, a reason to refuse it). The text gets
        ``assertedIdentity: true`` when the identity it asserts — or, from an authenticated
        runtime asserting none, the session's own, added — is the one the runtime proved; a
        message asserting someone else is refused."""
        check = check_assertion(message.body, identity)
        if check.outcome == "mismatch":
            return message.raw, check.reason
        if check.outcome == "match":
            return with_body_fields(message.raw, {"assertedIdentity": True}), None
        if check.outcome == "absent" and identity is not None and identity.authenticated:
            fields = {"identity": identity.to_rethink(), "assertedIdentity": True}
            return with_body_fields(message.raw, fields), None
        if "assertedIdentity" in message.body:
            # Only the node asserts: a sender's own claim is overwritten.
            return with_body_fields(message.raw, {"assertedIdentity": False}), None
        return message.raw, None

    async def _wait_for_room(self, outbox: Outbox, size: int, attachment: Attachment) -> bool:
        """A sender faster than the homeserver is slowed down, not refused: while this waits,
        the node reads no further frame from this stub, and TCP holds the sender back. A plain
        stub gets a 503 when the homeserver stays unable to take its messages. A numbered
        message, once taken, is the node's to carry: it waits as long as its session lives
        (its stub's resend after a reconnect is recognised as a duplicate)."""
        if attachment.upstream is None:
            return await outbox.wait_for_room(size, self._backpressure_timeout)
        while not attachment.session.released:
            if await outbox.wait_for_room(size, self._backpressure_timeout):
                return True
        return False

    async def _serve(
        self, service: MnService, attachment: Attachment, message: Message, pending: Pending | None
    ) -> bool:
        session = attachment.session
        upstream = attachment.upstream
        request = f"{upstream.origin}#{pending.seq}" if upstream and pending else None
        try:
            reply = await service.handle(
                message,
                Requester(
                    session.id, session.runtime_url, session.identity, request, session.claim
                ),
            )
        except Exception:
            log.exception("MN service failed", to=message.to_first, type=message.type)
            return await self._refuse(attachment, message, 500, "internal error in the MN", pending)
        # The request has taken effect: whatever fails from here on must not make it look
        # refused (a 500 to its sender, "rejected" in the journal) while its write stands.
        try:
            text = answer(
                message, reply.code, value=reply.value, desc=reply.desc, extra=reply.extra
            )
        except Exception:
            log.exception("an MN service's answer could not be written", to=message.to_first)
            self._metrics.failed_items.labels("service_answer").inc()
            text = answer(message, reply.code, desc=ANSWER_NOT_WRITTEN)
        self._journal.service(session.runtime_url, message.raw, text, reply.affected)
        self._metrics.messages_in.labels("service").inc()
        try:
            deferred = await self._answer(attachment, text, pending)
        except Exception:
            # Done all the same: sent again, the request would take effect twice.
            log.exception("an MN service's answer could not be delivered", to=message.to_first)
            self._metrics.failed_items.labels("service_answer").inc()
            deferred = False
        if reply.then is not None:
            try:
                await reply.then()
            except Exception:  # what others hear of must not cost the requester its answer
                log.exception("MN service follow-up failed", to=message.to_first)
        return deferred

    async def _refuse(
        self,
        attachment: Attachment,
        message: Message,
        code: int,
        reason: str,
        pending: Pending | None = None,
    ) -> bool:
        text = answer(message, code, desc=reason)
        deferred = await self._answer(attachment, text, pending)
        self._journal.rejected(attachment.session.runtime_url, message.raw, text)
        self._metrics.messages_in.labels(f"refused_{code}").inc()
        return deferred

    @staticmethod
    async def _answer(attachment: Attachment, text: str, pending: Pending | None = None) -> bool:
        """Deliver the node's answer; with ``pending`` (the request's place in its stub's
        numbering), the request is done once the answer is settled: whether that is later."""
        session = attachment.session
        if session.released:
            return False
        upstream = attachment.upstream
        ticket = Settles(upstream, pending) if upstream is not None and pending else None
        await session.mailbox.deliver(Parcel(text), ticket)
        return ticket is not None

    async def refuse_frame(
        self, attachment: Attachment | None, link: Link, raw: str | None, exc: InvalidMessage
    ) -> None:
        """A frame that is not a usable message: answer as a reTHINK response when it says who
        sent it, else with a control frame."""
        partial = exc.partial or {}
        sender = partial.get("from")
        if isinstance(sender, str) and sender:
            text = response(
                sender, reply_origin(partial), partial.get("id"), exc.code, desc=exc.reason
            )
            if attachment is not None:
                await self._answer(attachment, text)
            else:
                await link.send(text)
        else:
            text = control_error(exc.code, exc.reason)
            await link.send(text)
        self._journal.rejected(attachment.session.runtime_url if attachment else "", raw, text)
        self._metrics.messages_in.labels(f"refused_{exc.code}").inc()

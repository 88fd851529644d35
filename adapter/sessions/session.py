"""One runtime session and the connection attached to it."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..carrier import Sender
from ..identity.model import Identity
from .link import Link
from .mailbox import EPOCH_SHIFT, Mailbox
from .upstream import Upstream

# The origin suffix of messages the node numbers itself (from a stub that does not number them).
NODE_NUMBERED = "n"
# What a runtime's message is answered (401) once the credential of its identity expired.
CREDENTIAL_EXPIRED = (
    "the identity's credential expired; present a fresh one with {cmd:'auth'} "
    "(docs/stub-protocol.md)"
)


@dataclass(frozen=True, slots=True)
class AckHello:
    """What a stub speaking the acknowledged protocol says when it connects."""

    stub: str  # the stub instance: its numbering of messages starts again with a new one
    received: int  # the highest delivery number it has


# The destinations of requests a runtime sent that it may still be answered, at most (the
# oldest requests are forgotten first: an answer to one of those is refused as one to a request
# never sent). Counted in addresses, so that requests naming many destinations cost their size.
ASKED_ADDRESSES = 4096


class AskedRequests:
    """What a runtime asked and where: so that an answer is taken only from an address its
    request went to (access.py, "Answer"). Bounded, the oldest forgotten first."""

    __slots__ = ("_asked", "_held")

    def __init__(self) -> None:
        self._asked: OrderedDict[Any, tuple[str, ...]] = OrderedDict()
        self._held = 0

    def note(self, request_id: Any, to: tuple[str, ...]) -> None:
        key = _request_key(request_id)
        earlier = self._asked.pop(key, None)
        if earlier is not None:
            self._held -= len(earlier)
            to = tuple(dict.fromkeys(earlier + to))
        self._asked[key] = to
        self._held += len(to)
        while self._held > ASKED_ADDRESSES and self._asked:
            _key, forgotten = self._asked.popitem(last=False)
            self._held -= len(forgotten)

    def went_to(self, request_id: Any) -> tuple[str, ...]:
        """Where the request went; empty when it was never sent (or is forgotten)."""
        return self._asked.get(_request_key(request_id), ())


def _request_key(request_id: Any) -> Any:
    # 1 and "1" are two ids; 1 and 1.0 are one (JSON does not tell them apart).
    return (True, request_id) if isinstance(request_id, str) else (False, request_id)


class Session:
    __slots__ = (
        "_identity",
        "_node_numbered",
        "_senders",
        "asked",
        "attachment",
        "claim",
        "client",
        "detached_at",
        "id",
        "key",
        "mailbox",
        "protected",
        "released",
        "runtime_url",
        "upstream",
        "used",
        "user_id",
        "vouched_until",
    )

    def __init__(
        self,
        session_id: int,
        key: str,
        runtime_url: str,
        user_id: str,
        mailbox: Mailbox,
        epoch: int,
        identity: Identity | None = None,
        protected: bool = False,
    ) -> None:
        self.id = session_id
        # Random, kept with the session: the stem of the origins its messages are numbered in.
        self.key = key
        self.runtime_url = runtime_url
        self.user_id = user_id
        self.mailbox = mailbox
        self.attachment: Attachment | None = None
        self.upstream: Upstream | None = None
        self.detached_at: float | None = time.monotonic()
        self.released = False
        self._identity: Identity | None = None
        # Until when (seconds since the epoch) the node vouches for the identity: its
        # credential's expiry; infinity for no identity or one without a known end. Compared
        # with the clock for every message the runtime sends (routing/ingress.py).
        self.vouched_until = math.inf
        self._senders: dict[str, Sender] = {}
        # Who the runtime proved to be (None: anonymous), with its latest credential.
        self.identity = identity
        # Handed a session token: resumed only by a connection presenting it (or the identity).
        self.protected = protected
        self._node_numbered = epoch << EPOCH_SHIFT
        self.asked = AskedRequests()
        # The credential's claim on the runtimeURL (storage/models.py RuntimeSession.claim).
        self.claim = key
        # The client the session counts against (clients.py); "" for one read back at a start.
        self.client = ""
        # Whether the runtime did anything with the session (sent a frame, came back to it):
        # when sessions must be evicted, those never used go first (registry.py).
        self.used = False

    @property
    def session_id(self) -> int:
        return self.id

    @property
    def identity(self) -> Identity | None:
        return self._identity

    @identity.setter
    def identity(self, identity: Identity | None) -> None:
        if self._identity is not None and (
            identity is None or identity.user_id != self._identity.user_id
        ):
            self._senders.clear()  # they name the identity in the lane events
        self._identity = identity
        expires_at = identity.expires_at if identity is not None else None
        self.vouched_until = math.inf if expires_at is None else expires_at

    @property
    def identity_expired(self) -> bool:
        """The identity's credential has expired: the node no longer vouches for it."""
        return self.vouched_until <= time.time()

    def sender(self, origin: str) -> Sender:
        """How the lane events name this runtime for messages numbered in ``origin``."""
        sender = self._senders.get(origin)
        if sender is None:
            proved = self.identity.user_id if self.identity is not None else None
            sender = Sender(origin, self.runtime_url, self.user_id, proved)
            self._senders[origin] = sender
        return sender

    def upstream_for(
        self, stub: str, on_progress: Callable[[Upstream], None]
    ) -> tuple[Upstream, str | None]:
        """The numbering state of the stub instance ``stub``: kept across its reconnects, new
        when another instance (a reloaded page) takes the session. Also the origin that is
        retired by that (the previous instance's), if any."""
        origin = f"{self.key}.{stub}"
        retired = None
        if self.upstream is None or self.upstream.origin != origin:
            if self.upstream is not None:
                retired = self.upstream.origin
                self._senders.pop(retired, None)
            self.upstream = Upstream(origin, on_progress)
        return self.upstream, retired

    def origins(self) -> list[str]:
        """Every numbering this session's messages were carried in."""
        found = set(self._senders)
        if self.upstream is not None:
            found.add(self.upstream.origin)
        return sorted(found)

    def node_numbered(self) -> tuple[str, int]:
        """(origin, number) for a message from a stub that does not number its messages; the
        numbers grow across restarts of the node (their high bits are its start count)."""
        self._node_numbered += 1
        return f"{self.key}.{NODE_NUMBERED}", self._node_numbered


class Attachment:
    """The handle binding one stub connection to its session."""

    __slots__ = ("link", "resumed", "session", "upstream")

    def __init__(
        self, session: Session, link: Link, upstream: Upstream | None, resumed: bool
    ) -> None:
        self.session = session
        self.link = link
        # Set when the stub numbers its messages and acknowledges deliveries.
        self.upstream = upstream
        self.resumed = resumed

    @property
    def current(self) -> bool:
        """Still the session's connection (not replaced, not released)."""
        return self.session.attachment is self and not self.session.released

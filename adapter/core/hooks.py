"""The named places where a feature (federation, the domain's other processes, the operations
dashboard, the built-in registry) adds what it brings to the core.

A feature is attached after the core's base parts exist (storage, the homeserver API, the
routing table and its reference monitor, sessions, the journal) and before the message walk is
assembled from them (delivery, lanes, publisher, ingress, inbound, the stub endpoint): what a
feature sets here is read while that walk is assembled, and its listeners are called at their
points of the start and the stop. The core imports no feature; features import the core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from appservice.server import TransactionHandler

from ..routing.delivery import SendOn
from ..routing.publisher import PeerLinks
from ..routing.way_abroad import Abroad
from ..services.base import MnService

if TYPE_CHECKING:
    from .core import Core

Step = Callable[[], Awaitable[None]]


class Feature(Protocol):
    """A part of the node that not every domain runs. The composition root (node.py) chooses
    the features from the configuration; their order is their place in the start and the stop
    (each point of either calls them in that order)."""

    def attach(self, core: Core) -> None:
        """Build the feature's parts from the core's base parts and register its hooks."""
        ...

    async def start(self) -> None:
        """Once the core serves (its listeners are up)."""
        ...

    async def stop(self) -> None:
        """Once the core has flushed what it held and closed its listeners."""
        ...


@dataclass
class Hooks:
    # -- read while the message walk is assembled (None: the core routes inside its domain) --
    # The peer domain of an address of another domain (Delivery's ``foreign``).
    foreign: Callable[[str], str | None] | None = None
    # What the lanes carry for peers, sent on by the process that writes to them.
    send_on: SendOn | None = None
    # The ingress's way to other domains.
    abroad: Abroad | None = None
    # The node's own publications' links to peer domains (the publisher's).
    peer_links: PeerLinks | None = None
    # Told of every (un)subscription a runtime makes (the subscription manager's ``on_change``).
    subscription_changed: Callable[[str, list[str], str], Awaitable[str | None]] | None = None
    # Waits until the other processes' changes to the routing state have reached the table.
    catch_up: Callable[[], Awaitable[None]] | None = None
    # The domain registry's service when the node answers it itself (else the relay).
    registry_service: MnService | None = None
    # Whether anything is registered under a runtime credential's claim.
    claim_in_use: Callable[[str], Awaitable[bool]] | None = None
    # Takes a runtime's sessions from the process ``holder`` (domains on several processes).
    take_sessions: Callable[[str, str], Awaitable[bool]] | None = None
    # Wrappers of the appservice's transaction handler (the dashboard's tap), innermost first.
    transactions: list[Callable[[TransactionHandler], TransactionHandler]] = field(
        default_factory=list
    )
    # Once the message walk is assembled: the features' parts that need it are built.
    assembled: list[Callable[[], None]] = field(default_factory=list)

    # -- the start, in its order --
    # Before the state is read from the database.
    before_load: list[Step] = field(default_factory=list)
    # The start count and the senders' marks, as the database left them.
    marks_loaded: list[Callable[[int, dict[str, int]], None]] = field(default_factory=list)
    # Once the sessions are read back (before the routes are).
    sessions_loaded: list[Step] = field(default_factory=list)
    # Routes of the appservice's listener (before it listens).
    appservice_routes: list[Callable[[web.Application], None]] = field(default_factory=list)
    # Once the lanes are starting, with the rooms' read positions (before runtimes connect).
    lanes_started: list[Callable[[dict[str, str]], Awaitable[None]]] = field(default_factory=list)

    # -- the stop, in its order --
    # First of all, before the stub endpoint stops reading.
    stopping: list[Step] = field(default_factory=list)
    # Once the lanes are flushed (only when the node has lanes).
    lanes_flushed: list[Step] = field(default_factory=list)

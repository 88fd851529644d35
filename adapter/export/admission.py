"""Which room events count as the domain's traffic, for the export and the dashboard.

The homeserver pushes (and the room history holds) every event of the rooms the node's users
are in, including what a peer domain's node writes into the rooms it shares with this one, and
whatever any member of such a room sends. Only what this node itself writes, or what a peer's
node writes as that peer, is counted: the homeserver vouches for an event's sender, and a
sender in this node's namespace (or its bot) can only be this node. A peer's events are
counted as that peer's messages and never as this domain's: a message it carries that claims
to come from another domain (this one included) is left out, and so is any journal event it
writes (only this node keeps the journal of what it decided).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .. import carrier
from ..addresses import domain_of
from ..config import NodeConfig
from .rows import Row

# The default localpart of a peer node's bot (federation/peers.py speaks to peers with it).
_PEER_BOT_LOCALPART: Final = "_rethink_bot"
LOCAL: Final = ""


class EventAdmission:
    def __init__(
        self, server_name: str, user_prefix: str, bot: str, peer_bots: Mapping[str, str]
    ) -> None:
        self._suffix = f":{server_name}"
        self._prefix = f"@{user_prefix}"
        self._bot = bot
        self._peer_bots = dict(peer_bots)

    @classmethod
    def for_node(cls, config: NodeConfig) -> EventAdmission:
        server = config.homeserver.server_name
        peers = {
            peer.bot or f"@{_PEER_BOT_LOCALPART}:{peer.server_name or domain}": domain
            for domain, peer in config.federation.peers.items()
        }
        return cls(
            server,
            config.appservice.user_prefix,
            f"@{config.appservice.sender_localpart}:{server}",
            peers,
        )

    def origin(self, event: Mapping[str, Any]) -> str | None:
        """``LOCAL`` for this node's own events, the peer's domain for a peer node's batch,
        None for anything else (not counted)."""
        sender = event.get("sender")
        if not isinstance(sender, str):
            return None
        if sender == self._bot or (
            sender.startswith(self._prefix) and sender.endswith(self._suffix)
        ):
            return LOCAL
        peer = self._peer_bots.get(sender)
        if peer is not None and event.get("type") == carrier.BATCH_EVENT:
            return peer
        return None

    @staticmethod
    def rows(origin: str, rows: list[Row]) -> list[Row]:
        """A peer's rows keep only the messages that come from the peer's own domain, with
        the sending runtime only when it is the peer's too."""
        if origin == LOCAL:
            return rows
        kept = []
        for row in rows:
            sender = row.get("from")
            if not isinstance(sender, str) or domain_of(sender) != origin:
                continue
            runtime = row.get("runtime")
            if not isinstance(runtime, str) or domain_of(runtime) != origin:
                row = {**row, "runtime": None}
            kept.append(row)
        return kept

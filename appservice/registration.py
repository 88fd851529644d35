"""The registration file the homeserver loads to know this application service."""

from __future__ import annotations

import re
import secrets
from typing import Any


def new_token() -> str:
    return secrets.token_urlsafe(32)


def build_registration(
    *,
    appservice_id: str,
    url: str,
    as_token: str,
    hs_token: str,
    sender_localpart: str,
    user_prefix: str,
    alias_prefix: str,
    server_name: str,
    receive_ephemeral: bool = True,
) -> dict[str, Any]:
    """A Synapse registration: exclusive user and alias namespaces, no rate limiting.

    Rate limits are off because every runtime's traffic is sent by the appservice; the node
    applies its own limits at the stub endpoint. Ephemeral events are on for read receipts: a
    peer domain's node confirms with them what it has handled (flow control between domains).
    """
    # Anchored at both ends (Synapse matches from the start only): a server whose name starts
    # with ours must not fall into our namespace, nor an alias whose localpart holds a colon.
    server = re.escape(server_name)
    return {
        "id": appservice_id,
        "url": url,
        "as_token": as_token,
        "hs_token": hs_token,
        "sender_localpart": sender_localpart,
        "rate_limited": False,
        "receive_ephemeral": receive_ephemeral,
        "namespaces": {
            "users": [{"exclusive": True, "regex": f"@{re.escape(user_prefix)}[^:]*:{server}$"}],
            "aliases": [{"exclusive": True, "regex": f"#{re.escape(alias_prefix)}[^:]*:{server}$"}],
            "rooms": [],
        },
    }

"""Hypothesis strategies for what a hostile runtime or peer can send: the stub frame grammar
(docs/stub-protocol.md), MN service request bodies, and appservice transaction bodies.

Values lean towards the edges the node must hold: integers beyond 2^53 and 2^64, deep and wide
JSON, empty and over-long strings, wrong types in every field, the node's own service
addresses and the addresses of the honest runtimes beside the attacker.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

D = "mn.test"


def text(max_size: int, min_size: int = 0) -> st.SearchStrategy[str]:
    """Any text a WebSocket frame can hold (no lone surrogates: they are not UTF-8)."""
    return st.text(st.characters(exclude_categories=("Cs",)), min_size=min_size, max_size=max_size)


MN = f"domain://msg-node.{D}"
SERVICES = (
    f"{MN}/hyperty-address-allocation",
    f"{MN}/object-address-allocation",
    f"{MN}/address-allocation",
    f"{MN}/sm",
    f"{MN}/nothing-here",
    f"domain://registry.{D}",
    f"domain://registry.{D}/",
    f"domain://idm.{D}",
    "global://registry/",
)
TYPES = (
    "create",
    "read",
    "update",
    "delete",
    "subscribe",
    "unsubscribe",
    "response",
    "forward",
    "execute",
    "CREATE",
    "ping",
)
EDGE_INTEGERS = (0, -1, 1, 2**31, 2**53 - 1, 2**53, 2**53 + 1, 2**63, 2**64 + 1, -(2**70), 10**40)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EDGE_INTEGERS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    text(40),
    st.text(alphabet="\x00\x1f\x7f\u2028\ufeff/:@", max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(text(12), children, max_size=4)
    ),
    max_leaves=24,
)


# What can reach this node inside a Matrix event: canonical JSON (integers within ±(2^53 - 1),
# no floats); a homeserver refuses anything else before it is stored or federated.
CANONICAL_EDGES = (0, -1, 1, 2**31, 2**53 - 1, -(2**53 - 1))
canonical_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(CANONICAL_EDGES),
        st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1),
        text(40),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(text(12), children, max_size=4)
    ),
    max_leaves=24,
)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def addresses(known: list[str]) -> st.SearchStrategy[str]:
    """Addresses: of the honest runtimes and their children and streams, the node's services,
    plausible strangers, and arbitrary text."""
    children = [f"{a}{suffix}" for a in known for suffix in ("/changes", "/registration", "/x")]
    return st.one_of(
        st.sampled_from(known + children + list(SERVICES)),
        st.builds(
            lambda scheme, name: f"{scheme}://{D}/{name}",
            st.sampled_from(["hyperty", "runtime", "user", "comm", "connection", "ctxt"]),
            st.text(alphabet="abcdef0123456789-", min_size=1, max_size=12),
        ),
        text(60),
        st.just("x" * 1100),
    )


def service_bodies(known: list[str]) -> st.SearchStrategy[Any]:
    """Bodies in the shapes the MN services read, with hostile values in their fields."""
    address = addresses(known)
    address_lists = st.one_of(address, st.lists(st.one_of(address, json_values), max_size=5))
    allocation = st.fixed_dictionaries(
        {},
        optional={
            "scheme": st.one_of(st.sampled_from(["hyperty", "comm", "", "x" * 300]), json_values),
            "value": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "number": st.one_of(st.sampled_from(EDGE_INTEGERS), json_values),
                        "allocationKey": st.one_of(text(50), json_values),
                    },
                ),
                json_values,
            ),
            "resource": st.one_of(address, json_values),
            "childrenResources": st.one_of(address_lists, st.lists(st.lists(address))),
        },
    )
    subscription = st.fixed_dictionaries(
        {},
        optional={
            "resources": address_lists,
            "subscribe": address_lists,
            "unsubscribe": address_lists,
            "resource": st.one_of(address, json_values),
            "childrenResources": address_lists,
            "source": st.one_of(address, json_values),
        },
    )
    registry_value = st.fixed_dictionaries(
        {},
        optional={
            "url": st.one_of(address, json_values),
            "user": st.one_of(address, json_values),
            "descriptor": st.one_of(text(30), json_values),
            "expires": st.one_of(st.sampled_from(EDGE_INTEGERS), json_values),
            "resources": st.one_of(st.lists(text(10), max_size=3), json_values),
            "dataSchemes": st.one_of(st.lists(text(10), max_size=3), json_values),
            "status": st.one_of(st.sampled_from(["live", "disconnected", "created"]), json_values),
            "runtime": st.one_of(address, json_values),
            "p2pHandler": json_values,
            "p2pRequester": json_values,
            "guid": st.one_of(text(20), json_values),
            "name": json_values,
            "schema": json_values,
            "reporter": st.one_of(address, json_values),
        },
    )
    registry = st.fixed_dictionaries(
        {},
        optional={
            "resource": st.one_of(
                st.builds(
                    lambda kind, key: f"/{kind}/{key}",
                    st.sampled_from(
                        ["hyperty/user", "hyperty/url", "hyperty/guid", "dataObject/url", "x"]
                    ),
                    address,
                ),
                address,
                json_values,
            ),
            "value": st.one_of(registry_value, json_values),
            "criteria": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "resources": json_values,
                        "dataSchemes": json_values,
                        "reporter": json_values,
                    },
                ),
                json_values,
            ),
        },
    )
    identity = st.fixed_dictionaries(
        {},
        optional={
            "method": st.one_of(st.sampled_from(["validateAssertion", "read"]), json_values),
            "params": json_values,
            "resource": json_values,
            "identity": json_values,
            "assertedIdentity": json_values,
        },
    )
    return st.one_of(allocation, subscription, registry, identity, json_values)


def messages(known: list[str]) -> st.SearchStrategy[Any]:
    """reTHINK messages, from well formed to every field of the wrong type."""
    address = addresses(known)
    return st.one_of(
        st.fixed_dictionaries(
            {
                "id": st.one_of(st.integers(min_value=0, max_value=10**6), text(20), json_values),
                "type": st.one_of(st.sampled_from(TYPES), text(80), json_values),
                "from": st.one_of(address, json_values),
                "to": st.one_of(address, st.lists(address, max_size=300), json_values),
            },
            optional={"body": st.one_of(service_bodies(known), json_values)},
        ),
        json_values,
    )


def numbers() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(EDGE_INTEGERS),
        st.integers(min_value=1, max_value=10**6),
        text(8),
        st.floats(),
    )


def _text(value: Any) -> str:
    # The standard library writes integers of any size, as a hostile stub would.
    return json.dumps(value, allow_nan=True)


def frames(known: list[str]) -> st.SearchStrategy[str]:
    """Text frames a stub can send: numbered messages, plain messages, control frames,
    non-JSON, and nesting beyond the parser's limit."""
    message = messages(known)
    control = st.fixed_dictionaries(
        {"cmd": st.one_of(st.sampled_from(["ack", "connect", "disconnect", "auth"]), json_values)},
        optional={
            "received": numbers(),
            "seq": numbers(),
            "data": st.one_of(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "runtimeURL": st.one_of(address_like(), json_values),
                        "token": json_values,
                        "ack": json_values,
                        "auth": json_values,
                    },
                ),
                json_values,
            ),
            "body": json_values,
        },
    )
    return st.one_of(
        st.builds(lambda seq, m: f"[{_text(seq)},{_text(m)}]", numbers(), message),
        message.map(_text),
        control.map(_text),
        text(200),
        st.sampled_from([deep(1100), "[" * 5000, "{" * 100, "[1,", '[1,"x"]', "[,]"]),
    )


def address_like() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just(f"runtime://{D}/fuzz-mallory"),
        text(30),
        st.just("r" * 2000),
        st.just("runtime://x/\x00"),
    )


def lane_batches(
    to: list[str], peer: str, peer_bot: str, values: st.SearchStrategy[Any] = json_values
) -> st.SearchStrategy[Any]:
    """Lane batch contents (carrier.LANE_FORMAT) a peer's node can write, from well formed (its
    messages to ``to``, from its own addresses or not) to every field wrong in every way."""
    number = st.one_of(st.sampled_from(EDGE_INTEGERS), st.integers(1, 10**6), text(8))
    message = st.one_of(
        st.builds(
            _text,
            st.fixed_dictionaries(
                {
                    "id": json_values,
                    "type": st.sampled_from(["ping", "subscribe", "response", "read", "update"]),
                    "from": st.sampled_from(
                        [
                            f"hyperty://{peer}/x",
                            f"hyperty://{D}/x",
                            "x",
                            f"domain://msg-node.{peer}/sm",
                        ]
                    ),
                    "to": st.one_of(st.sampled_from(to), text(20)),
                },
                optional={"body": json_values},
            ),
        ),
        text(40),
    )
    entry = st.tuples(
        st.one_of(st.integers(0, 2), values),
        number,
        st.one_of(st.lists(st.sampled_from(to), max_size=3), values),
        st.one_of(message, values),
    ).map(list)
    sender = st.one_of(
        st.tuples(
            st.one_of(st.sampled_from(["pfuzz", "a" * 200]), text(20)),
            st.one_of(st.just(f"runtime://{peer}/pfuzz"), text(20)),
            st.one_of(st.just(peer_bot), text(20)),
        ).map(list),
        values,
    )
    return st.fixed_dictionaries(
        {"v": st.one_of(st.just(2), values)},
        optional={
            "n": number,
            "count": st.one_of(st.integers(0, 4), values),
            "senders": st.one_of(st.lists(sender, min_size=1, max_size=3), values),
            "messages": st.one_of(st.lists(entry, max_size=4), values),
            "media": values,
        },
    )


def transactions(
    known: list[str], peer: str, peer_bot: str, own_bot: str
) -> st.SearchStrategy[Any]:
    """Appservice transaction bodies: events of the node's own types with hostile content, most
    of them from the peer's node (``peer_bot``), in a few rooms, so that the node's handlers act
    on them: invitations to ``own_bot``, lane batches for the runtimes ``known``."""
    journal = st.fixed_dictionaries(
        {},
        optional={
            "v": st.one_of(st.sampled_from([1, 2]), json_values),
            "n": numbers(),
            "lane": json_values,
            "count": json_values,
            "entries": json_values,
            "membership": json_values,
        },
    )
    content = st.one_of(
        lane_batches(known, peer, peer_bot),
        journal,
        st.fixed_dictionaries({"membership": st.sampled_from(["invite", "join", "leave"])}),
        json_values,
    )
    event = st.fixed_dictionaries(
        {
            "type": st.one_of(
                st.sampled_from(
                    [
                        "eu.rethink-project.mn.batch",
                        "eu.rethink-project.mn.journal",
                        "m.room.member",
                        "m.room.message",
                    ]
                ),
                json_values,
            ),
            "content": content,
        },
        optional={
            "event_id": st.one_of(text(20), json_values),
            "room_id": st.one_of(
                st.sampled_from(["!fuzz1:peer.hs", "!fuzz2:peer.hs", "!fuzz:hs"]),
                text(20),
                json_values,
            ),
            "sender": st.one_of(
                st.sampled_from([peer_bot, peer_bot, own_bot, "@evil:hs"]), text(20)
            ),
            "state_key": st.one_of(st.just(own_bot), json_values),
            "origin_server_ts": st.one_of(st.sampled_from(EDGE_INTEGERS), json_values),
        },
    )
    return st.one_of(
        st.fixed_dictionaries({"events": st.lists(st.one_of(event, json_values), max_size=5)}),
        st.fixed_dictionaries({"events": json_values}),
        json_values,
    ).map(_text)

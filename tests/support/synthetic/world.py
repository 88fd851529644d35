"""The fixed cast of a synthetic export: domains, runtimes, hyperties, data objects, MN services.

Every address the generator can write is interned once in `World.pool`; messages refer to
addresses by their index in the pool, so a chunk of millions of rows is a handful of integer
arrays until it is written (Arrow then turns codes into strings with one `take`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

SERVER_NAME: Final = "mn.example"
BOT_USER: Final = f"@_rethink_bot:{SERVER_NAME}"
JOURNAL_ROOM: Final = f"!journal0000000000:{SERVER_NAME}"

# Message types the generator uses; codes are indexes.
TYPES: Final = (
    "ping",
    "read",
    "create",
    "execute",
    "delete",
    "update",
    "response",
    "subscribe",
    "unsubscribe",
)
T_PING, T_READ, T_CREATE, T_EXECUTE, T_DELETE, T_UPDATE, T_RESPONSE, T_SUBSCRIBE, T_UNSUBSCRIBE = (
    range(len(TYPES))
)

IntArray = npt.NDArray[np.int64]


def _authority(address: str) -> tuple[str, str]:
    """(scheme, authority) of the first address in a space-joined list."""
    first = address.split(" ", 1)[0]
    scheme, _, rest = first.partition("://")
    return scheme, rest.split("/", 1)[0]


def _hex(text: str, digits: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


class _Pool:
    def __init__(self) -> None:
        self.addresses: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, address: str) -> int:
        if address not in self._index:
            self._index[address] = len(self.addresses)
            self.addresses.append(address)
        return self._index[address]


@dataclass(frozen=True)
class World:
    domains: tuple[str, ...]
    pool: tuple[str, ...]
    pool_scheme: IntArray
    """Per pool entry: index into `schemes`."""
    pool_authority: IntArray
    """Per pool entry: index into `authorities`."""
    schemes: tuple[str, ...]
    authorities: tuple[str, ...]
    pool_is_hyperty: npt.NDArray[np.bool_]
    runtime_urls: tuple[str, ...]
    runtime_users: tuple[str, ...]
    runtime_rooms: tuple[str, ...]
    runtime_domain: IntArray
    runtime_weight: npt.NDArray[np.float64]
    hyperty: IntArray
    """(runtimes, hyperties per runtime): pool codes."""
    pool_runtime: IntArray
    """Per pool entry: the runtime that owns it (hyperties, objects, their children), else -1."""
    obj: IntArray
    """(runtimes, objects per runtime): pool codes of reporter data objects."""
    changes: IntArray
    """Same shape: pool codes of `<obj>/changes`."""
    subscribers: IntArray
    """Same shape: how many connections observe each object."""
    runtime_allocation_address: IntArray
    allocation_service: IntArray
    """Per domain."""
    subscription_manager: IntArray
    registry: IntArray
    idm: IntArray
    other_service: IntArray
    global_registry: int
    unknown: IntArray
    """Addresses nobody owns (rejected with 404)."""
    multi: IntArray
    """Space-joined lists of two or three hyperties."""
    multi_first: IntArray
    multi_count: IntArray

    @property
    def runtimes(self) -> int:
        return len(self.runtime_urls)


def build_world(
    rng: np.random.Generator,
    domains: int = 3,
    runtimes_per_domain: int = 10,
    hyperties_per_runtime: int = 6,
    objects_per_runtime: int = 4,
) -> World:
    names = tuple(
        ("alpha", "beta", "gamma", "delta", "epsilon")[i] + ".example" if i < 5 else f"d{i}.example"
        for i in range(domains)
    )
    pool = _Pool()
    runtime_urls: list[str] = []
    runtime_domain: list[int] = []
    for d, name in enumerate(names):
        for k in range(runtimes_per_domain):
            runtime_urls.append(f"runtime://{name}/{_hex(f'{name}{k}', 12)}")
            runtime_domain.append(d)
    runtimes = len(runtime_urls)
    hyperty = np.empty((runtimes, hyperties_per_runtime), dtype=np.int64)
    owner: dict[int, int] = {}
    obj = np.empty((runtimes, objects_per_runtime), dtype=np.int64)
    changes = np.empty_like(obj)
    allocation_address = np.empty(runtimes, dtype=np.int64)
    for r, url in enumerate(runtime_urls):
        name = names[runtime_domain[r]]
        allocation_address[r] = pool.add(f"{url}/registry/allocation")
        for h in range(hyperties_per_runtime):
            code = pool.add(f"hyperty://{name}/{_hex(f'{url}h{h}', 16)}")
            hyperty[r, h] = code
            owner[code] = r
        for o in range(objects_per_runtime):
            scheme = ("comm", "connection", "ctxt")[o % 3]
            address = f"{scheme}://{name}/{_hex(f'{url}o{o}', 16)}"
            obj[r, o] = pool.add(address)
            changes[r, o] = pool.add(f"{address}/changes")
            owner[int(obj[r, o])] = owner[int(changes[r, o])] = r

    def per_domain(path: str) -> IntArray:
        return np.array([pool.add(path.format(d=name)) for name in names], dtype=np.int64)

    allocation_service = per_domain("domain://msg-node.{d}/hyperty-address-allocation")
    subscription_manager = per_domain("domain://msg-node.{d}/sm")
    registry = per_domain("domain://registry.{d}")
    idm = per_domain("domain://idm.{d}")
    other_service = per_domain("domain://msg-node.{d}/unknown-service")
    global_registry = pool.add("global://registry/")
    unknown = np.array(
        [pool.add(f"hyperty://{names[i % domains]}/gone-{i:04d}") for i in range(200)],
        dtype=np.int64,
    )
    flat_hyperties = hyperty.ravel()
    multi_list: list[int] = []
    multi_first: list[int] = []
    multi_count: list[int] = []
    for _ in range(100):
        size = int(rng.integers(2, 4))
        members = rng.choice(flat_hyperties, size=size, replace=False)
        multi_list.append(pool.add(" ".join(pool.addresses[int(m)] for m in members)))
        multi_first.append(int(members[0]))
        multi_count.append(size)

    # A few runtimes do most of the talking (Zipf-like), as in any real deployment.
    weight = 1.0 / np.arange(1, runtimes + 1) ** 0.9
    weight = weight[rng.permutation(runtimes)]
    # Most objects have a handful of observers, a few are watched by hundreds.
    subscribers = np.minimum(rng.zipf(1.6, size=obj.shape) - 1, 400).astype(np.int64)

    scheme_names: dict[str, int] = {}
    authority_names: dict[str, int] = {}
    pool_scheme = np.empty(len(pool.addresses), dtype=np.int64)
    pool_authority = np.empty(len(pool.addresses), dtype=np.int64)
    for i, address in enumerate(pool.addresses):
        scheme, authority = _authority(address)
        pool_scheme[i] = scheme_names.setdefault(scheme, len(scheme_names))
        pool_authority[i] = authority_names.setdefault(authority, len(authority_names))
    hyperty_scheme = scheme_names["hyperty"]
    pool_runtime = np.full(len(pool.addresses), -1, dtype=np.int64)
    for code, r in owner.items():
        pool_runtime[code] = r
    return World(
        domains=names,
        pool=tuple(pool.addresses),
        pool_scheme=pool_scheme,
        pool_authority=pool_authority,
        schemes=tuple(scheme_names),
        authorities=tuple(authority_names),
        pool_is_hyperty=pool_scheme == hyperty_scheme,
        runtime_urls=tuple(runtime_urls),
        runtime_users=tuple(f"@_rethink_{_hex(url, 32)}:{SERVER_NAME}" for url in runtime_urls),
        runtime_rooms=tuple(f"!{_hex('room' + url, 18)}:{SERVER_NAME}" for url in runtime_urls),
        runtime_domain=np.array(runtime_domain, dtype=np.int64),
        runtime_weight=weight / weight.sum(),
        hyperty=hyperty,
        pool_runtime=pool_runtime,
        obj=obj,
        changes=changes,
        subscribers=subscribers,
        runtime_allocation_address=allocation_address,
        allocation_service=allocation_service,
        subscription_manager=subscription_manager,
        registry=registry,
        idm=idm,
        other_service=other_service,
        global_registry=global_registry,
        unknown=unknown,
        multi=np.array(multi_list, dtype=np.int64),
        multi_first=np.array(multi_first, dtype=np.int64),
        multi_count=np.array(multi_count, dtype=np.int64),
    )

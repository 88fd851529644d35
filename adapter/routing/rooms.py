"""Provisioning the rooms traffic travels in: the lanes and the journal.

Both are written by the appservice's bot. A room is created once and kept in the room map;
after a restart the map (or, failing that, the alias) finds it again. docs/matrix-mapping.md
says why lanes.
"""

from __future__ import annotations

import asyncio
import hashlib

import structlog

from appservice.intent import AppserviceAPI, Intent

from ..storage.rooms import RoomStore

LANE = "lane"
JOURNAL = "journal"
TO_PEER = "to-peer"  # written by this node, read by a peer domain's node
FROM_PEER = "from-peer"  # written by a peer domain's node, read by this one

# A room this node writes in is its bot's alone: the peer's node it invites (and anyone else)
# may join and read, but sends nothing but its membership (Matrix checks the power levels on
# every server that holds the room).
WRITER_POWER = 100
WRITER_ONLY = {"events_default": WRITER_POWER, "state_default": WRITER_POWER}
# Rooms created in search of one on a given event persister, per persister, before settling
# for any: each try lands on the wanted one with a chance of 1/persisters, so all of them miss
# with a chance of about e^-6 (0.25 %).
PLACEMENT_ATTEMPTS_PER_PERSISTER = 6

log = structlog.get_logger(__name__)


def runtime_hash(runtime_url: str) -> str:
    return hashlib.sha256(runtime_url.encode()).hexdigest()[:32]


def persister_of(room_id: str, persisters: int) -> int:
    """The index of the event persister Synapse gives a room's events to when it has
    ``persisters`` of them: it shards the events stream by the SHA-256 of the room id, read as a
    little-endian integer, modulo the number of writers (Synapse's `ShardedWorkerHandlingConfig`).
    Only placement depends on it: a room on another persister works, just not side by side."""
    digest = hashlib.sha256(room_id.encode()).digest()
    return int.from_bytes(digest, "little") % persisters


class RoomDirectory:
    def __init__(
        self,
        api: AppserviceAPI,
        store: RoomStore,
        user_prefix: str,
        alias_prefix: str,
        persisters: int = 1,
        process: str | None = None,
    ) -> None:
        self._api = api
        # A domain's node processes each write their own lanes and journal (one writer per
        # room keeps its order the writer's).
        self._own = "" if process is None else f"_{process}"
        # The user the domain's node processes read each other's lanes as (Synapse serves no
        # /sync to an appservice's own user): a member of every process's lanes.
        self.lane_reader: Intent | None = None
        if process is not None:
            self.lane_reader = api.intent(api.user_id(f"{user_prefix}lanes"))
        self._reader_in: set[str] = set()
        self._persisters = persisters
        self._store = store
        self._user_prefix = user_prefix
        self._alias_prefix = alias_prefix
        self._rooms: dict[str, str] = {}  # alias localpart -> room id
        self._locks: dict[str, asyncio.Lock] = {}
        # Rooms the room map did not know: created now, or found by alias (a new database on a
        # homeserver that served an earlier one). Their history is not this database's.
        self.adopted: set[str] = set()

    def virtual_user(self, runtime_url: str) -> str:
        """The Matrix user a runtime is, in the appservice's namespace: named in the lane
        events that carry its messages (the audit trail)."""
        return self._api.user_id(f"{self._user_prefix}{runtime_hash(runtime_url)}")

    async def lane(self, index: int, refresh: bool = False) -> tuple[Intent, str]:
        room_id = await self._ensure(
            f"{self._alias_prefix}lane{self._own}_{index}",
            LANE,
            refresh,
            f"reTHINK lane{self._own} {index}",
            persister=index % self._persisters if self._persisters > 1 else None,
        )
        if self.lane_reader is not None and room_id not in self._reader_in:
            await self._api.bot.invite(room_id, self.lane_reader.user_id)
            await self.lane_reader.join(room_id)
            self._reader_in.add(room_id)
        return self._api.bot, room_id

    async def journal(self, refresh: bool = False) -> tuple[Intent, str]:
        room_id = await self._ensure(
            f"{self._alias_prefix}journal{self._own}",
            JOURNAL,
            refresh,
            "reTHINK message node journal",
        )
        return self._api.bot, room_id

    async def to_peer(
        self, domain: str, peer_bot: str, refresh: bool = False
    ) -> tuple[Intent, str]:
        """The room this node writes what it sends to ``domain`` into, the peer's node invited
        (federated: the peer's homeserver keeps a copy of the history too)."""
        room_id = await self._ensure(
            f"{self._alias_prefix}to_{domain}",
            TO_PEER,
            refresh,
            f"reTHINK traffic to {domain}",
            invite=(peer_bot,),
        )
        return self._api.bot, room_id

    async def writer_only(self, room_id: str) -> None:
        """Make sure only the bot sends events in ``room_id`` (rooms created before this rule
        get their power levels raised)."""
        bot = self._api.bot
        levels = await bot.state(room_id, "m.room.power_levels")
        found = levels.get("users")
        users: dict[str, int] = found if isinstance(found, dict) else {}
        if all(levels.get(k) == v for k, v in WRITER_ONLY.items()) and not any(
            level >= WRITER_POWER for user, level in users.items() if user != bot.user_id
        ):
            return
        lowered = {u: 0 for u in users if u != bot.user_id}
        await bot.put_state(
            room_id,
            "m.room.power_levels",
            {**levels, **WRITER_ONLY, "users": {**lowered, bot.user_id: WRITER_POWER}},
        )

    async def writes_in(self, room_id: str) -> bool:
        """Whether this node writes in ``room_id`` (a lane, the journal, a room to a peer)."""
        if room_id in self._rooms.values():
            return True
        return bool(await self._store.purposes(room_id) - {FROM_PEER})

    async def joined_from_peer(self, room_id: str, domain: str) -> None:
        """Remember a room a peer's node writes into for this one (joined on its invite)."""
        await self._store.add(
            room_id, f"from:{domain}:{room_id}", FROM_PEER, self._api.bot.user_id, None
        )

    async def left_from_peer(self, room_id: str) -> None:
        """Forget a room a peer's node wrote into for this one (its node left it, or it is no
        peer any more)."""
        await self._store.forget(room_id, FROM_PEER)

    async def from_peer_rooms(self) -> list[tuple[str, str]]:
        """(room id, peer domain) of every room peers write into for this node."""
        return [
            (room_id, alias.split(":", 2)[1])
            for room_id, alias, purpose, _creator in await self._store.all()
            if purpose == FROM_PEER
        ]

    async def _ensure(
        self,
        localpart: str,
        purpose: str,
        refresh: bool,
        name: str,
        invite: tuple[str, ...] = (),
        persister: int | None = None,
    ) -> str:
        if not refresh and (cached := self._rooms.get(localpart)) is not None:
            return cached
        lock = self._locks.setdefault(localpart, asyncio.Lock())
        async with lock:
            if not refresh and (cached := self._rooms.get(localpart)) is not None:
                return cached
            alias = self._api.alias(localpart)
            intent = self._api.bot
            room_id = None if refresh else await self._store.by_alias(alias)
            if room_id is None and persister is not None:
                room_id = await self._create_on_persister(localpart, name, persister)
                await self._store.add(room_id, alias, purpose, intent.user_id, None)
                self.adopted.add(room_id)
            if room_id is None:
                # create_room answers the existing room when the alias is taken (a room map lost
                # with its database); joining is a no-op for a member and repairs a membership
                # that was lost.
                room_id = await intent.create_room(
                    alias_localpart=localpart,
                    name=name,
                    invite=invite,
                    federate=bool(invite),
                    power_level_override=WRITER_ONLY if invite else None,
                )
                await intent.join(room_id)
                for user in invite:
                    # Repairs an invitation lost with a room found by its alias.
                    await intent.invite(room_id, user)
                await self._store.add(room_id, alias, purpose, intent.user_id, None)
                self.adopted.add(room_id)
            self._rooms[localpart] = room_id
            return room_id

    async def _create_on_persister(self, localpart: str, name: str, persister: int) -> str:
        """A room under ``#localpart`` whose events go to event persister ``persister``: rooms
        are created without the alias until one lands there (the others are left), then the
        alias is pointed at it. A room the alias already names is kept wherever it is."""
        intent = self._api.bot
        alias = self._api.alias(localpart)
        for _ in range(PLACEMENT_ATTEMPTS_PER_PERSISTER * self._persisters):
            if (existing := await intent.resolve_alias(alias)) is not None:
                await intent.join(existing)
                return existing
            room_id = await intent.create_room(name=name)
            if persister_of(room_id, self._persisters) == persister and await intent.put_alias(
                alias, room_id
            ):
                return room_id
            await intent.leave_and_forget(room_id)
        log.warning("room not placed on its event persister", alias=alias, persister=persister)
        room_id = await intent.create_room(alias_localpart=localpart, name=name)
        await intent.join(room_id)
        return room_id

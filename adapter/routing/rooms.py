"""Provisioning the rooms traffic travels in: each runtime's outbox and the journal.

See docs/matrix-mapping.md for why one outbox room per runtime. A room is created once and kept
in the room map; after a restart the map (or, failing that, the alias) finds it again.
"""

from __future__ import annotations

import asyncio
import hashlib

from appservice.intent import AppserviceAPI, Intent

from ..storage.rooms import RoomStore

OUTBOX = "outbox"
JOURNAL = "journal"


def runtime_hash(runtime_url: str) -> str:
    return hashlib.sha256(runtime_url.encode()).hexdigest()[:32]


class RoomDirectory:
    def __init__(
        self, api: AppserviceAPI, store: RoomStore, user_prefix: str, alias_prefix: str
    ) -> None:
        self._api = api
        self._store = store
        self._user_prefix = user_prefix
        self._alias_prefix = alias_prefix
        self._rooms: dict[str, str] = {}  # alias localpart -> room id
        self._locks: dict[str, asyncio.Lock] = {}

    def virtual_user(self, runtime_url: str) -> str:
        """The Matrix user a runtime acts as."""
        return self._api.user_id(f"{self._user_prefix}{runtime_hash(runtime_url)}")

    def outbox_alias(self, runtime_url: str) -> str:
        return f"{self._alias_prefix}rt_{runtime_hash(runtime_url)}"

    async def outbox(
        self, runtime_url: str, session_id: int, refresh: bool = False
    ) -> tuple[Intent, str]:
        intent = self._api.intent(self.virtual_user(runtime_url))
        room_id = await self._ensure(
            self.outbox_alias(runtime_url),
            intent,
            OUTBOX,
            session_id,
            refresh,
            name=f"reTHINK outbox {runtime_url}"[:200],
        )
        return intent, room_id

    async def journal(self, refresh: bool = False) -> tuple[Intent, str]:
        room_id = await self._ensure(
            f"{self._alias_prefix}journal",
            self._api.bot,
            JOURNAL,
            None,
            refresh,
            name="reTHINK message node journal",
        )
        return self._api.bot, room_id

    async def _ensure(
        self,
        localpart: str,
        intent: Intent,
        purpose: str,
        session_id: int | None,
        refresh: bool,
        name: str,
    ) -> str:
        if not refresh and (cached := self._rooms.get(localpart)) is not None:
            return cached
        lock = self._locks.setdefault(localpart, asyncio.Lock())
        async with lock:
            if not refresh and (cached := self._rooms.get(localpart)) is not None:
                return cached
            alias = self._api.alias(localpart)
            room_id = None if refresh else await self._store.by_alias(alias)
            if room_id is None:
                # create_room answers the existing room when the alias is taken (a previous
                # session of the same runtime, or a room map lost with its database); joining
                # is a no-op for a member and repairs a membership that was lost.
                room_id = await intent.create_room(alias_localpart=localpart, name=name)
                await intent.join(room_id)
                await self._store.add(room_id, alias, purpose, intent.user_id, session_id)
            self._rooms[localpart] = room_id
            return room_id

"""Reading a lane's room again after a start: what the previous run sent but had not settled.

A lane's recovery position is its last event whose deliveries were all settled (stored or
acknowledged, see settlement.py). Every lane event after it is read back from the room's history
and delivered again, in order, before the lane sends anything new. The senders' marks (restored
from the database, then advanced by what is read here) drop what had already been routed, so
messages are delivered again only to runtimes that might not have them; a stub speaking the
acknowledged protocol drops those it already has by their numbers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container
from typing import Any

import structlog

from appservice.api import MatrixError
from appservice.intent import Intent

from .. import carrier
from .lanes import Lane

log = structlog.get_logger(__name__)

PAGE = 100


class LaneRecovery:
    def __init__(
        self,
        bot: Intent,
        positions: dict[str, str],
        adopted: Container[str],
        save_position: Callable[[str, str], Awaitable[None]],
    ) -> None:
        self._bot = bot
        self._positions = positions
        self._adopted = adopted
        self._save_position = save_position
        self._filter = {"types": [carrier.BATCH_EVENT], "senders": [bot.user_id]}

    async def __call__(self, lane: Lane, room_id: str) -> int:
        """Deliver what the room holds after the lane's position; returns the room's last lane
        event number."""
        position = self._positions.get(room_id)
        if position is None and room_id in self._adopted:
            return await self._adopt(room_id)
        last_n = 0
        start: str | None = None
        if position is not None:
            found = await self._bot.context(room_id, position)
            if found is None:
                log.warning("lane position not in its room; reading it whole", room=room_id)
            else:
                start = found.get("end")
                last_n = _number(found.get("event", {}).get("content"))
        replayed = 0
        while True:
            page = await self._bot.messages(
                room_id, start=start, direction="f", limit=PAGE, event_filter=self._filter
            )
            chunk = page["chunk"]
            for event in chunk:
                last_n = max(last_n, _number(event.get("content")))
                if await self._replay(lane, event):
                    replayed += 1
            end = page.get("end")
            if not chunk or not isinstance(end, str) or end == start:
                break
            start = end
        if replayed:
            log.info("lane recovered", lane=lane.index, events=replayed, room=room_id)
        return last_n

    async def _adopt(self, room_id: str) -> int:
        """A room this database has no position in because it did not know the room: what it
        holds was sent for another database's sessions. Start after its last event, and store
        that before sending anything, so a crash from now on replays from there."""
        page = await self._bot.messages(room_id, direction="b", limit=1, event_filter=self._filter)
        for event in page["chunk"]:
            event_id = event.get("event_id")
            if isinstance(event_id, str):
                await self._save_position(room_id, event_id)
                return _number(event.get("content"))
        return 0

    async def _replay(self, lane: Lane, event: dict[str, Any]) -> bool:
        event_id = event.get("event_id")
        if not isinstance(event_id, str):
            return False
        try:
            routed = await carrier.decode_batch(event.get("content"), self._fetch, relayed=True)
        except carrier.CarrierError as exc:
            log.warning("unreadable lane event skipped", event_id=event_id, error=str(exc))
            return False
        await lane.deliver_recovered(routed, event_id)
        return True

    async def _fetch(self, uri: str) -> bytes:
        try:
            return await self._bot.download(uri)
        except MatrixError as exc:
            if exc.status == 404:
                raise carrier.CarrierError(f"media {uri} not found") from None
            raise


def _number(content: Any) -> int:
    n = content.get("n") if isinstance(content, dict) else None
    return n if isinstance(n, int) else 0

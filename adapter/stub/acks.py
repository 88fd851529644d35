"""Acknowledging stubs' numbered messages: cumulatively, a frame per stub at most every
``delay`` seconds, however many of its messages became durable meanwhile."""

from __future__ import annotations

import asyncio

from ..sessions.session import Session
from .protocol import ack_frame


class AckSender:
    def __init__(self, delay: float = 0.02) -> None:
        self._delay = delay
        self._due: set[Session] = set()
        self._task: asyncio.Task[None] | None = None

    def mark(self, session: Session) -> None:
        """``session``'s stub has more acknowledged than it was last told."""
        self._due.add(session)
        if self._task is None:
            self._task = asyncio.create_task(self._flush_later(), name="stub-acks")

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self._delay)
        finally:
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        due, self._due = self._due, set()
        for session in due:
            attachment = session.attachment
            if attachment is not None and attachment.upstream is not None:
                await attachment.link.send(ack_frame(attachment.upstream.acked))

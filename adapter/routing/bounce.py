"""What happens to a routed message the homeserver refused to carry for good: its sender is
answered with an error (a runtime waiting for an answer gets one instead of its own 408 after
15 s), the refusal is journalled, and the message counts as done (its stub stops resending it).
"""

from __future__ import annotations

import structlog

from appservice.api import MatrixError

from ..envelope import InvalidMessage, answer, parse
from ..sessions.mailbox import Parcel
from ..sessions.registry import SessionRegistry
from .journal import Journal
from .lanes import Outgoing

log = structlog.get_logger(__name__)


class Bounce:
    def __init__(self, sessions: SessionRegistry, journal: Journal) -> None:
        self._sessions = sessions
        self._journal = journal

    async def refused(self, item: Outgoing, refusal: MatrixError) -> None:
        try:
            await self._answer(item, refusal)
        finally:
            item.done()

    async def _answer(self, item: Outgoing, refusal: MatrixError) -> None:
        session = self._sessions.get(item.session_id)
        if session is None or session.released:
            return  # the node's own message, or a runtime that is gone: counted, logged
        try:
            message = parse(item.routed.text)
        except InvalidMessage:
            return
        if message.type == "response":
            return  # answering a response would start a loop of error answers
        code = refusal.status if refusal.status in (400, 413) else 502
        text = answer(
            message,
            code,
            desc=f"the homeserver refused to carry this message ({refusal.errcode}: "
            f"{refusal.message[:200]})",
        )
        await session.mailbox.deliver(Parcel(text))
        self._journal.rejected(session.runtime_url, item.routed.text, text)

"""What a session needs of the socket it is attached to (the stub endpoint provides it)."""

from __future__ import annotations

from typing import Protocol

# Close code telling a stub that a newer connection took its session over: it must not
# reconnect by itself, or the two connections would take the session from each other forever.
CLOSE_REPLACED = 4409


class Link(Protocol):
    """One stub connection as the sessions see it."""

    peer: str | None

    @property
    def open(self) -> bool: ...

    async def send(self, data: str | bytes) -> bool:
        """Queue one text frame; False when the socket is already gone."""

    async def close(self, code: int = 1000, reason: str = "") -> None: ...

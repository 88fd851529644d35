"""One line per runtime: the operations on a runtime's session (attach, detach, release,
expiry) run one after the other, whatever connections race (as Synapse's Linearizer does)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Serial:
    def __init__(self) -> None:
        # key -> (its lock, how many hold it or wait for it): gone when nobody does.
        self._lines: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        return len(self._lines)

    @contextlib.asynccontextmanager
    async def line(self, key: str) -> AsyncIterator[None]:
        entry = self._lines.get(key)
        if entry is None:
            entry = self._lines[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._lines[key]

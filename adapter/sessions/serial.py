"""One line per runtime: the operations on a runtime's session run one after the other, whatever
connections race (as Synapse's Linearizer does).

A line is a queue of turns, first come first served. A turn may stand in several lines at once
(a move of many sessions between node processes): it is placed in all of them in one step
(``reserve`` does not wait), and holds once it is first in every one. Because a turn only ever
waits for turns placed before it, no set of turns can wait for each other in a circle, however
many lines each stands in. That holds as long as whoever holds a turn does not wait, before
giving it up, for a turn placed later: an operation running in a line must not take a line
again (registry.py has the variants ``..._on_line`` for that), nor wait for something that does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterable


class Turn:
    """A place in one or more lines, from ``Serial.reserve`` until ``release``."""

    __slots__ = ("_held", "_serial", "keys", "released", "why")

    def __init__(self, serial: Serial, keys: tuple[str, ...], why: str) -> None:
        self._serial = serial
        self.keys = keys
        # What the turn is for: a later turn may wait for some (a move) only so long.
        self.why = why
        self._held = asyncio.Event()
        self.released = False

    @property
    def held(self) -> bool:
        return self._held.is_set()

    async def wait(self) -> None:
        """Until this turn is first in all its lines. Cancelled, the turn stays placed: the
        caller still releases it."""
        await self._held.wait()

    def release(self) -> None:
        """Leave every line (whether or not the turn came): the turns next in them may go on.
        Releasing twice does nothing."""
        if not self.released:
            self.released = True
            self._serial._leave(self)


class Serial:
    def __init__(self) -> None:
        # key -> the turns in its line, the holding one first: gone when nobody holds or waits.
        self._lines: dict[str, deque[Turn]] = {}

    def __len__(self) -> int:
        return len(self._lines)

    def reserve(self, keys: Iterable[str], why: str = "") -> Turn:
        """A turn in the lines of ``keys``, placed in all of them now (without waiting):
        whoever reserves after this waits for it."""
        turn = Turn(self, tuple(dict.fromkeys(keys)), why)
        for key in turn.keys:
            self._lines.setdefault(key, deque()).append(turn)
        self._wake(turn)
        return turn

    def ahead(self, key: str, why: str) -> bool:
        """Whether a turn for ``why`` holds or waits in ``key``'s line now."""
        return any(turn.why == why for turn in self._lines.get(key, ()))

    @contextlib.asynccontextmanager
    async def line(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s line for the body, after everyone who came before."""
        turn = self.reserve((key,))
        try:
            await turn.wait()
            yield
        finally:
            turn.release()

    def _leave(self, turn: Turn) -> None:
        fronts = []
        for key in turn.keys:
            line = self._lines[key]
            line.remove(turn)
            if line:
                fronts.append(line[0])
            else:
                del self._lines[key]
        for front in fronts:
            self._wake(front)

    def _wake(self, turn: Turn) -> None:
        if not turn.released and all(self._lines[key][0] is turn for key in turn.keys):
            turn._held.set()

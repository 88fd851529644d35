"""Retrying with exponential back-off: the one way the node waits between attempts.

Each loop keeps its own constants (first delay, cap, jitter, deadline) and says which errors
are worth another attempt; the growth of the delay, its cap, the jitter and the deadline are
written here once. Two shapes use it:

- ``retry(op, ...)`` runs an operation until it succeeds (the shape of "the homeserver may not
  be up yet"), sleeping between attempts;
- a ``Backoff`` kept by a long-running loop (a poll, a listener) that sleeps after a failed
  round and starts again from the first delay after a good one.

No library in the dependencies does this (tenacity and backoff are not among them), and the
helper is small enough that adding one would cost more than it saves."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


def _any_error(_exc: Exception) -> bool:
    return True


@dataclass
class Backoff:
    """The delay before the next attempt: ``initial`` at first, multiplied by ``factor`` after
    each wait up to ``cap``. With ``jitter`` a wait lasts a random time between half the delay
    and the delay, so that many loops failing together do not retry in step."""

    initial: float
    cap: float
    factor: float = 2.0
    jitter: bool = False
    delay: float = field(init=False)

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.cap < self.initial or self.factor < 1:
            raise ValueError("a back-off needs 0 < initial <= cap and factor >= 1")
        self.delay = self.initial

    def reset(self) -> None:
        """A round went well: the next failure waits the first delay again."""
        self.delay = self.initial

    def next_wait(self) -> float:
        """How long the coming wait lasts, and grow the delay for the one after it."""
        wait = random.uniform(self.delay / 2, self.delay) if self.jitter else self.delay
        self.delay = min(self.delay * self.factor, self.cap)
        return wait

    async def wait(self) -> float:
        """Sleep the coming wait (then the delay grows); returns how long it was."""
        wait = self.next_wait()
        await asyncio.sleep(wait)
        return wait


async def retry(
    op: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retry_on: Callable[[Exception], bool] = _any_error,
    deadline: float | None = None,
    on_retry: Callable[[Exception, float], None] | None = None,
) -> T:
    """Await ``op()`` until it returns, and return what it returned.

    An error for which ``retry_on`` is false is raised at once. ``deadline`` (the running
    loop's clock) bounds the attempts: when the wait before the next one would end after it,
    the last error is raised instead. ``on_retry(error, delay)`` is called before each wait,
    for the caller's log line. Cancellation is never retried (it is not an ``Exception``)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return await op()
        except Exception as exc:
            if not retry_on(exc):
                raise
            if deadline is not None and loop.time() + backoff.delay > deadline:
                raise
            if on_retry is not None:
                on_retry(exc, backoff.delay)
        await backoff.wait()

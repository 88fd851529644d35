"""Background tasks: the one way the node runs work beside what it is doing and keeps track
of it.

The event loop holds only a weak reference to a task, so a task nobody keeps may be collected
before it ends; an exception nobody reads is reported only when the task is collected, if ever;
and at shutdown every such task must be ended before what it uses is closed. ``BackgroundTasks``
does those three things once: it keeps each task until it ends, logs and counts a failure when
it happens, and cancels (or lets finish) and awaits all of them on ``stop``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")


class BackgroundTasks:
    """The tasks one component started and has not seen end. ``name`` says whose they are in
    the log; ``on_failure`` (a metric's ``inc``) counts the ones that ended in an exception."""

    def __init__(self, name: str, on_failure: Callable[[], None] | None = None) -> None:
        self._name = name
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()
        self.failures = 0

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task kept here until it ends."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self.failures += 1
        if self._on_failure is not None:
            self._on_failure()
        log.error("background task failed", tasks=self._name, task=task.get_name(), exc_info=exc)

    async def stop(self, cancel: bool = True) -> None:
        """Cancel every task (or, with ``cancel`` false, let each finish) and await them all.
        Their failures were logged when they ended: none is raised here."""
        tasks = list(self._tasks)
        if cancel:
            for task in tasks:
                task.cancel()
        # Cancelling the stopper cancels the tasks too (gather passes it on).
        await asyncio.gather(*tasks, return_exceptions=True)

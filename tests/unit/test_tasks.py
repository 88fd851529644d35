"""The one background-task helper (adapter/tasks.py): it keeps each task until it ends, counts
and logs a failure when it happens, and ends them all on stop."""

from __future__ import annotations

import asyncio

from adapter.tasks import BackgroundTasks


async def test_a_task_is_kept_until_it_ends() -> None:
    tasks = BackgroundTasks("test")
    release = asyncio.Event()
    task = tasks.spawn(release.wait(), name="waiting")
    assert len(tasks) == 1
    release.set()
    assert await task is True
    await asyncio.sleep(0)  # the done callback runs on the next turn of the loop
    assert len(tasks) == 0
    assert tasks.failures == 0


async def test_a_failure_is_counted_when_the_task_ends() -> None:
    counted: list[int] = []
    tasks = BackgroundTasks("test", lambda: counted.append(1))

    async def fails() -> None:
        raise RuntimeError("a bug")

    task = tasks.spawn(fails())
    await asyncio.wait({task})
    await asyncio.sleep(0)
    assert tasks.failures == 1
    assert counted == [1]
    assert len(tasks) == 0


async def test_stop_cancels_and_awaits_every_task_and_a_cancellation_is_no_failure() -> None:
    counted: list[int] = []
    tasks = BackgroundTasks("test", lambda: counted.append(1))
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    running = [tasks.spawn(forever()) for _ in range(3)]
    await started.wait()
    await tasks.stop()
    assert all(task.cancelled() for task in running)
    await asyncio.sleep(0)
    assert counted == []
    assert len(tasks) == 0


async def test_stop_without_cancelling_lets_each_task_finish() -> None:
    tasks = BackgroundTasks("test")
    finished: list[int] = []

    async def work(n: int) -> None:
        await asyncio.sleep(0)
        finished.append(n)

    for n in range(3):
        tasks.spawn(work(n))
    await tasks.stop(cancel=False)
    assert sorted(finished) == [0, 1, 2]

"""The one retry helper (adapter/retry.py): how its delay grows, when it gives up, what it
retries. Delays are a few milliseconds: the tests look at the sequence, never at the clock."""

from __future__ import annotations

import asyncio
import random

import pytest

from adapter.retry import Backoff, retry


def test_backoff_doubles_up_to_its_cap_and_starts_again_after_reset() -> None:
    backoff = Backoff(0.25, 2.0)
    assert [backoff.next_wait() for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    backoff.reset()
    assert backoff.next_wait() == 0.25


def test_backoff_with_jitter_waits_between_half_the_delay_and_the_delay() -> None:
    random.seed(44)
    backoff = Backoff(1.0, 8.0, jitter=True)
    for nominal in [1.0, 2.0, 4.0, 8.0, 8.0]:
        assert backoff.delay == nominal
        wait = backoff.next_wait()
        assert nominal / 2 <= wait <= nominal


@pytest.mark.parametrize(
    ("initial", "cap", "factor"), [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (1, 2, 0.5)]
)
def test_backoff_refuses_settings_that_would_not_back_off(
    initial: float, cap: float, factor: float
) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, cap, factor)


async def test_retry_returns_what_the_operation_returns_once_it_succeeds() -> None:
    calls: list[int] = []
    waits: list[float] = []

    async def op() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionError("away")
        return "done"

    got = await retry(op, Backoff(0.001, 0.002), on_retry=lambda _e, d: waits.append(d))
    assert got == "done"
    assert len(calls) == 4
    assert waits == [0.001, 0.002, 0.002]


async def test_retry_raises_at_once_what_its_predicate_does_not_retry() -> None:
    calls: list[int] = []

    async def op() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("away")
        raise ValueError("refused for its content")

    with pytest.raises(ValueError):
        await retry(
            op, Backoff(0.001, 0.001), retry_on=lambda exc: isinstance(exc, ConnectionError)
        )
    assert len(calls) == 2


async def test_retry_gives_up_with_the_last_error_when_the_next_wait_passes_the_deadline() -> None:
    calls: list[int] = []

    async def op() -> None:
        calls.append(1)
        raise ConnectionError(f"away {len(calls)}")

    deadline = asyncio.get_running_loop().time() + 0.5
    with pytest.raises(ConnectionError, match="away 1"):
        # The first wait (an hour) would end long after the deadline: no second attempt.
        await retry(op, Backoff(3600.0, 3600.0), deadline=deadline)
    assert len(calls) == 1


async def test_retry_is_cancelled_while_it_waits() -> None:
    started = asyncio.Event()

    async def op() -> None:
        started.set()
        raise ConnectionError("away")

    task = asyncio.create_task(retry(op, Backoff(3600.0, 3600.0)))
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

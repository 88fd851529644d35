"""How current the live dashboard is while a crowd runs: a companion of bench/crowd.py's cells.

Polls the node's `/dashboard/data.json` (loopback: no token) once a second from the start of the
crowd's warm-up to the end of its window. The figures' age at a poll is the poll's time minus
the newest message they include (`time_range.ts_max`): what an operator looking then would miss.
Reported: when the crowd's traffic first showed (and with its send -> delivery latency), the age
at every poll after that (p50 and max), and the worker's cycles as its status reported them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

POLL_SECONDS = 1.0


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 1)


async def watch(
    _stub_url: str, start_at: float, seconds: float, *, data_url: str
) -> dict[str, Any]:
    """A crowd companion (bench/crowd.py's `Companion`, with `data_url` bound)."""
    ages: list[float] = []
    first_shown: float | None = None
    latency_shown: float | None = None  # the crowd's traffic, with its delivery latency
    cycles: dict[int, dict[str, Any]] = {}
    failures = 0
    end = start_at + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while time.time() < end:
            polled = time.time()
            try:
                async with http.get(data_url) as response:
                    data = await response.json() if response.status == 200 else None
            except (aiohttp.ClientError, TimeoutError, ValueError):
                data = None
            if data is None:
                failures += 1
            else:
                newest = (data.get("time_range") or {}).get("ts_max")
                latency = data.get("latency_ms") or {}
                if newest is not None and newest >= start_at * 1000:
                    first_shown = first_shown or polled
                    if latency.get("p50") is not None and latency.get("p99") is not None:
                        latency_shown = latency_shown or polled
                if first_shown is not None and newest is not None:
                    ages.append(polled - newest / 1000)
                status = data.get("worker") or {}
                if status.get("finished_ms"):
                    cycles[status["finished_ms"]] = {
                        k: status.get(k)
                        for k in ("cycle_seconds", "increment_seconds", "rows_added", "state")
                    }
            await asyncio.sleep(max(0.0, polled + POLL_SECONDS - time.time()))

    def since_start(moment: float | None) -> float | None:
        return None if moment is None else round(moment - start_at, 1)

    return {
        "dashboard_first_shown_s": since_start(first_shown),
        "dashboard_latency_shown_s": since_start(latency_shown),
        "dashboard_age_p50_s": _pct(ages, 50),
        "dashboard_age_max_s": _pct(ages, 100),
        "dashboard_polls": len(ages),
        "dashboard_poll_failures": failures,
        "dashboard_cycles": [cycles[k] for k in sorted(cycles)],
    }

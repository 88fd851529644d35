"""The node's side of the dashboard's worker: start it, restart it when it dies, stop it.

The worker (adapter/ops/refresh.py) is a child process in a session of its own, so stopping
it also stops the JVM it started. Its stderr goes to `<state_dir>/worker.log`, not to the
node's log: Spark's start-up chatter would drown the node's own lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import Final

import structlog

from ..config import NodeConfig
from .layout import DashboardLayout

log = structlog.get_logger("rethink_mn.dashboard")

RESTART_DELAYS: Final = (1.0, 5.0, 30.0, 60.0)
START_DELAY_SECONDS: Final = 10.0
STOP_GRACE_SECONDS: Final = 10.0


class DashboardWorker:
    def __init__(self, config: NodeConfig, layout: DashboardLayout) -> None:
        self._config = config
        self._layout = layout
        self._process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0

    def start(self) -> None:
        self._layout.prepare()
        self._task = asyncio.create_task(self._supervise(), name="dashboard-worker")

    async def _spawn(self) -> asyncio.subprocess.Process:
        log_fd = await asyncio.to_thread(
            os.open, self._layout.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "adapter.ops.refresh",
                *("--parent", str(os.getpid())),
                stdin=asyncio.subprocess.PIPE,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
            )
        finally:
            os.close(log_fd)
        assert process.stdin is not None
        process.stdin.write(self._config.model_dump_json(by_alias=True).encode())
        await process.stdin.drain()
        process.stdin.close()
        return process

    async def _supervise(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        # A node that starts is met by its runtimes reconnecting all at once (200 of them within
        # about a second here); the worker's start (imports, then a JVM) waits that out instead
        # of competing with it, but not so long that the first figures come late.
        await asyncio.sleep(min(self._config.dashboard.refresh_seconds, START_DELAY_SECONDS))
        while True:
            self._process = await self._spawn()
            started = loop.time()
            log.info("dashboard worker started", pid=self._process.pid)
            code = await self._process.wait()
            # A worker that ran a good while and then died starts again quickly.
            failures = 1 if loop.time() - started > 300 else failures + 1
            self.restarts += 1
            delay = RESTART_DELAYS[min(failures, len(RESTART_DELAYS)) - 1]
            log.warning(
                "dashboard worker exited; restarting",
                exit_code=code,
                restart_in_seconds=delay,
                log=str(self._layout.log_file),
            )
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        process = self._process
        if process is None or process.returncode is not None:
            return
        self._signal(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_SECONDS)
        except TimeoutError:
            self._signal(process.pid, signal.SIGKILL)
            await process.wait()
        # The JVM and anything else the worker started live in its process group.
        self._signal(process.pid, signal.SIGKILL)

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

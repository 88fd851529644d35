"""Operations as a feature of the core: the live dashboard, and the worker process that keeps
its figures current from a tap on the appservice's transactions."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from appservice.server import TransactionHandler

from ..clients import ClientKeys
from ..core import Core
from .layout import DashboardLayout
from .live_dashboard import LiveDashboard
from .tap import EventTap, TappedTransactions
from .worker import DashboardWorker


class OpsFeature:
    def __init__(self) -> None:
        self.dashboard: LiveDashboard | None = None
        self.worker: DashboardWorker | None = None
        self.tap: EventTap | None = None

    def attach(self, core: Core) -> None:
        cfg = core.config
        layout = DashboardLayout(Path(cfg.dashboard.state_dir))
        self.dashboard = LiveDashboard(
            cfg.dashboard,
            cfg.domain,
            layout,
            lambda: core.stub_endpoint.open_connections,
            ClientKeys(cfg.stub.trusted_proxies),
        )
        if cfg.dashboard.worker:
            self.worker = DashboardWorker(cfg, layout)
            self.tap = EventTap(
                layout.spool_dir, core.metrics, keep_seconds=60 * cfg.dashboard.window_minutes
            )
            core.hooks.transactions.append(self._tapped)
        core.hooks.appservice_routes.append(self._add_routes)
        core.hooks.stopping.append(self._stopping)

    def _tapped(self, handler: TransactionHandler) -> TransactionHandler:
        assert self.tap is not None
        return TappedTransactions(handler, self.tap)

    def _add_routes(self, app: web.Application) -> None:
        assert self.dashboard is not None
        self.dashboard.add_routes(app)

    async def start(self) -> None:
        assert self.dashboard is not None
        self.dashboard.start()
        if self.worker is not None:
            self.worker.start()
        if self.tap is not None:
            self.tap.start()

    async def _stopping(self) -> None:
        """First of the stop: the dashboard and its worker, before the node stops reading."""
        assert self.dashboard is not None
        await self.dashboard.stop()
        if self.worker is not None:
            await self.worker.stop()

    async def stop(self) -> None:
        if self.tap is not None:
            await self.tap.stop()

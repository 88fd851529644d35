"""GET /dashboard and /dashboard/data.json on the appservice listener.

Who may look: a request from loopback (unless `dashboard.trust_loopback` is off), or one that
carries the operator token (`Authorization: Bearer <token>`, or `?token=` on the page, which the
page then sends as that header). Without a token configured the dashboard answers loopback only.
plotly.js and the drawing script carry no data and are served to anyone.

The figures come from the worker's newest published aggregates, reshaped once per new cycle (in a
thread: pyarrow reads and the figure building stay off the event loop). Runtimes connected are
the node's own: sampled every few seconds while it runs.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson
from aiohttp import web

from ..analytics.dashboard import SCRIPT, live_page, plotly_js_path
from ..analytics.panels import dashboard_data, runtimes_panel
from ..clients import ClientKeys
from ..config import DashboardConfig
from .layout import DashboardLayout

SAMPLE_SECONDS: Final = 5.0
PAGE_REFRESH_SECONDS: Final = 10.0
ASSET_HEADERS: Final = {"Cache-Control": "public, max-age=3600"}


class DashboardAccess:
    """Loopback, or the operator token. Behind a reverse proxy on loopback the client is the one
    the proxy names (``clients``: the operator's trusted proxies), so a request through the
    proxy needs the token like any other remote one."""

    def __init__(self, settings: DashboardConfig, clients: ClientKeys) -> None:
        self._token = settings.token.encode() if settings.token else None
        self._trust_loopback = settings.trust_loopback
        self._clients = clients

    def check(self, request: web.Request) -> None:
        """Raise 401/403 unless the request may see the dashboard's figures."""
        if self._trust_loopback and self._clients.on_loopback(request.remote, request.headers):
            return
        if self._token is None:
            raise web.HTTPForbidden(
                text="the dashboard answers loopback only: set dashboard.token for remote access"
            )
        supplied = _bearer(request) or request.query.get("token")
        if supplied is None or not hmac.compare_digest(supplied.encode(), self._token):
            raise web.HTTPUnauthorized(
                text="an operator token is needed (Authorization: Bearer <dashboard.token>)",
                headers={"WWW-Authenticate": 'Bearer realm="rethink-mn dashboard"'},
            )


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


class LiveDashboard:
    def __init__(
        self,
        settings: DashboardConfig,
        domain: str,
        layout: DashboardLayout,
        connected_runtimes: Callable[[], int],
        clients: ClientKeys,
    ) -> None:
        self._settings = settings
        self._domain = domain
        self._layout = layout
        self._access = DashboardAccess(settings, clients)
        self._connected = connected_runtimes
        self._samples: deque[tuple[int, int]] = deque(
            maxlen=int(settings.window_minutes * 60 / SAMPLE_SECONDS)
        )
        self._figures: tuple[Path | None, dict[str, Any]] | None = None
        self._building = asyncio.Lock()
        self._sampler: asyncio.Task[None] | None = None
        self._page = live_page(domain, PAGE_REFRESH_SECONDS)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/dashboard", self.page)
        app.router.add_get("/dashboard/", self.redirect)
        app.router.add_get("/dashboard/data.json", self.data)
        app.router.add_get("/dashboard/plotly.min.js", self.plotly)
        app.router.add_get("/dashboard/dashboard.js", self.script)

    def start(self) -> None:
        self._sampler = asyncio.create_task(self._sample(), name="dashboard-sampler")

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None

    async def _sample(self) -> None:
        while True:
            self._samples.append((int(time.time() * 1000), self._connected()))
            await asyncio.sleep(SAMPLE_SECONDS)

    async def page(self, request: web.Request) -> web.Response:
        self._access.check(request)
        return web.Response(
            text=self._page, content_type="text/html", headers={"Cache-Control": "no-store"}
        )

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently(
            "/dashboard" + (f"?{request.query_string}" if request.query_string else "")
        )

    async def plotly(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(
            plotly_js_path(), headers={"Content-Type": "text/javascript", **ASSET_HEADERS}
        )

    async def script(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(
            SCRIPT, headers={"Content-Type": "text/javascript", "Cache-Control": "no-cache"}
        )

    async def data(self, request: web.Request) -> web.Response:
        self._access.check(request)
        figures = await self._current_figures()
        body = {
            **figures,
            "domain": self._domain,
            "worker": self._layout.read_status(),
            "runtimes_connected": self._connected(),
            "panels": [runtimes_panel(list(self._samples)), *figures["panels"]],
        }
        return web.Response(
            body=orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def _current_figures(self) -> dict[str, Any]:
        """The figures of the newest published cycle, built once per cycle."""
        published = self._layout.published()
        async with self._building:
            if self._figures is not None and self._figures[0] == published:
                return self._figures[1]
            if published is None:
                figures = await asyncio.to_thread(
                    dashboard_data, self._layout.aggregates_dir / "none", self._domain
                )
                figures["notes"] = ["waiting for the dashboard worker's first analysis"]
            else:
                figures = await asyncio.to_thread(dashboard_data, published, self._domain)
            self._figures = (published, figures)
            return figures

"""The core's two HTTP listeners: the appservice's (the homeserver's transactions, health, the
features' routes, the policy API) and the stubs' (runtimes' WebSockets and the stub's pages)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from appservice.server import AppserviceServer, TransactionHandler

from ..namespace import NamespaceQueries
from ..observability import HealthEndpoints
from ..policies.api import PolicyApi
from ..stub_files import StubFiles
from ..web_endpoints import WebPages
from ..web_hosts import KnownHosts, url_host
from .upkeep import probe_database, probe_homeserver

if TYPE_CHECKING:
    from .core import Core

log = structlog.get_logger(__name__)

# Pending connections the kernel queues per listener (capped by net.core.somaxconn).
LISTEN_BACKLOG = 4096


class Listeners:
    def __init__(self, reuse_port: bool) -> None:
        # A domain's processes on one machine share the ports: the kernel spreads connections.
        self._reuse_port = reuse_port
        self._runners: list[web.AppRunner] = []

    async def listen(self, app: web.Application, host: str, port: int) -> int:
        """Serve ``app``; the bound port, which differs from ``port`` when that was 0."""
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        # A crowd of runtimes connects at once (a node restart, a page of hundreds of stubs):
        # a short listen queue drops connections, which then wait for TCP's retry (1 s, 3 s).
        site = web.TCPSite(
            runner,
            host,
            port,
            reuse_address=True,
            reuse_port=self._reuse_port,
            backlog=LISTEN_BACKLOG,
        )
        await site.start()
        self._runners.append(runner)
        return int(runner.addresses[-1][1])

    async def shutdown(self) -> None:
        """Accept nothing more and close the open connections."""
        for runner in reversed(self._runners):
            await runner.shutdown()

    async def cleanup(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()


def appservice_app(core: Core) -> web.Application:
    cfg = core.config
    as_hosts = KnownHosts(
        [*cfg.appservice.public_hosts, url_host(cfg.appservice.url)],
        "appservice.public_hosts",
    )
    app = web.Application(
        client_max_size=cfg.appservice.max_body_bytes, middlewares=[as_hosts.middleware]
    )
    queries = NamespaceQueries(core.api, core.session_rows, cfg.appservice.user_prefix)
    handler: TransactionHandler = core.inbound
    for wrap in core.hooks.transactions:
        handler = wrap(handler)
    AppserviceServer(
        cfg.appservice.hs_token, handler, core.transactions, queries, core.as_metrics
    ).add_routes(app)
    HealthEndpoints(
        {"homeserver": partial(probe_homeserver, core), "database": partial(probe_database, core)},
        core.metrics,
    ).add_routes(app)
    for add_routes in core.hooks.appservice_routes:
        add_routes(app)
    if cfg.policy_api.token is not None:
        app.add_routes(
            PolicyApi(
                core.rule_store, cfg.policy_api.token, partial(_policy_changed, core)
            ).routes()
        )
    return app


def stub_app(core: Core) -> web.Application:
    cfg = core.config
    app = web.Application(
        middlewares=[KnownHosts(cfg.stub.known_hosts, "stub.public_hosts").middleware]
    )
    WebPages(cfg.domain, StubFiles(), cfg.stub.public_url).add_routes(app)
    core.stub_endpoint.add_routes(app)
    return app


async def _policy_changed(core: Core, action: str, rule_id: str | None, rule: Any) -> None:
    core.journal.policy(action, rule_id, rule)
    log.info("policy changed", action=action, rule=rule_id)

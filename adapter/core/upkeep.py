"""The core's background work while it runs: telling the homeserver it is up, pruning what
the database no longer needs, and expiring sessions; and the health probes."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import text

from ..retry import Backoff, retry
from ..storage.clock import utcnow

if TYPE_CHECKING:
    from .core import Core

log = structlog.get_logger(__name__)

TRANSACTION_RETENTION = timedelta(days=7)
MAINTENANCE_INTERVAL = 3600.0
KEPT_PAYLOAD_GRACE = timedelta(minutes=10)
EXPIRY_INTERVAL = 60.0


async def ping_homeserver(core: Core) -> None:
    """Tell the homeserver we are up: it then retries its queued transactions at once
    instead of waiting out its back-off (up to minutes after an outage of the node)."""
    duration = await retry(  # kept trying; /health shows the state meanwhile
        lambda: core.api.ping(core.config.appservice.id),
        Backoff(1.0, 60.0),
        on_retry=lambda exc, delay: log.warning(
            "homeserver ping failed; retrying", error=str(exc), retry_in=delay
        ),
    )
    log.info("homeserver ping answered", round_trip_ms=duration)


async def maintenance(core: Core) -> None:
    keep_marks = max(
        TRANSACTION_RETENTION, timedelta(seconds=2 * core.config.stub.session_ttl_seconds)
    )
    while True:
        try:
            pruned = await core.transactions.prune(TRANSACTION_RETENTION)
            forgotten = await core.checkpoints.prune_marks(keep_marks)
            named = timedelta(seconds=core.config.registry.builtin.names_released_for_seconds)
            released = await core.routes.forget_released(utcnow() - named)
            # Shared texts of kept deliveries nobody waits for any more; one written in
            # the last minutes may belong to a checkpoint still being committed.
            swept = await core.pending.sweep(utcnow() - KEPT_PAYLOAD_GRACE)
            if pruned or forgotten or released or swept:
                log.info(
                    "pruned",
                    transactions=pruned,
                    sender_marks=forgotten,
                    released_addresses=released,
                    kept_payloads=swept,
                )
        except Exception:
            log.exception("maintenance failed")
        await asyncio.sleep(MAINTENANCE_INTERVAL)


async def expire_sessions(core: Core) -> None:
    while True:
        await asyncio.sleep(EXPIRY_INTERVAL)
        try:
            await core.sessions.expire()
        except Exception:
            log.exception("session expiry failed")


async def probe_homeserver(core: Core) -> dict[str, Any]:
    versions = await core.api.versions()
    return {"url": core.config.homeserver.url, "versions": versions.get("versions", [])[-3:]}


async def probe_database(core: Core) -> dict[str, Any]:
    await core.db.run(lambda conn: conn.execute(text("SELECT 1")))
    return {"backend": core.db.dialect}

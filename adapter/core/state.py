"""What the core reads back at a start: sessions (all detached), the routing table and the
senders' marks as the database left them."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from ..access import Refusal

if TYPE_CHECKING:
    from .core import Core

log = structlog.get_logger(__name__)


async def load_state(core: Core) -> None:
    """Every start is counted: its number is the high part of the numbers the node hands out,
    so they never repeat across restarts."""
    if core.config.stub.session_secret is None:
        # Tokens must outlive a restart: a protected session is resumed only with one.
        core.tokens.secret = await core.secrets.get_or_create(
            "session-tokens", lambda: secrets.token_urlsafe(32)
        )
    # Addresses of numbered requests are named by it: the same across restarts.
    core.allocation.secret = bytes.fromhex(
        await core.secrets.get_or_create("allocation-names", lambda: secrets.token_hex(32))
    )
    epoch = await core.checkpoints.next_start()
    core.publisher.begin(epoch)
    marks = await core.checkpoints.marks()
    core.sender_marks.restore(marks)
    for loaded in core.hooks.marks_loaded:
        loaded(epoch, marks)
    await core.rule_store.load()
    await core.sessions.load(epoch, await core.pending.stored())
    core.restore_local_origins(marks)
    for step in core.hooks.sessions_loaded:
        await step()
    await load_routes(core, lambda _session_id: True)
    # Read back: held already, so counted whatever the bounds.
    core.subscription_service.restore()
    core.allocation.restore()
    for session_id in core.table.sessions():
        core.ingress.learned.force(session_id, core.table.holdings(session_id).learned)
    for address, domain, runtime in await core.remote_subscriptions.all():
        core.table.subscribe_domain(domain, runtime, [address])


async def load_routes(core: Core, include: Callable[[int], bool]) -> None:
    """The routes of the sessions ``include`` admits, as the database has them: every
    session's, the other processes' too (their runtimes are addresses here)."""
    table = core.table
    if core.config.cluster.enabled:
        for session_id, runtime_url in await core.session_rows.runtimes():
            if include(session_id) and core.sessions.get(session_id) is None:
                table.add_runtime(session_id, runtime_url)
    by_key: dict[tuple[int, str | None], list[str]] = {}
    for row in await core.routes.allocations():
        if include(row.session_id):
            by_key.setdefault((row.session_id, row.allocation_key), []).append(row.address)
    for (session_id, key), addresses in by_key.items():
        table.add_allocations(session_id, addresses, key)
    # What an older node stored under looser rules is left out: the monitor judges each
    # of this process's sessions' subscriptions and learned routes again.
    dropped = 0
    for address, session_id in await core.routes.subscriptions():
        session = core.sessions.get(session_id)
        if not include(session_id):
            continue
        if session is not None and core.monitor.subscribe_to(session, address) is not None:
            dropped += 1
            continue
        table.subscribe(session_id, [address])
    for address, session_id in await core.routes.learned():
        session = core.sessions.get(session_id)
        if not include(session_id):
            continue
        if session is not None and isinstance(core.monitor.speak_from(session, address), Refusal):
            dropped += 1
            continue
        table.learn(session_id, address)
    if dropped:
        log.warning("routes the ownership rules refuse were not loaded", routes=dropped)

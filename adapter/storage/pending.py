"""Deliveries a runtime has not confirmed, kept in the database in delivery-number order.

A message kept for several runtimes at once (a publication to a stream whose subscribers are
away) is stored once, in ``kept_payloads`` under its SHA-256, and each runtime's row refers to
it: fifty detached subscribers of a 200 kB publication cost 200 kB, not 10 MB. The node's
maintenance sweeps the ones no row refers to any more (``sweep_payloads``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, bindparam, delete, exists, func, select

from .clock import utcnow
from .database import Database, upsert
from .models import KeptPayload, PendingDelivery, RuntimeSession

_P = PendingDelivery
_K = KeptPayload
_COLUMNS = (
    "session_id",
    "dseq",
    "payload",
    "payload_digest",
    "origin",
    "oseq",
    "event_id",
    "created_at",
)
# Only for a session that still exists: a runtime's session can be released (its row deleted)
# between a delivery being kept in memory and the write, and one such row would otherwise
# fail the whole write (a checkpoint carries every session's deliveries, lane positions and
# marks). The existence check and the insert are one statement: a release committed first is
# seen; one committing after waits on the foreign key's lock and then removes the rows with
# the session. A row already there (the same checkpoint, retried after a commit whose outcome
# was unknown) is left as it is.
_STILL_THERE = select(*(bindparam(c, type_=_P.__table__.c[c].type) for c in _COLUMNS)).where(
    exists().where(RuntimeSession.id == bindparam("session_id"))
)
_APPEND = {
    dialect: upsert(dialect, _P, ["session_id", "dseq"], source=(_COLUMNS, _STILL_THERE))
    for dialect in ("sqlite", "postgresql")
}
_REMOVE_THROUGH = delete(_P).where(
    _P.session_id == bindparam("sid"), _P.dseq <= bindparam("through")
)
# A shared payload written again is touched: the sweep leaves alone what a write may still
# be referring to.
_KEEP_PAYLOAD = {
    dialect: upsert(dialect, _K, ["digest"], ["touched_at"]) for dialect in ("sqlite", "postgresql")
}
# A row's text, wherever it is kept.
_TEXT = func.coalesce(_P.payload, _K.payload)


class StoredDelivery(Protocol):
    """One delivery kept for a session, as read back (``PendingStore.after``). Declared once,
    here: the sessions (sessions/mailbox.py) sit above storage and use this declaration."""

    @property
    def dseq(self) -> int: ...

    @property
    def text(self) -> str: ...

    @property
    def origin(self) -> str | None: ...

    @property
    def oseq(self) -> int: ...


class KeptDelivery(StoredDelivery, Protocol):
    """One delivery to keep (sessions/mailbox.py's Entry): what is read back, and what its
    row and shared payload need besides."""

    @property
    def event_id(self) -> str | None: ...

    @property
    def digest(self) -> str | None:
        """Set when its text is kept once for several sessions (``kept_payloads``)."""


class StoredRow:
    __slots__ = ("dseq", "origin", "oseq", "text")

    def __init__(self, dseq: int, text: str, origin: str | None, oseq: int) -> None:
        self.dseq = dseq
        self.text = text
        self.origin = origin
        self.oseq = oseq


def kept_rows(
    batches: Iterable[tuple[int, Sequence[KeptDelivery]]], now: datetime
) -> list[dict[str, Any]]:
    return [
        {
            "session_id": session_id,
            "dseq": e.dseq,
            "payload": None if digest is not None else e.text,
            "payload_digest": digest,
            "origin": e.origin,
            "oseq": e.oseq,
            "event_id": e.event_id,
            "created_at": now,
        }
        for session_id, entries in batches
        for e in entries
        for digest in (e.digest,)
    ]


def kept_payloads(
    batches: Iterable[tuple[int, Sequence[KeptDelivery]]], now: datetime
) -> list[dict[str, Any]]:
    """The shared texts the rows of ``batches`` refer to, once each."""
    found: dict[str, str] = {}
    for _session_id, entries in batches:
        for e in entries:
            digest = e.digest
            if digest is not None and digest not in found:
                found[digest] = e.text
    return [{"digest": d, "payload": text, "touched_at": now} for d, text in found.items()]


def write_kept(
    conn: Connection, rows: list[dict[str, Any]], payloads: Sequence[dict[str, Any]] = ()
) -> None:
    if payloads:
        statement = _KEEP_PAYLOAD[conn.dialect.name]
        conn.execute(statement, payloads[0] if len(payloads) == 1 else list(payloads))
    if rows:
        conn.execute(_APPEND[conn.dialect.name], rows[0] if len(rows) == 1 else rows)


def delete_through(conn: Connection, deletes: Sequence[tuple[int, int]]) -> None:
    if deletes:
        params = [{"sid": sid, "through": through} for sid, through in deletes]
        conn.execute(_REMOVE_THROUGH, params[0] if len(params) == 1 else params)


def sweep_payloads(conn: Connection, untouched_since: datetime) -> int:
    """Delete the shared texts no row refers to and nobody wrote since ``untouched_since``."""
    result = conn.execute(
        delete(_K).where(
            _K.touched_at < bindparam("cutoff"),
            ~exists().where(_P.payload_digest == _K.digest),
        ),
        {"cutoff": untouched_since},
    )
    return int(result.rowcount or 0)


class PendingStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def append(self, session_id: int, entries: Sequence[KeptDelivery]) -> None:
        now = utcnow()
        rows = kept_rows([(session_id, entries)], now)
        payloads = kept_payloads([(session_id, entries)], now)
        if rows:
            await self._db.run(lambda conn: write_kept(conn, rows, payloads))

    async def after(self, session_id: int, dseq: int, limit: int) -> list[StoredRow]:
        def op(conn: Connection) -> list[StoredRow]:
            rows = conn.execute(
                select(_P.dseq, _TEXT, _P.origin, _P.oseq)
                .select_from(_P)
                .outerjoin(_K, _K.digest == _P.payload_digest)
                .where(_P.session_id == session_id, _P.dseq > dseq)
                .order_by(_P.dseq)
                .limit(limit)
            )
            return [StoredRow(int(d), str(p), o, int(s)) for d, p, o, s in rows]

        return await self._db.run(op)

    async def remove_through(self, session_id: int, dseq: int) -> None:
        await self._db.run(lambda conn: delete_through(conn, [(session_id, dseq)]))

    async def count(self, session_id: int) -> int:
        def op(conn: Connection) -> int:
            return int(
                conn.execute(
                    select(func.count()).select_from(_P).where(_P.session_id == session_id)
                ).scalar_one()
            )

        return await self._db.run(op)

    async def stored(self) -> dict[int, tuple[int, int]]:
        """Each session's highest kept delivery number and the size of what is kept."""

        def op(conn: Connection) -> dict[int, tuple[int, int]]:
            rows = conn.execute(
                select(_P.session_id, func.max(_P.dseq), func.sum(func.length(_TEXT)))
                .select_from(_P)
                .outerjoin(_K, _K.digest == _P.payload_digest)
                .group_by(_P.session_id)
            )
            return {int(sid): (int(top), int(size or 0)) for sid, top, size in rows}

        return await self._db.run(op)

    async def sweep(self, untouched_since: datetime) -> int:
        """Forget shared texts no kept delivery refers to any more (see ``sweep_payloads``)."""
        return await self._db.run(lambda conn: sweep_payloads(conn, untouched_since))

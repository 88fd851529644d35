"""Runtime sessions: one row per runtimeURL the node knows.

A session is written when its runtime connects, reconnects or drops: a crowd arriving writes a
thousand at once, so these are prepared statements on ``Database.execute_small`` (inline on
SQLite, the event loop's connections with group commit on PostgreSQL)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    literal,
    select,
    true,
    update,
)

from .clock import utcnow
from .database import Database, Prepared, upsert
from .models import Allocation, NodeProcess, RuntimeClaim, RuntimeSession, SessionState
from .routes import keep_released

_S = RuntimeSession
_C = RuntimeClaim
_ROW_COLUMNS = (
    _S.id,
    _S.runtime_url,
    _S.user_id,
    _S.key,
    _S.state,
    _S.last_seen,
    _S.protected,
    _S.identity,
    _S.claim,
    _S.client,
    _S.used,
)


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: int
    runtime_url: str
    user_id: str
    key: str
    state: SessionState
    last_seen: datetime
    protected: bool
    identity: str | None
    claim: str
    client: str = ""
    used: bool = True


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """A runtimeURL kept for the credential of a session that ended (models.RuntimeClaim)."""

    runtime_url: str
    claim: str
    session_id: int
    protected: bool
    identity: str | None


class HeldElsewhere(Exception):
    """The runtime's session is held by another node process of the domain."""

    def __init__(self, holder: str | None) -> None:
        super().__init__(f"held by node process {holder}")
        self.holder = holder


class SessionStore:
    """``holder``: the node process this store works for, when the domain runs several; it
    creates sessions as theirs and reads only those."""

    def __init__(self, db: Database, holder: str | None = None) -> None:
        self._db = db
        self._holder = holder
        mapped = inspect(_S).columns
        keys = (
            "runtime_url",
            "user_id",
            "key",
            "protected",
            "identity",
            "state",
            "created_at",
            "last_seen",
            "holder",
            "claim",
            "client",
            "used",
        )
        created = [mapped[c] for c in keys]
        # Nothing is returned when another process created the runtime's session first.
        self._create = Prepared(
            db,
            upsert(db.dialect, _S, ["runtime_url"])
            .values({c.key: bindparam(c.key) for c in created})
            .returning(_S.id),
            created,
        )
        self._set_state = Prepared(
            db,
            update(_S)
            .where(_S.id == bindparam("session_id"))
            .values(
                state=bindparam("state"), last_seen=bindparam("last_seen"), used=bindparam("used")
            ),
            [mapped["state"], mapped["last_seen"], mapped["used"]],
        )
        self._delete = Prepared(db, delete(_S).where(_S.id == bindparam("session_id")), [])
        self._claim_of = Prepared(
            db,
            select(_C.runtime_url, _C.claim, _C.session_id, _C.protected, _C.identity).where(
                _C.runtime_url == bindparam("runtime_url")
            ),
            [],
        )
        self._set_state_protected = Prepared(
            db,
            update(_S)
            .where(_S.id == bindparam("session_id"))
            .values(
                state=bindparam("state"),
                last_seen=bindparam("last_seen"),
                used=bindparam("used"),
                protected=true(),
            ),
            [mapped["state"], mapped["last_seen"], mapped["used"]],
        )

    async def has_user(self, user_id: str) -> bool:
        def op(conn: Connection) -> bool:
            return conn.execute(select(_S.id).where(_S.user_id == user_id)).first() is not None

        return await self._db.run(op)

    async def create(
        self,
        runtime_url: str,
        user_id: str,
        key: str,
        protected: bool,
        identity: str | None,
        claim: str | None = None,
        kept: ClaimRow | None = None,
        client: str = "",
    ) -> int:
        """A new session of ``runtime_url`` under ``claim`` (default: a claim of its own, its
        key). ``kept``: the claim the runtimeURL was kept for, which the new session takes up
        (or which lapsed): it is struck."""
        now = utcnow()
        row = {
            "runtime_url": runtime_url,
            "user_id": user_id,
            "key": key,
            "protected": protected,
            "identity": identity,
            "state": SessionState.CONNECTED,
            "created_at": now,
            "last_seen": now,
            "holder": self._holder,
            "claim": claim or key,
            "client": client,
            "used": False,
        }
        created = await self._db.execute_small(self._create, row)
        if not created:
            raise HeldElsewhere(await self.holder_of(runtime_url))
        [(session_id,)] = created
        if kept is not None:
            await self._db.run(
                lambda conn: conn.execute(delete(_C).where(_C.runtime_url == runtime_url))
            )
        return int(session_id)

    async def claim_of(self, runtime_url: str) -> ClaimRow | None:
        """The claim a runtimeURL with no session is kept for, if any."""
        found = await self._db.execute_small(self._claim_of, {"runtime_url": runtime_url})
        if not found:
            return None
        [(url, claim, session_id, protected, identity)] = found
        return ClaimRow(str(url), str(claim), int(session_id), bool(protected), identity)

    async def release(self, session_id: int, kept: ClaimRow | None) -> None:
        """Forget the session and, by cascade, everything it owned; what it was allocated is
        kept as released (routes.py ``released``). With ``kept``, its runtimeURL stays the
        credential's, in the same transaction."""
        released_at = utcnow()

        def op(conn: Connection) -> None:
            keep_released(
                conn,
                select(Allocation.address, literal(released_at)).where(
                    Allocation.session_id == session_id
                ),
            )
            conn.execute(delete(_S).where(_S.id == session_id))
            if kept is None:
                return
            conn.execute(delete(_C).where(_C.runtime_url == kept.runtime_url))
            conn.execute(
                insert(_C).values(
                    runtime_url=kept.runtime_url,
                    claim=kept.claim,
                    session_id=kept.session_id,
                    protected=kept.protected,
                    identity=kept.identity,
                    released_at=released_at,
                )
            )

        await self._db.run(op)

    async def held(self, runtime_url: str) -> tuple[str, SessionRow] | None:
        """The runtime's session and the process holding it ("" when nobody holds it); None
        when it has none."""

        def op(conn: Connection) -> tuple[str, SessionRow] | None:
            found = conn.execute(
                select(*_ROW_COLUMNS, _S.holder).where(_S.runtime_url == runtime_url)
            ).first()
            if found is None:
                return None
            fields = found._asdict()
            return fields.pop("holder") or "", SessionRow(**fields)

        return await self._db.run(op)

    async def holder_of(self, runtime_url: str) -> str | None:
        """The process holding the runtime's session: None when it has none, "" when nobody
        holds it."""
        found = await self.held(runtime_url)
        return None if found is None else found[0]

    def _held_here(self) -> ColumnElement[bool]:
        return _S.holder.is_(None) if self._holder is None else _S.holder == self._holder

    async def set_state(
        self, session_id: int, state: SessionState, protect: bool = False, used: bool = True
    ) -> None:
        """``protect``: the session is being handed a token (it stays protected). ``used``:
        whether its runtime used it yet."""
        row = {"session_id": session_id, "state": state, "last_seen": utcnow(), "used": used}
        statement = self._set_state_protected if protect else self._set_state
        await self._db.execute_small(statement, row)

    async def delete(self, session_id: int) -> None:
        """Forget the session and, by cascade, everything it owned. On a `disconnect`'s path
        (its answer waits for this), so one statement on the hot path, as ``create``."""
        await self._db.execute_small(self._delete, {"session_id": session_id})

    async def all(self) -> list[SessionRow]:
        def op(conn: Connection) -> list[SessionRow]:
            rows = conn.execute(select(*_ROW_COLUMNS).where(self._held_here()))
            return [SessionRow(*row) for row in rows]

        return await self._db.run(op)

    async def take_over(self, gone: str, handover: str) -> list[tuple[SessionRow, str]]:
        """Hold every session node process ``gone`` held ("": sessions nobody holds, left by
        the domain's single process of before), and strike it from the domain's processes (if
        it is only slow, its next heartbeat finds its row gone and it stops: two processes
        never hold one session). Nothing when another process was first.

        Each row comes with where its deliveries are to be read again from: ``handover``
        (the gone process's positions), or the handover the gone process was given for it and
        had not finished with (it died before what it read again for it was settled). It stays
        in the row until this process has settled what it reads again (``taken``), so that a
        process taking over from this one, should it die first, reads from there too."""
        assert self._holder is not None
        held_by_gone = _S.holder.is_(None) if gone == "" else _S.holder == gone

        def op(conn: Connection) -> list[tuple[SessionRow, str]]:
            if gone:
                struck = conn.execute(delete(NodeProcess).where(NodeProcess.name == gone))
                if not struck.rowcount:
                    return []
            rows = conn.execute(
                update(_S)
                .where(held_by_gone)
                .values(
                    holder=self._holder,
                    state=SessionState.DETACHED,
                    handover=func.coalesce(_S.handover, handover),
                )
                .returning(*_ROW_COLUMNS, _S.handover)
            )
            found = []
            for row in rows:
                fields = row._asdict()
                given = str(fields.pop("handover"))
                found.append((SessionRow(**fields), given))
            return found

        return await self._db.run(op)

    async def hand_over(self, session_id: int, to: str, handover: str) -> bool:
        """Make ``to`` the holder of a session this process holds, with what it needs to take
        it (``handover``, JSON). False if this process did not hold it."""

        def op(conn: Connection) -> bool:
            result = conn.execute(
                update(_S)
                .where(_S.id == session_id, _S.holder == self._holder)
                .values(holder=to, handover=handover, state=SessionState.DETACHED)
            )
            return bool(result.rowcount)

        return await self._db.run(op)

    async def handed_here(self, runtime_url: str) -> tuple[SessionRow, str] | None:
        """The runtime's session if another process handed it to this one and it is not taken
        yet: its row and the handover."""

        def op(conn: Connection) -> tuple[SessionRow, str] | None:
            found = conn.execute(
                select(*_ROW_COLUMNS, _S.handover).where(
                    _S.runtime_url == runtime_url,
                    _S.holder == self._holder,
                    _S.handover.is_not(None),
                )
            ).first()
            if found is None:
                return None
            fields = found._asdict()
            handover = fields.pop("handover")
            return SessionRow(**fields), str(handover)

        return await self._db.run(op)

    async def unfinished(self) -> list[tuple[int, str]]:
        """(id, handover) of the sessions this process holds whose handover it had not
        finished with when it last stopped."""
        assert self._holder is not None

        def op(conn: Connection) -> list[tuple[int, str]]:
            found = conn.execute(
                select(_S.id, _S.handover).where(
                    _S.holder == self._holder, _S.handover.is_not(None)
                )
            )
            return [(int(i), str(h)) for i, h in found]

        return await self._db.run(op)

    async def taken(self, handovers: dict[int, str]) -> None:
        """What this process read again for each session from its handover is settled (the
        runtime has it or it is stored): the handover is done with. Not where the session was
        handed on meanwhile (its row then holds the next handover)."""
        groups: dict[str, list[int]] = {}
        for session_id, handover in handovers.items():
            groups.setdefault(handover, []).append(session_id)

        def op(conn: Connection) -> None:
            for handover, ids in groups.items():
                conn.execute(
                    update(_S)
                    .where(_S.id.in_(ids), _S.holder == self._holder, _S.handover == handover)
                    .values(handover=None)
                )

        if groups:
            await self._db.run(op)

    async def runtimes(self) -> list[tuple[int, str]]:
        """(id, runtimeURL) of every session of the domain, whoever holds it."""

        def op(conn: Connection) -> list[tuple[int, str]]:
            return [(int(i), str(u)) for i, u in conn.execute(select(_S.id, _S.runtime_url))]

        return await self._db.run(op)

    async def detach_all(self) -> None:
        """At start-up no stub is connected, whatever the rows say after a crash."""

        def op(conn: Connection) -> None:
            conn.execute(
                update(_S)
                .where(_S.state == SessionState.CONNECTED, self._held_here())
                .values(state=SessionState.DETACHED)
            )

        await self._db.run(op)

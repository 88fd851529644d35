"""The built-in domain registry's storage: each operation is one transaction that returns what
it found and the status changes it made, for the caller to publish once they are committed.

Expiry is applied in two places that agree: reads compute it (an entry past ``expires_at`` is
answered ``disconnected``, and one disconnected for longer than the grace period is not answered
at all) without writing, and writes first record it on the rows they touch, so every change of
the stored status, and only such a change, is reported. ``sweep`` records it for the rest.

An absent registration counts as disconnected: creating one with any other status is a change,
removing a disconnected one is not.

Ownership (docs/registry-connector.md, "Who may change an entry") is decided inside the same
transaction as the write it guards, on the locked row: a write by a runtime (``requester``) to
an entry another runtime owns changes nothing and says so (``Registered.FOREIGN``,
``Written.refused``). ``requester=None`` is the operator (the REST API): not checked.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)

from .clock import utcnow
from .database import ConstraintViolation, Database
from .registry_models import DISCONNECTED, LIVE, EntryKind, RegistryEntry

_T = RegistryEntry
# The first key of the advisory locks on user URLs (PostgreSQL): "rgu1".
_USER_LOCK_SPACE = 0x72677531
_COLUMNS = list(_T.__table__.columns)
_TIMES = ("starting_time", "last_modified", "expires_at", "disconnected_at")


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored registration. From a read, ``status`` is the status as of the read (expiry
    applied)."""

    id: int
    kind: EntryKind
    url: str
    user_url: str | None
    email: str | None
    guid: str | None
    descriptor: str | None
    p2p_handler: str | None
    name: str | None
    object_schema: str | None
    reporter: str | None
    resources: list[str]
    data_schemes: list[str]
    status: str
    runtime: str | None
    owner: str | None
    p2p_requester: str | None
    expires: int
    starting_time: datetime
    last_modified: datetime
    expires_at: datetime
    disconnected_at: datetime | None
    detached: bool
    user_verified: bool = False

    def disconnected_since(self, now: datetime) -> datetime | None:
        if self.status == DISCONNECTED:
            return self.disconnected_at or self.last_modified
        if self.expires_at < now:
            return self.expires_at
        return None


@dataclass(frozen=True, slots=True)
class StatusChange:
    url: str
    status: str


class Registered(enum.Enum):
    CREATED = "created"
    REPLACED = "replaced"
    # The hyperty URL is registered for another user: the reference answers 404.
    OTHER_USER = "other user"
    # The URL is registered by another runtime: nothing written.
    FOREIGN = "foreign"
    # The user URL is held by another runtime (anonymous registrations): nothing written.
    USER_HELD = "user held"


@dataclass(frozen=True, slots=True)
class Written:
    """What a write found: ``found`` False when there was no such entry (nothing written);
    ``refused`` True when the entry is another runtime's (nothing written); ``changes`` the
    status changes it made (on a refusal, only the expiry it recorded)."""

    found: bool
    changes: list[StatusChange]
    status_changed: bool = False
    refused: bool = False


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything stored is UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _entry(row: Any) -> Entry:
    values = dict(row._mapping)
    for name in _TIMES:
        values[name] = _utc(values[name])
    return Entry(**values)


class RegistryStore:
    def __init__(
        self,
        db: Database,
        *,
        grace_seconds: int,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._db = db
        self._grace = timedelta(seconds=grace_seconds)
        self._clock = clock

    def now(self) -> datetime:
        return self._clock()

    # -- reads --------------------------------------------------------------------------------

    async def find(self, kind: EntryKind, by: str, key: str) -> list[Entry]:
        """Entries of ``kind`` whose column ``by`` (url, user_url, email, guid, name, reporter)
        is ``key``, in registration order, as of now."""
        column = _T.__table__.columns[by]
        query = select(*_COLUMNS).where(_T.kind == kind, column == key).order_by(_T.id)
        now = self.now()
        rows = await self._db.run(lambda conn: conn.execute(query).all())
        return self._visible([_entry(row) for row in rows], now)

    def _visible(self, entries: Sequence[Entry], now: datetime) -> list[Entry]:
        visible = []
        for entry in entries:
            since = entry.disconnected_since(now)
            if since is None:
                visible.append(entry)
            elif since > now - self._grace:
                visible.append(replace(entry, status=DISCONNECTED))
        return visible

    # -- writes -------------------------------------------------------------------------------

    async def register(
        self,
        kind: EntryKind,
        url: str,
        values: dict[str, Any],
        *,
        requester: str | None,
        user_url: str | None = None,
        email: str | None = None,
        user_verified: bool = False,
    ) -> tuple[Registered, list[StatusChange]]:
        """Create the entry, or replace it whole (keeping its starting time). The entry's owner
        is ``requester``, the runtime registering it, else (the operator) its ``runtime`` field.

        A runtime may replace only an entry it owns (else ``FOREIGN``). A hyperty belongs to one
        user: registering it for another answers ``OTHER_USER``. For a runtime's hyperty,
        ``user_verified`` says the caller checked that ``user_url`` is the runtime's verified
        identity: entries other runtimes registered under that user URL without one are
        removed. Without it the user URL must not be held by another runtime: the owner of the
        oldest entry under it (within the grace period) holds it (else ``USER_HELD``)."""
        now = self.now()
        checked = requester is not None
        hyperty = kind is EntryKind.HYPERTY
        row = {
            **values,
            "owner": requester if checked else values["runtime"],
            "user_url": user_url,
            "email": email,
            "user_verified": hyperty and (user_verified or not checked),
            "last_modified": now,
            "expires_at": now + timedelta(seconds=values["expires"]),
        }

        def op(conn: Connection) -> tuple[Registered, list[StatusChange]]:
            changes: list[StatusChange] = []
            if hyperty and checked and user_url is not None:
                # Who holds a user URL is read from rows this registration does not lock:
                # serialize the registrations under it (SQLite has one writer anyway).
                self._lock_user(conn, user_url)
            entry = self._current(conn, kind, url, now, changes)
            if entry is not None and checked and entry.owner != requester:
                return Registered.FOREIGN, changes
            if entry is not None and hyperty and entry.user_url != user_url:
                return Registered.OTHER_USER, changes
            if hyperty and checked and user_url is not None:
                assert requester is not None
                if user_verified:
                    self._evict_unverified(conn, user_url, requester, changes)
                elif self._holder(conn, user_url, now) not in (None, requester):
                    return Registered.USER_HELD, changes
            if entry is None:
                conn.execute(insert(_T).values(**_new_row(kind, url, row, now)))
                if row["status"] != DISCONNECTED:
                    changes.append(StatusChange(url, row["status"]))
                return Registered.CREATED, changes
            self._write(conn, entry, dict(row), now, changes)
            return Registered.REPLACED, changes

        try:
            return await self._db.run(op)
        except ConstraintViolation:
            # Another transaction created the same entry meanwhile (PostgreSQL): now it exists.
            return await self._db.run(op)

    async def keep_alive(self, kind: EntryKind, url: str, *, requester: str | None) -> Written:
        """The reference's keep-alive: live again, lifetime restarted."""
        return await self.update(kind, url, {"status": LIVE}, requester=requester)

    async def update(
        self, kind: EntryKind, url: str, values: dict[str, Any], *, requester: str | None
    ) -> Written:
        """Merge ``values`` over the entry; its lifetime restarts (as in the reference, any
        update counts as a sign of life). Refused when ``requester`` does not own it."""
        now = self.now()

        def op(conn: Connection) -> Written:
            changes: list[StatusChange] = []
            entry = self._current(conn, kind, url, now, changes)
            if entry is None:
                return Written(False, changes)
            if requester is not None and entry.owner != requester:
                return Written(True, changes, refused=True)
            expires = values.get("expires", entry.expires)
            row = {
                **values,
                "last_modified": now,
                "expires_at": now + timedelta(seconds=expires),
            }
            changed = self._write(conn, entry, row, now, changes)
            return Written(True, changes, changed)

        return await self._db.run(op)

    async def unregister(
        self, kind: EntryKind, url: str, user_url: str | None = None, *, requester: str | None
    ) -> Written:
        """The reference's delete: the entry is marked disconnected (and removed once the grace
        period is over). A hyperty is unregistered by its own user only, and an entry by its
        owner only (``requester``)."""
        now = self.now()

        def op(conn: Connection) -> Written:
            changes: list[StatusChange] = []
            entry = self._current(conn, kind, url, now, changes)
            if entry is None:
                return Written(False, changes)
            if requester is not None and entry.owner != requester:
                return Written(True, changes, refused=True)
            if kind is EntryKind.HYPERTY and entry.user_url != user_url:
                return Written(False, changes)
            changed = self._write(conn, entry, {"status": DISCONNECTED}, now, changes)
            return Written(True, changes, changed)

        return await self._db.run(op)

    def _gone(self, entry: Entry, now: datetime) -> bool:
        """Disconnected for longer than the grace period: no longer answered, about to go."""
        since = entry.disconnected_since(now)
        return since is not None and since <= now - self._grace

    def _holder(self, conn: Connection, user_url: str, now: datetime) -> str | None:
        """The runtime holding a user URL: the owner of the oldest hyperty registered under it
        that is still answered (None when there is none)."""
        query = (
            select(*_COLUMNS)
            .where(_T.kind == EntryKind.HYPERTY, _T.user_url == user_url)
            .order_by(_T.id)
        )
        for row in conn.execute(query):
            entry = _entry(row)
            if not self._gone(entry, now):
                return entry.owner
        return None

    @staticmethod
    def _evict_unverified(
        conn: Connection, user_url: str, requester: str, changes: list[StatusChange]
    ) -> None:
        """The verified user registers under its user URL: what other runtimes registered there
        without a verified identity was never that user's, and goes (a stored status other
        than disconnected is reported as a change to disconnected)."""
        query = (
            select(_T.id, _T.url, _T.status)
            .where(
                _T.kind == EntryKind.HYPERTY,
                _T.user_url == user_url,
                _T.owner != requester,
                _T.user_verified.is_(False),
            )
            .order_by(_T.id)
            .with_for_update()
        )
        for entry_id, entry_url, status in conn.execute(query).all():
            conn.execute(delete(_T).where(_T.id == entry_id))
            if status != DISCONNECTED:
                changes.append(StatusChange(entry_url, DISCONNECTED))

    @staticmethod
    def _lock_user(conn: Connection, user_url: str) -> None:
        """On PostgreSQL, a transaction-scoped advisory lock on the user URL (in the registry's
        own key space)."""
        if conn.dialect.name != "postgresql":
            return
        space = cast(literal(_USER_LOCK_SPACE), Integer)
        conn.execute(select(func.pg_advisory_xact_lock(space, func.hashtext(user_url))))

    def _current(
        self,
        conn: Connection,
        kind: EntryKind,
        url: str,
        now: datetime,
        changes: list[StatusChange],
    ) -> Entry | None:
        """The entry, locked, with its expiry recorded; None if absent or past its grace."""
        query = select(*_COLUMNS).where(_T.kind == kind, _T.url == url).with_for_update()
        row = conn.execute(query).first()
        if row is None:
            return None
        entry = _entry(row)
        since = entry.disconnected_since(now)
        if since is not None and since <= now - self._grace:
            conn.execute(delete(_T).where(_T.id == entry.id))
            return None
        if since is not None and entry.status != DISCONNECTED:
            self._write(conn, entry, {"status": DISCONNECTED}, since, changes)
            entry = replace(entry, status=DISCONNECTED, disconnected_at=since, detached=False)
        return entry

    @staticmethod
    def _write(
        conn: Connection,
        entry: Entry,
        row: dict[str, Any],
        now: datetime,
        changes: list[StatusChange],
    ) -> bool:
        """Update the entry; a different status is recorded as a change. Returns whether the
        status changed."""
        status: str = row.get("status", entry.status)
        changed = status != entry.status
        if changed:
            row["disconnected_at"] = now if status == DISCONNECTED else None
            # Whatever ends a detachment, a later resume must not undo it.
            row["detached"] = False
            changes.append(StatusChange(entry.url, status))
        conn.execute(update(_T).where(_T.id == entry.id).values(**row))
        return changed

    async def owned_by(self, owner: str) -> bool:
        """Whether any entry of ``owner`` is left that the sweep has not removed yet."""
        now = self.now()
        query = (
            select(_T.id)
            .where(
                _T.owner == owner,
                or_(_T.status != DISCONNECTED, _T.disconnected_at > now - self._grace),
            )
            .limit(1)
        )
        return await self._db.run(lambda conn: conn.execute(query).first() is not None)

    # -- presence -----------------------------------------------------------------------------

    async def detach(self, owner: str) -> list[StatusChange]:
        """The owner (a runtimeURL) is away: its live entries become disconnected, to be revived
        by ``resume`` when it comes back."""
        now = self.now()
        statement = (
            update(_T)
            .where(_T.owner == owner, _T.status != DISCONNECTED, _T.expires_at >= now)
            .values(status=DISCONNECTED, disconnected_at=now, detached=True)
            .returning(_T.url)
        )

        def op(conn: Connection) -> list[StatusChange]:
            return [StatusChange(url, DISCONNECTED) for url in conn.execute(statement).scalars()]

        return await self._db.run(op)

    async def resume(self, owner: str) -> list[StatusChange]:
        """The owner is back: what its absence disconnected, and is still within its grace
        period, is live again with its lifetime restarted (the runtime could not keep it alive
        while away)."""
        now = self.now()
        query = (
            select(_T.id, _T.url, _T.expires)
            .where(
                _T.owner == owner,
                _T.detached.is_(True),
                _T.status == DISCONNECTED,
                _T.disconnected_at > now - self._grace,
            )
            .order_by(_T.id)
            .with_for_update()
        )

        def op(conn: Connection) -> list[StatusChange]:
            changes = []
            for entry_id, url, expires in conn.execute(query).all():
                conn.execute(
                    update(_T)
                    .where(_T.id == entry_id)
                    .values(
                        status=LIVE,
                        disconnected_at=None,
                        detached=False,
                        last_modified=now,
                        expires_at=now + timedelta(seconds=expires),
                    )
                )
                changes.append(StatusChange(url, LIVE))
            return changes

        return await self._db.run(op)

    async def owners(self) -> dict[str, int]:
        """How many entries each owner holds, answered or not yet removed (what the bounds on
        a client's entries count)."""
        query = select(_T.owner, func.count()).group_by(_T.owner)
        return await self._db.run(
            lambda conn: {str(owner): int(n) for owner, n in conn.execute(query) if owner}
        )

    # -- expiry -------------------------------------------------------------------------------

    async def sweep(self) -> tuple[list[StatusChange], int]:
        """Record the expiry of entries past their lifetime and remove those disconnected for
        longer than the grace period. Returns the changes and how many entries were removed."""
        now = self.now()
        expire = (
            update(_T)
            .where(_T.status != DISCONNECTED, _T.expires_at < now)
            .values(status=DISCONNECTED, disconnected_at=_T.expires_at, detached=False)
            .returning(_T.url)
        )
        purge = delete(_T).where(_T.status == DISCONNECTED, _T.disconnected_at <= now - self._grace)

        def op(conn: Connection) -> tuple[list[StatusChange], int]:
            changes = [StatusChange(url, DISCONNECTED) for url in conn.execute(expire).scalars()]
            removed = conn.execute(purge).rowcount
            return changes, removed

        return await self._db.run(op)


def _new_row(kind: EntryKind, url: str, row: dict[str, Any], now: datetime) -> dict[str, Any]:
    status = row["status"]
    return {
        **row,
        "kind": kind,
        "url": url,
        "starting_time": now,
        "disconnected_at": now if status == DISCONNECTED else None,
        "detached": False,
    }

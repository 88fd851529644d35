"""The domain's node processes, when it runs several: each one's lanes (with the number of
each lane's last event when the process started) and when it was last alive. Plus what makes
PostgreSQL announce every change of the routing state to the other processes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from sqlalchemy import Connection, select, text, update

from .clock import utcnow
from .database import Database, upsert
from .models import NodeProcess

ROUTES_CHANNEL = "rethink_mn_routes"
PROCESSES_CHANNEL = "rethink_mn_processes"


def application_name(process: str) -> str:
    """How the process's database connections are named (announcements carry it)."""
    return f"rethink-mn/{process}"


# Run by every process at start, under one advisory lock (two processes replacing a function at
# once would fail). Each row change of the routing state is announced, with the process that
# made it (the connection's application_name), as one small JSON payload: only the columns
# the routing table needs, well under NOTIFY's 8,000 bytes (an address holds at most 2,048).
_ANNOUNCE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION rethink_mn_announce_route() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  r record;
  payload json;
BEGIN
  IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
  IF TG_TABLE_NAME = 'runtime_sessions' THEN
    payload := json_build_object('s', r.id, 'runtime', r.runtime_url);
  ELSIF TG_TABLE_NAME = 'allocations' THEN
    payload := json_build_object('s', r.session_id, 'address', r.address,
                                 'key', r.allocation_key);
  ELSE
    payload := json_build_object('s', r.session_id, 'address', r.address);
  END IF;
  PERFORM pg_notify('{ROUTES_CHANNEL}', json_build_object(
    'by', current_setting('application_name'), 't', TG_TABLE_NAME, 'op', TG_OP,
    'row', payload)::text);
  RETURN NULL;
END $$
"""
_ANNOUNCED = {
    "runtime_sessions": "INSERT OR DELETE",
    "allocations": "INSERT OR DELETE",
    "subscriptions": "INSERT OR DELETE",
    "learned_routes": "INSERT OR DELETE OR UPDATE OF session_id",
}
# Any constant: the lock only keeps the processes' installations apart.
_INSTALL_LOCK = 0x5245_5448


@dataclass(frozen=True, slots=True)
class ProcessRow:
    name: str
    # (room id, number of the lane's last event when the process started)
    lanes: list[tuple[str, int]]
    started_at: datetime
    heartbeat_at: datetime


class ProcessStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._register = upsert(
            db.dialect, NodeProcess, ["name"], ["lane_rooms", "started_at", "heartbeat_at"]
        )

    async def install_announcements(self) -> None:
        """Make PostgreSQL announce routing changes on ``ROUTES_CHANNEL`` (idempotent)."""

        def op(conn: Connection) -> None:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _INSTALL_LOCK})
            conn.execute(text(_ANNOUNCE_FUNCTION))
            for table, events in _ANNOUNCED.items():
                conn.execute(text(f"DROP TRIGGER IF EXISTS rethink_mn_announce ON {table}"))
                conn.execute(
                    text(
                        f"CREATE TRIGGER rethink_mn_announce AFTER {events} ON {table} "
                        "FOR EACH ROW EXECUTE FUNCTION rethink_mn_announce_route()"
                    )
                )

        await self._db.run(op)

    async def register(self, name: str, lanes: list[tuple[str, int]]) -> None:
        """This process is up, writing ``lanes``; the others are told at once."""
        now = utcnow()
        row = {
            "name": name,
            "lane_rooms": orjson.dumps(lanes).decode(),
            "started_at": now,
            "heartbeat_at": now,
        }

        def op(conn: Connection) -> None:
            conn.execute(self._register, row)
            conn.execute(text("SELECT pg_notify(:c, :n)"), {"c": PROCESSES_CHANNEL, "n": name})

        await self._db.run(op)

    async def ask_for(self, holder: str, runtime_url: str, asker: str) -> None:
        """Ask node process ``holder`` to hand the runtime's session to ``asker``."""
        payload = orjson.dumps(
            {"t": "handover", "from": holder, "to": asker, "runtime": runtime_url, "by": ""}
        ).decode()

        def op(conn: Connection) -> None:
            conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": ROUTES_CHANNEL, "p": payload})

        await self._db.run(op)

    async def heartbeat(self, name: str) -> bool:
        """False when the process's row is gone: another process took it for gone and holds
        its sessions now."""

        def op(conn: Connection) -> bool:
            result = conn.execute(
                update(NodeProcess).where(NodeProcess.name == name).values(heartbeat_at=utcnow())
            )
            return bool(result.rowcount)

        return await self._db.run(op)

    async def all(self) -> list[ProcessRow]:
        def op(conn: Connection) -> list[ProcessRow]:
            rows = conn.execute(
                select(
                    NodeProcess.name,
                    NodeProcess.lane_rooms,
                    NodeProcess.started_at,
                    NodeProcess.heartbeat_at,
                )
            )
            return [
                ProcessRow(
                    str(name),
                    [(str(room), int(n)) for room, n in orjson.loads(lanes)],
                    started,
                    beat,
                )
                for name, lanes, started, beat in rows
            ]

        return await self._db.run(op)

    @staticmethod
    def alive(row: ProcessRow, gone_after: timedelta) -> bool:
        return utcnow() - row.heartbeat_at < gone_after

"""The node's database for a benchmark phase: a fresh SQLite file or a fresh PostgreSQL database.

    async with fresh_database("postgresql", work_dir, "node") as url:
        ...  # url goes into the node's config; the database is dropped afterwards

PostgreSQL is the machine's server (``RETHINK_MN_BENCH_PG``, by default
postgresql://postgres@127.0.0.1:5432/postgres, trust auth); each phase gets a database of its
own, created empty and dropped at the end, so no phase inherits another's rows.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg

KINDS = ("sqlite", "postgresql")
PG_ADMIN_URL = os.environ.get(
    "RETHINK_MN_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@contextlib.asynccontextmanager
async def fresh_database(kind: str, work: Path, phase: str) -> AsyncIterator[str]:
    """The URL of an empty database for ``phase`` (SQLite file under ``work``, or PostgreSQL)."""
    if kind == "sqlite":
        yield f"sqlite:///{work / f'{phase}.db'}"
        return
    if kind != "postgresql":
        raise ValueError(f"unknown database kind {kind!r}; one of {', '.join(KINDS)}")
    name = f"rethink_bench_{phase}_{secrets.token_hex(4)}"
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

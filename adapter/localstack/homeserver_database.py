"""A PostgreSQL database for a local Synapse (worker mode needs one), or for the node processes
of `up --nodes`: created on first use with the C collation Synapse insists on."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from .synapse import LocalStackError


def without_password(url: str) -> str:
    """``url`` fit to print: its password, if any, replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}{port}"))


async def drop_homeserver_database(url: str) -> None:
    """Drop the database ``url`` names (its connections ended), if it exists."""
    parts = urlsplit(url)
    admin = urlunsplit(parts._replace(path="/postgres"))
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(parts.path.lstrip("/"))
            )
        )


async def ensure_homeserver_database(
    url: str, fresh: bool = False, whose: str = "the homeserver's"
) -> str:
    """Create the database ``url`` names if it does not exist (dropped first when ``fresh``),
    connecting to the server's `postgres` database to do so; returns ``url``."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name:
        raise LocalStackError(f"the database URL {url!r} names no database")
    admin = urlunsplit(parts._replace(path="/postgres"))
    try:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            if fresh:
                await conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
            found = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if await found.fetchone() is None:
                await conn.execute(
                    sql.SQL(
                        "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' "
                        "LC_COLLATE 'C' LC_CTYPE 'C'"
                    ).format(sql.Identifier(name))
                )
    except psycopg.Error as exc:
        raise LocalStackError(
            f"could not reach or prepare {whose} PostgreSQL database "
            f"({without_password(url)}): {exc}"
        ) from exc
    return url

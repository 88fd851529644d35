"""Programmatic Alembic: `rethink-mn db upgrade|current` and the migrations `up` applies."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import migrations

from .database import create_engine

SCRIPT_LOCATION = str(Path(migrations.__file__).parent)


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    cfg.attributes["database_url"] = database_url
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


# Migrations are blocking work (DDL, file I/O): they run on a worker thread.


async def upgrade(database_url: str, revision: str = "head") -> None:
    await asyncio.to_thread(command.upgrade, alembic_config(database_url), revision)


async def downgrade(database_url: str, revision: str) -> None:
    await asyncio.to_thread(command.downgrade, alembic_config(database_url), revision)


def _current(database_url: str) -> str | None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


async def current_revision(database_url: str) -> str | None:
    return await asyncio.to_thread(_current, database_url)

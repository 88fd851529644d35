"""Migrations apply on SQLite and PostgreSQL and produce exactly the models' schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection

from adapter.storage import (
    migrate,
    policy_models,  # noqa: F401 - its tables belong to Base too
)
from adapter.storage.database import Database
from adapter.storage.models import Base
from adapter.storage.registry_models import RegistryEntry  # noqa: F401 - registers its table

from ..conftest import Databases

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


async def _diff_and_tables(url: str) -> tuple[list[object], set[str]]:
    def inspect_sync(conn: Connection) -> tuple[list[object], set[str]]:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(ctx, Base.metadata), set(inspect(conn).get_table_names())

    db = Database(url)
    try:
        return await db.run(inspect_sync)
    finally:
        await db.dispose()


async def _fresh_url(databases: Databases, backend: str) -> str:
    return databases.sqlite() if backend == "sqlite" else await databases.postgres()


async def test_upgrade_matches_models_and_downgrade_reverts(
    databases: Databases, db_backend: str
) -> None:
    url = await _fresh_url(databases, db_backend)
    assert await migrate.current_revision(url) is None

    await migrate.upgrade(url)
    assert await migrate.current_revision(url) == migrate.head_revision()
    diff, tables = await _diff_and_tables(url)
    assert diff == [], f"models and migrations disagree: {diff}"
    assert {
        "runtime_sessions",
        "allocations",
        "subscriptions",
        "rooms",
        "processed_transactions",
        "pending_deliveries",
        "learned_routes",
        "export_positions",
        "registry_entries",
        "policy_rules",
        "policy_settings",
    } <= tables

    await migrate.downgrade(url, "base")
    _, tables = await _diff_and_tables(url)
    assert tables <= {"alembic_version"}

    await migrate.upgrade(url)  # and again, from nothing
    assert await migrate.current_revision(url) == migrate.head_revision()


async def test_cli_db_upgrade_and_current(
    databases: Databases, db_backend: str, tmp_path: Path
) -> None:
    url = await _fresh_url(databases, db_backend)
    config = tmp_path / "config.yaml"
    config.write_text(
        "appservice:\n  as_token: aaaaaaaaaaaaaaaaaaaa\n  hs_token: hhhhhhhhhhhhhhhhhhhh\n"
        f"database:\n  url: {url}\n"
    )
    cli = [sys.executable, "-m", "adapter.cli", "-c", str(config)]
    before = subprocess.run([*cli, "db", "current"], capture_output=True, text=True, check=False)
    assert before.returncode == 0, before.stderr
    assert before.stdout.strip() == "none"

    upgrade = subprocess.run([*cli, "db", "upgrade"], capture_output=True, text=True, check=False)
    assert upgrade.returncode == 0, upgrade.stderr

    after = subprocess.run([*cli, "db", "current"], capture_output=True, text=True, check=False)
    assert after.stdout.strip() == migrate.head_revision()
    assert "up to date" in after.stderr

"""Alembic environment: runs migrations with the node's engine set-up (SQLite or PostgreSQL)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy.engine import Connection

from adapter.storage import policy_models  # noqa: F401 - registers its tables on Base
from adapter.storage.database import create_engine, is_sqlite
from adapter.storage.models import Base
from adapter.storage.registry_models import RegistryEntry  # noqa: F401 - registers its table

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    url = url or os.environ.get("RETHINK_MN_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: pass one through the rethink-mn CLI or sqlalchemy.url")
    return str(url)


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite" if connection else is_sqlite(url or ""),
        compare_type=True,
        literal_binds=connection is None,
    )


if context.is_offline_mode():
    _configure(url=_database_url())
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(_database_url())
    try:
        with engine.connect() as connection:
            _configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
    finally:
        engine.dispose()

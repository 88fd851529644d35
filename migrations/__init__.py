"""Alembic migrations for the node's database (SQLite and PostgreSQL)."""

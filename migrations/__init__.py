"""Alembic migration history (one history for PostgreSQL and SQLite)."""

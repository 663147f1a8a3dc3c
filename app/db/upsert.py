"""`INSERT … ON CONFLICT DO NOTHING` for both backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection


def insert_for(dialect_name: str, table: Table) -> Any:
    """The named backend's insert for `table`: it has `on_conflict_do_nothing/update`."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    return dialect.insert(table)


def insert_ignore_for(dialect_name: str, table: Table, conflict_columns: Sequence[str]) -> Any:
    """An insert statement for `table` on the named backend that skips conflicting rows."""
    return insert_for(dialect_name, table).on_conflict_do_nothing(index_elements=list(conflict_columns))


def insert_ignore(conn: AsyncConnection, table: Table, conflict_columns: Sequence[str]) -> Any:
    """An insert statement for `table` that skips rows conflicting on `conflict_columns`."""
    return insert_ignore_for(conn.dialect.name, table, conflict_columns)

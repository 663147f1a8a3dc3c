"""The schema's foundation: the one `MetaData`, the column types both backends share, and
the helpers statements use (`one_of`, `utcnow`, the unfinished-row statuses).

The tables are in `pipeline_tables.py`, `agent_tables.py` and `access_tables.py`;
`app.db.models` is the schema as one module, where everything else imports them from.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    MetaData,
    literal,
    literal_column,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments an INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer, "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite stores naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# Rows still owed work: unfinished inbox events, undelivered outbox replies.
INBOX_UNFINISHED = ("pending", "processing")
# An inbox row canceled while it was pending (A2A tasks/cancel): finished, never run.
CANCELED = "canceled"
OUTBOX_UNDELIVERED = ("pending", "sending")


def one_of(column: ColumnElement[Any], values: Iterable[Any]) -> ColumnElement[bool]:
    """`column IN (values)` with one bound parameter per value, fixed in the cached SQL.

    `column.in_(values)` binds the list as one "expanding" parameter instead, which
    SQLAlchemy renders into the statement's text anew on every execution: measurable on
    statements that run for every event.
    """
    return column.in_([_constant(v, column.type) for v in values])


def _constant(value: Any, type_: Any) -> ColumnElement[Any]:
    """`value` written into the SQL text: the planner sees it in a prepared statement's
    generic plan too, so a partial index whose predicate names it can serve the query."""
    if isinstance(value, str):
        return literal_column("'" + value.replace("'", "''") + "'", type_)
    return literal(value, type_)


def utcnow() -> datetime:
    return datetime.now(UTC)

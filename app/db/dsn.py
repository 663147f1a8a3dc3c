"""One PostgreSQL URL for every client: the asyncpg arguments SQLAlchemy's pool uses.

SQLAlchemy takes several hosts as repeated `host=` parameters
(`postgresql+asyncpg://u@/db?host=a:5432&host=b:5433&target_session_attrs=read-write`)
and hands asyncpg lists of hosts and ports. A DSN rendered back from such a URL repeats
`host=`, and asyncpg keeps only the last one: the session bus then connected to one host
only (the standby, or the old primary after a failover). So every direct asyncpg
connection (the session bus, `doctor`, tests) is opened with the keyword arguments
SQLAlchemy's dialect computes for its own pool: the URL is read one way everywhere.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine import make_url

# Arguments SQLAlchemy's asyncpg dialect consumes itself; asyncpg.connect() refuses them.
_DIALECT_ONLY = ("prepared_statement_cache_size", "prepared_statement_name_func", "async_fallback")


def asyncpg_connect_kwargs(database_url: str) -> dict[str, Any]:
    """`asyncpg.connect(**these)` reaches what `create_async_engine(database_url)` reaches."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"not a PostgreSQL URL: {url.render_as_string()}")
    _args, kwargs = PGDialect_asyncpg().create_connect_args(url.set(drivername="postgresql+asyncpg"))
    for name in _DIALECT_ONLY:
        kwargs.pop(name, None)
    return dict(kwargs)

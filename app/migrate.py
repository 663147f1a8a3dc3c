"""Run alembic migrations from code (`chatgate migrate`, start-up, tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnusable

if TYPE_CHECKING:
    from alembic.config import Config

# alembic (with Mako and Pygments) is imported where a migration is read or run: a process
# that never migrates (most CLI commands) does not pay its 0.3 s of import.

log = structlog.get_logger(__name__)


# SQLSTATEs a retry does not fix: the database does not exist, the login was refused.
_PERMANENT_SQLSTATES = {
    "3D000": "the database does not exist",
    "28P01": "the password was refused",
    "28000": "the login was refused",
}


def permanent_failure(exc: BaseException) -> str | None:
    """A one-line reason if `exc` (from connecting) will not go away by retrying."""
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "sqlstate", None)
        if isinstance(code, str) and code in _PERMANENT_SQLSTATES:
            return f"{_PERMANENT_SQLSTATES[code]}: {str(seen).strip().splitlines()[0]}"
        if "unable to open database file" in str(seen):
            return "the SQLite file cannot be opened (does its directory exist?)"
        seen = seen.__cause__ or seen.__context__
    return None


async def wait_for_database(engine: AsyncEngine, timeout: float) -> None:
    """Retry connecting for up to `timeout` seconds (a database container starting up)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.5
    while True:
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return
        except (OSError, SQLAlchemyError) as exc:
            reason = permanent_failure(exc)
            if reason is not None:
                raise DatabaseUnusable(reason) from exc
            if loop.time() + delay > deadline:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise DatabaseUnusable(f"not reachable after {timeout:.0f} s of retries: {first}") from exc
            log.warning("database_not_reachable_yet", error=str(exc)[:200], retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def alembic_config(database_url: str, connect_args: Mapping[str, Any] | None = None) -> Config:
    """`connect_args`: the driver's arguments (`app.db.engine.driver_connect_args`), so the
    migrations connect as the pool does (behind PgBouncer: no named statements)."""
    from alembic.config import Config

    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    cfg.attributes["connect_args"] = dict(connect_args or {})
    return cfg


def upgrade_to_head(database_url: str, connect_args: Mapping[str, Any] | None = None) -> None:
    """Blocking; alembic's env.py runs its own event loop, so call it from a thread."""
    from alembic import command

    command.upgrade(alembic_config(database_url, connect_args), "head")


async def upgrade(database_url: str, connect_args: Mapping[str, Any] | None = None) -> None:
    await asyncio.to_thread(upgrade_to_head, database_url, connect_args)


def head_revision(database_url: str) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync_conn: MigrationContext.configure(sync_conn).get_current_revision()
        )


async def at_head(engine: AsyncEngine) -> bool:
    return await current_revision(engine) == head_revision(str(engine.url))

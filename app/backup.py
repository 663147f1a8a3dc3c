"""`chatgate backup` and `chatgate restore`: the whole database to a file and back.

PostgreSQL goes through `pg_dump --format=custom` and `pg_restore` (the PostgreSQL client
tools, same major version or newer than the server); the embedded SQLite store through
SQLite's online backup API, which copies a consistent snapshot while the server keeps
writing. A restore goes into a new, empty database and reports the rows of every table,
so a restore can be checked against the backup's own counts.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.models import metadata


class BackupError(Exception):
    """A backup or restore that cannot be done; the message says why."""


async def table_counts(database_url: str) -> dict[str, int]:
    """Rows per chatgate table (tables the database does not have are left out)."""
    engine = create_async_engine(database_url)
    try:
        return await _counts(engine)
    finally:
        await engine.dispose()


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        present = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        counts = {}
        for table in metadata.sorted_tables:
            if table.name in present:
                counts[table.name] = int(
                    (await conn.execute(select(func.count()).select_from(table))).scalar_one()
                )
        return counts


async def backup(database_url: str, target: Path) -> dict[str, int]:
    """Write the database to `target` (not overwritten if it exists); the counts backed up."""
    if await asyncio.to_thread(target.exists):
        raise BackupError(f"{target} exists: choose a new file name")
    if _is_sqlite(database_url):
        await asyncio.to_thread(_sqlite_copy, _sqlite_path(database_url), target)
    else:
        await _run(
            _tool("pg_dump"), "--format=custom", "--no-owner", f"--file={target}", _libpq(database_url)
        )
    return await table_counts(database_url)


async def restore(database_url: str, source: Path) -> dict[str, int]:
    """Load `source` into the (new, empty) database at `database_url`; the counts restored."""
    if not await asyncio.to_thread(source.is_file):
        raise BackupError(f"{source} is not a file")
    if await table_counts(database_url):
        raise BackupError(
            "the target database already has chatgate tables: restore into a new, empty database"
        )
    if _is_sqlite(database_url):
        await asyncio.to_thread(_sqlite_copy, source, _sqlite_path(database_url))
    else:
        await _run(
            _tool("pg_restore"),
            "--no-owner",
            "--exit-on-error",
            f"--dbname={_libpq(database_url)}",
            str(source),
        )
    return await table_counts(database_url)


def _is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _sqlite_path(url: str) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise BackupError("an in-memory SQLite database cannot be backed up or restored")
    return Path(database)


def _sqlite_copy(source: Path, target: Path) -> None:
    """SQLite's online backup: a consistent copy even while another process writes."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def _libpq(url: str) -> str:
    """The SQLAlchemy URL as the PostgreSQL client tools take it (no `+asyncpg`)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupError(f"{name} is not installed (Debian: apt-get install postgresql-client)")
    return found


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _out, err = await proc.communicate()
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise BackupError(f"{Path(argv[0]).name} failed: {lines[-1] if lines else proc.returncode}")

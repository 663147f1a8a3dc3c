"""Throw-away databases: a SQLite file or a fresh PostgreSQL database per test.

PostgreSQL tests never skip: if the server is not reachable they fail, so CI cannot
pass without them. `TEST_POSTGRES_URL` points at the server (default: local, trust auth).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _with_database(url: str, name: str) -> str:
    base = url.rsplit("/", 1)[0]
    return f"{base}/{name}"


@asynccontextmanager
async def postgres_database() -> AsyncIterator[str]:
    """Create an empty database; yield its SQLAlchemy URL; drop it afterwards."""
    name = f"chatgate_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield _with_database(ADMIN_URL, name).replace("postgresql://", "postgresql+asyncpg://", 1)
    finally:
        conn = await asyncpg.connect(ADMIN_URL)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@asynccontextmanager
async def sqlite_database(directory: Path) -> AsyncIterator[str]:
    yield f"sqlite+aiosqlite:///{directory / 'chatgate.db'}"


@asynccontextmanager
async def database(kind: str, directory: Path) -> AsyncIterator[str]:
    if kind == "postgres":
        async with postgres_database() as url:
            yield url
    else:
        async with sqlite_database(directory) as url:
            yield url

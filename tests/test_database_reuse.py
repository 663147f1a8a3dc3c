"""The suite's PostgreSQL databases are used again (tests/support/db.py): the next test gets
what a new copy of the template would give it, and a database whose schema a test changed
is dropped, not handed on."""

from __future__ import annotations

import asyncpg
import pytest

from tests.support import db


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _oid(name_or_url: str) -> int | None:
    name = name_or_url.rsplit("/", 1)[-1]
    conn = await asyncpg.connect(db.ADMIN_URL)
    try:
        return await conn.fetchval("SELECT oid FROM pg_database WHERE datname = $1", name)
    finally:
        await conn.close()


async def _write_rows(url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(_plain(url))
    for n in range(3):
        await conn.execute(
            "INSERT INTO sessions (key, generation, channel, status, last_consolidated, next_seq,"
            " created_at, updated_at, last_active_at, metadata)"
            " VALUES ($1, 0, 'webhook', 'active', 0, 1, now(), now(), now(), '{}')",
            f"webhook:chat-{n}",
        )
    await conn.execute(
        "INSERT INTO memories (scope, owner, content, created_at, updated_at, metadata)"
        " VALUES ('user', 'u1', 'likes tea', now(), now(), '{}')"
    )
    await conn.execute("ANALYZE sessions")
    return conn  # left open, as a server process the test forgot might leave it


async def test_the_next_test_gets_an_empty_database_at_head_under_a_new_name() -> None:
    db.settle()
    async with db.postgres_database() as first:
        oid = await _oid(first)
        leftover = await _write_rows(first)
        template_version = await leftover.fetchval("SELECT version_num FROM alembic_version")
    db.settle()
    assert leftover.is_closed() or await _connection_is_dead(leftover)

    async with db.postgres_database() as second:
        assert await _oid(second) == oid, "the emptied database was not the one handed on"
        assert second != first
        with pytest.raises((asyncpg.InvalidCatalogNameError, asyncpg.ObjectNotInPrerequisiteStateError)):
            await asyncpg.connect(_plain(first))  # the old name reaches nothing
        conn = await asyncpg.connect(_plain(second))
        try:
            tables = [
                r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ]
            counts = {t: await conn.fetchval(f'SELECT count(*) FROM "{t}"') for t in tables}
            assert counts.pop("alembic_version") == 1
            assert set(counts.values()) == {0}, counts
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == template_version
            assert await conn.fetchval("SELECT nextval('sessions_id_seq')") == 1
            assert await conn.fetchval("SELECT relpages FROM pg_class WHERE relname = 'sessions'") == 0
            assert not await conn.fetchval(
                "SELECT count(*) FROM pg_statistic WHERE starelid = 'sessions'::regclass"
            )
        finally:
            await conn.close()


async def _connection_is_dead(conn: asyncpg.Connection) -> bool:
    try:
        await conn.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError, OSError):
        return True
    finally:
        conn.terminate()
    return False


async def test_a_database_whose_schema_a_test_changed_is_dropped_not_reused() -> None:
    db.settle()
    async with db.postgres_database() as changed:
        oid = await _oid(changed)
        conn = await asyncpg.connect(_plain(changed))
        try:
            await conn.execute("ALTER TABLE sessions ADD COLUMN extra text")
        finally:
            await conn.close()
    db.settle()
    assert await _oid_exists(oid) is False

    async with db.postgres_database() as after:
        conn = await asyncpg.connect(_plain(after))
        try:
            columns = await conn.fetch(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = 'sessions' AND column_name = 'extra'"
            )
            assert columns == []
        finally:
            await conn.close()


async def _oid_exists(oid: int | None) -> bool:
    conn = await asyncpg.connect(db.ADMIN_URL)
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM pg_database WHERE oid = $1", oid))
    finally:
        await conn.close()

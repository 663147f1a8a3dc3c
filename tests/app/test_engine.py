"""Pooled PostgreSQL connections: pinged only after idling, replaced when dead."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import engine as engines
from tests.conftest import make_settings


async def _backend_pid(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def _kill(engine: AsyncEngine, pid: int) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


async def test_an_idle_connection_that_died_is_replaced_before_use(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "IDLE_PING_SECONDS", 0.0)  # every checkout counts as idle
    engine = engines.create_engine(make_settings(pg_url, db_pool_size=1))
    try:
        pid = await _backend_pid(engine)
        killer = engines.create_engine(make_settings(pg_url, db_pool_size=1))
        try:
            await _kill(killer, pid)
        finally:
            await killer.dispose()
        # The pooled connection is dead; the ping finds out and the pool reconnects.
        new_pid = await _backend_pid(engine)
        assert new_pid != pid
    finally:
        await engine.dispose()


async def test_a_connection_in_steady_use_is_not_pinged(pg_url: str) -> None:
    engine = engines.create_engine(make_settings(pg_url, db_pool_size=1))
    pings = 0
    original = engine.dialect.do_ping

    def counting_ping(dbapi_conn: Any) -> bool:
        nonlocal pings
        pings += 1
        return original(dbapi_conn)

    engine.dialect.do_ping = counting_ping  # type: ignore[method-assign,assignment]
    try:
        pid = await _backend_pid(engine)
        assert pings == 1  # a new connection is checked once
        for _ in range(20):
            assert await _backend_pid(engine) == pid
        assert pings == 1
        # Dead without a ping (it was used a moment ago): the one statement that finds
        # out fails, the pool is invalidated, and the next checkout gets a live connection.
        killer = engines.create_engine(make_settings(pg_url, db_pool_size=1))
        try:
            await _kill(killer, pid)
        finally:
            await killer.dispose()
        with pytest.raises(DBAPIError):
            await _backend_pid(engine)
        assert await _backend_pid(engine) != pid
    finally:
        await engine.dispose()

"""`Direct` statements: the same rows as through SQLAlchemy, and the pool stays healthy."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import asyncpg
import pytest
from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.direct import Direct, DirectConnection, Pooled, connect
from app.db.engine import autocommit
from app.db.models import inbox
from app.events import InboundEvent
from tests.support.pipeline import accept_elsewhere

BACKEND = Direct(select(func.pg_backend_pid().label("pid")))


async def test_direct_rows_equal_sqlalchemys(engine: AsyncEngine) -> None:
    for text in ("one", "two"):
        await accept_elsewhere(engine, [InboundEvent.from_text("webhook", "c", "u", text)])
    statement = Direct(
        select(inbox)
        .where(inbox.c.session_key == bindparam("k"), inbox.c.status == "pending")
        .order_by(inbox.c.id)
    )
    async with autocommit(engine).connect() as conn:
        direct = [dict(r) for r in await statement.rows(conn, {"k": "webhook:c"})]
        through = [dict(r) for r in (await conn.execute(statement.statement, {"k": "webhook:c"})).mappings()]
    async with connect(autocommit(engine)) as own:  # the pool's connection alone on PostgreSQL
        alone = [dict(r) for r in await statement.rows(own, {"k": "webhook:c"})]
    assert direct == through == alone
    assert [InboundEvent.model_validate(r["payload"]).text for r in direct] == ["one", "two"]  # JSON decoded
    assert all(r["created_at"].tzinfo is not None for r in direct)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("alone", [False, True], ids=["connection", "pooled"])
async def test_a_connection_that_died_under_a_statement_leaves_the_pool(
    engine: AsyncEngine, db_url: str, alone: bool
) -> None:
    single = autocommit(engine)

    def checkout() -> AbstractAsyncContextManager[DirectConnection]:
        return connect(single) if alone else single.connect()

    async with checkout() as conn:
        first = (await BACKEND.one(conn, {}))["pid"]
    admin = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await admin.execute("SELECT pg_terminate_backend($1)", first)
    finally:
        await admin.close()
    # asyncpg reports it in several ways (terminated, closed, protocol state): any is fine.
    with pytest.raises(Exception):  # noqa: B017
        async with checkout() as conn:
            await BACKEND.one(conn, {})
    async with checkout() as conn:
        second = (await BACKEND.one(conn, {}))["pid"]
    assert second != first


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_connection_checked_out_alone_goes_back_to_the_pool(engine: AsyncEngine) -> None:
    single = autocommit(engine)
    pids = []
    for _ in range(3):
        async with connect(single) as conn:
            assert isinstance(conn, Pooled)
            pids.append((await BACKEND.one(conn, {}))["pid"])
    assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert len(set(pids)) == 1  # the same pooled connection each time, not a new one
    async with single.connect() as conn:  # and SQLAlchemy's own checkouts still work on it
        assert (await BACKEND.one(conn, {}))["pid"] == pids[0]

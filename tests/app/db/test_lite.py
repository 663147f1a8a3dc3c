"""`app.db.lite`: a SQLite transaction run whole in the link's thread, all or nothing.

Against a real database file migrated to head; what is checked is what the file holds
afterwards, read through the engine's own (aiosqlite) connections.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.lite import Lite, LiteLink, transaction
from app.db.models import inbox, session_keys
from app.pipeline.storage.inbox_queries import INSERT_VALUES
from tests.conftest import make_settings
from tests.support.db import sqlite_database

_INSERT_KEY = Lite(session_keys.insert().values(key=bindparam("k"), lease_fence=bindparam("f")))
_KEYS = Lite(select(session_keys.c.key, session_keys.c.lease_fence).order_by(session_keys.c.key))
_INSERT_EVENT = Lite(inbox.insert().values(INSERT_VALUES).returning(inbox.c.id, inbox.c.created_at))
_IN = Lite(select(session_keys.c.key).where(session_keys.c.key.in_(bindparam("ks", expanding=True))))


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[tuple[LiteLink, AsyncEngine]]:
    async with sqlite_database(tmp_path) as url:
        engine = create_engine(make_settings(url))
        link = LiteLink(str(tmp_path / "chatgate.db"))
        try:
            yield link, engine
        finally:
            await link.close()
            await engine.dispose()


async def _keys(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(session_keys.c.key).order_by(session_keys.c.key))).scalars())


async def test_a_failing_transaction_writes_nothing_and_the_link_goes_on(
    db: tuple[LiteLink, AsyncEngine],
) -> None:
    link, engine = db

    def two_then_fail(conn: sqlite3.Connection) -> None:
        _INSERT_KEY.count(conn, {"k": "a", "f": 1})
        _INSERT_KEY.count(conn, {"k": "b", "f": 1})
        raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError, match="changed my mind"):
        await link.run(transaction(two_then_fail))
    assert await _keys(engine) == []
    await link.run(transaction(lambda conn: _INSERT_KEY.count(conn, {"k": "c", "f": 1})))
    assert await _keys(engine) == ["c"]


async def test_a_database_error_is_sqlalchemys_and_rolls_back(db: tuple[LiteLink, AsyncEngine]) -> None:
    link, engine = db

    def twice(conn: sqlite3.Connection) -> None:
        _INSERT_KEY.count(conn, {"k": "x", "f": 1})
        _INSERT_KEY.count(conn, {"k": "x", "f": 2})  # the primary key again

    with pytest.raises(IntegrityError):
        await link.run(transaction(twice))
    assert await _keys(engine) == []


async def test_values_are_written_and_read_as_sqlalchemy_does(db: tuple[LiteLink, AsyncEngine]) -> None:
    link, engine = db
    now = datetime(2026, 12, 7, 8, 30, 15, 123456, tzinfo=UTC)
    values = {
        "event_id": "e1",
        "channel": "webhook",
        "external_id": None,
        "session_key": "webhook:chat",
        "payload": {"text": "héllo", "n": [1, 2]},
        "status": "pending",
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "trace_context": None,
    }
    [row] = await link.run(transaction(lambda conn: _INSERT_EVENT.rows(conn, values)))
    assert row["created_at"] == now  # a UTC datetime back, as the engine reads it
    async with engine.connect() as conn:
        stored = (
            await conn.execute(select(inbox.c.payload, inbox.c.created_at, inbox.c.trace_context))
        ).one()
    assert stored.payload == {"text": "héllo", "n": [1, 2]}
    assert stored.created_at == now
    assert stored.trace_context is None


async def test_a_list_parameter_matches_any_of_its_values(db: tuple[LiteLink, AsyncEngine]) -> None:
    link, _ = db

    def insert_and_ask(conn: sqlite3.Connection) -> list[str]:
        for key in ("a", "b", "c", "d"):
            _INSERT_KEY.count(conn, {"k": key, "f": 0})
        return [r["key"] for r in _IN.rows(conn, {"ks": ["d", "b", "zz"]})]

    assert sorted(await link.run(transaction(insert_and_ask))) == ["b", "d"]
    assert await link.run(lambda conn: _IN.rows(conn, {"ks": []})) == []


async def test_jobs_from_many_tasks_each_get_their_own_result_in_order(
    db: tuple[LiteLink, AsyncEngine],
) -> None:
    link, engine = db
    keys = [f"k{i:03d}" for i in range(200)]
    order: list[str] = []

    def insert(key: str) -> Callable[[sqlite3.Connection], str]:
        def work(conn: sqlite3.Connection) -> str:
            _INSERT_KEY.count(conn, {"k": key, "f": int(key[1:])})
            order.append(key)
            return key

        return transaction(work)

    results = await asyncio.gather(*(link.run(insert(key)) for key in keys))
    assert results == keys
    assert order == keys  # queued in this order, run in this order
    rows = await link.run(lambda conn: _KEYS.rows(conn, {}))
    assert [(r["key"], r["lease_fence"]) for r in rows] == [(k, int(k[1:])) for k in keys]
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(session_keys))).scalar() == 200


async def test_a_waiter_cancelled_does_not_stop_the_others(db: tuple[LiteLink, AsyncEngine]) -> None:
    link, engine = db
    gate = threading.Event()

    def held(conn: sqlite3.Connection) -> None:
        gate.wait(10)

    first = asyncio.ensure_future(link.run(held))
    cancelled = asyncio.ensure_future(
        link.run(transaction(lambda c: _INSERT_KEY.count(c, {"k": "gone", "f": 0})))
    )
    kept = asyncio.ensure_future(link.run(transaction(lambda c: _INSERT_KEY.count(c, {"k": "kept", "f": 0}))))
    await asyncio.sleep(0)
    cancelled.cancel()
    gate.set()
    await first
    assert await kept == 1
    assert cancelled.cancelled()
    # A job whose waiter was cancelled before it ran is skipped.
    assert await _keys(engine) == ["kept"]


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chatgate-sqlite"]


async def test_close_ends_the_thread_and_a_later_run_starts_a_new_one(tmp_path: Path) -> None:
    async with sqlite_database(tmp_path):
        before = set(_threads())
        link = LiteLink(str(tmp_path / "chatgate.db"))
        assert await link.run(lambda conn: conn.execute("SELECT 1").fetchone()[0]) == 1
        [thread] = set(_threads()) - before
        await link.close()
        assert not thread.is_alive()
        assert await link.run(lambda conn: conn.execute("SELECT 2").fetchone()[0]) == 2
        await link.close()
        assert set(_threads()) - before == set()

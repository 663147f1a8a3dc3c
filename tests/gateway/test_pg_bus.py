"""The PostgreSQL session bus between two replicas (two bus instances, one database).

The database is migrated: a bus marks the keys it LISTENs for in `session_keys`.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import asyncpg
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import session_keys, utcnow
from app.events import InboundEvent
from app.pg_bus import PgSessionBus, channel_for
from tests.conftest import ServeApp
from tests.support.pg_probe import asyncpg_dsn


async def _next(queue: asyncio.Queue[dict[str, Any]], timeout: float = 5.0) -> dict[str, Any]:
    return await asyncio.wait_for(queue.get(), timeout)


async def test_events_cross_replicas_in_order_big_ones_too(pg_url: str, pg_engine: AsyncEngine) -> None:
    a, b = PgSessionBus(pg_url), PgSessionBus(pg_url)
    await a.start()
    await b.start()
    try:
        async with (
            a.subscribe("web:k") as on_a,
            b.subscribe("web:k") as on_b,
            b.subscribe("web:other") as other,
        ):
            big = secrets.token_urlsafe(40_000)  # far over NOTIFY's 8000-byte payload limit
            events = [{"type": "delta", "i": i, "text": big if i % 10 == 3 else "ü" * i} for i in range(40)]
            for event in events:
                await a.publish("web:k", event)
            assert [await _next(on_b) for _ in events] == events
            # The publishing replica's own subscribers get each event once, not twice.
            assert [await _next(on_a) for _ in events] == events
            await a.publish("web:k", {"type": "delta", "i": "last"})
            assert (await _next(on_b))["i"] == "last"
            assert (await _next(on_a))["i"] == "last"
            assert on_a.empty() and other.empty()
            # And back the other way.
            await b.publish("web:k", {"type": "message", "seq": 1})
            assert await _next(on_a) == {"type": "message", "seq": 1}
    finally:
        await a.stop()
        await b.stop()


async def test_lost_listener_reconnects_and_asks_for_a_resync(pg_url: str, pg_engine: AsyncEngine) -> None:
    a, b = PgSessionBus(pg_url, reconnect_delay=0.1), PgSessionBus(pg_url, reconnect_delay=0.1)
    await a.start()
    await b.start()
    try:
        async with b.subscribe("web:k") as on_b:
            assert b._listen_conn is not None
            pid = b._listen_conn.get_server_pid()
            admin = await asyncpg.connect(asyncpg_dsn(pg_url))
            try:
                await admin.execute("SELECT pg_terminate_backend($1)", pid)
            finally:
                await admin.close()
            marker = await _next(on_b)
            assert marker == {"type": "resync", "session_key": "web:k"}
            await a.publish("web:k", {"type": "delta", "i": 1})
            assert await _next(on_b) == {"type": "delta", "i": 1}
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_turns_notify_other_replicas_only_while_one_watches_the_key(serve: ServeApp) -> None:
    """Nobody watches: no NOTIFY at all. A replica subscribes: it gets the whole turn."""
    async with serve() as srv:
        key = "webhook:c"
        heard: list[str] = []
        eavesdropper = await asyncpg.connect(asyncpg_dsn(srv.runtime.settings.database_url))
        # LISTENs without marking the key watched, as no replica would: hears every NOTIFY.
        await eavesdropper.add_listener(channel_for(key), lambda *args: heard.append(args[-1]))
        replica = PgSessionBus(srv.runtime.settings.database_url)
        await replica.start()
        try:
            runtime = srv.runtime
            [first] = await runtime.ingest.submit([InboundEvent.from_text("webhook", "c", "u", "hello")])
            assert (await runtime.waiters.wait_for_replies(first.event_id, 10)).done
            await asyncio.sleep(0.3)  # a NOTIFY would be on its way by now
            assert heard == []
            async with replica.subscribe(key) as watching:
                async with srv.runtime.engine.connect() as conn:
                    until = (
                        await conn.execute(
                            select(session_keys.c.watched_until).where(session_keys.c.key == key)
                        )
                    ).scalar_one()
                assert until is not None and until > utcnow()
                [second] = await runtime.ingest.submit([InboundEvent.from_text("webhook", "c", "u", "again")])
                assert (await runtime.waiters.wait_for_replies(second.event_id, 10)).done
                seen = [await _next(watching)]
                while not (seen[-1]["type"] == "message" and seen[-1]["role"] == "assistant"):
                    seen.append(await _next(watching))
            # The offline model streams its answer in pieces: one delta or more.
            kinds = [e["type"] for e in seen]
            assert kinds[0] == kinds[-1] == "message" and set(kinds[1:-1]) == {"delta"}, kinds
            assert (seen[0]["role"], seen[0]["content"]) == ("user", "again")
            assert seen[-1]["seq"] == seen[0]["seq"] + 1
            assert "".join(e["text"] for e in seen[1:-1]) == seen[-1]["content"]
            # The eavesdropper's connection hears them on its own time: wait for the last one.
            for _ in range(100):
                if len(heard) >= len(seen):
                    break
                await asyncio.sleep(0.05)
            assert len(heard) == len(seen)
        finally:
            await replica.stop()
            await eavesdropper.close()


async def test_marking_a_key_watched_waits_for_a_statement_holding_its_row(
    pg_url: str, pg_engine: AsyncEngine
) -> None:
    """A turn's fenced statement locks the key's row: subscribing is ordered with it.

    So either the statement sees the mark (and NOTIFYs), or the subscriber reads the
    history only after the statement committed (see `app.pg_bus`).
    """
    bus = PgSessionBus(pg_url)
    await bus.start()
    holder = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await holder.execute("INSERT INTO session_keys (key, lease_fence) VALUES ('web:k', 1)")
        tx = holder.transaction()
        await tx.start()
        await holder.execute("UPDATE session_keys SET lease_fence = lease_fence WHERE key = 'web:k'")
        async with asyncio.timeout(10):
            subscribing = asyncio.create_task(_subscribed(bus, "web:k"))
            await asyncio.sleep(0.5)
            assert not subscribing.done()  # waiting for the row
            await tx.commit()
            assert await subscribing
    finally:
        await holder.close()
        await bus.stop()


async def _subscribed(bus: PgSessionBus, key: str) -> bool:
    async with bus.subscribe(key):
        return True

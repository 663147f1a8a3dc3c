"""The PostgreSQL session bus between two replicas (two bus instances, one database)."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import asyncpg

from app.gateway.pg_bus import PgSessionBus, asyncpg_dsn


async def _next(queue: asyncio.Queue[dict[str, Any]], timeout: float = 5.0) -> dict[str, Any]:
    return await asyncio.wait_for(queue.get(), timeout)


async def test_events_cross_replicas_in_order_big_ones_too(pg_url: str) -> None:
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


async def test_lost_listener_reconnects_and_asks_for_a_resync(pg_url: str) -> None:
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

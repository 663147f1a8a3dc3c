"""Two server processes on one PostgreSQL share one DingTalk Stream connection.

Exactly one holds the Stream at a time; after a SIGKILL of the holder the other opens
the Stream within the lease TTL, DingTalk pushes again what was never ACKed, every
message is stored once and answered. A reply the holder was sending as it died may be
sent again by the survivor (the outbox delivers at least once; DingTalk's robot API has
no idempotency key), so only the messages pushed just before the kill may be answered
twice; all others are answered exactly once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.connection_leases import list_holds
from app.db.models import inbox, outbox
from tests.conftest import ADMIN_TOKEN
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk
from tests.support.servers import start_together, stop_all
from tests.support.timing import scaled

# serial: replicas take over within a lease TTL: timing that a loaded machine upsets.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.long]  # ~50 s

TTL = 3.0


def _env(db_url: str, fake: FakeDingTalk, worker: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "dingtalk",
        "WORKER_ID": worker,
        "CONNECTION_LEASE_TTL_SECONDS": str(TTL),
        # The keys a killed replica leased are free after TTL too, not the default 30 s.
        "LEASE_TTL_SECONDS": str(TTL),
        "DINGTALK_CLIENT_ID": fake.client_id,
        "DINGTALK_CLIENT_SECRET": fake.client_secret,
        "DINGTALK_API_BASE": fake.url,
        "DINGTALK_MODE": "stream",
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def _owner(engine: AsyncEngine) -> str | None:
    holds = await list_holds(engine)
    return holds[0].owner if holds else None


async def _wait_sent(engine: AsyncEngine, count: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            sent = (
                await conn.execute(select(func.count()).select_from(outbox).where(outbox.c.status == "sent"))
            ).scalar_one()
        if sent >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} replies recorded as sent")


def _texts(fake: FakeDingTalk) -> list[str]:
    return [json.loads(c.body["msgParam"])["content"] for c in fake.delivered()]


async def test_one_replica_holds_the_stream_and_the_other_takes_it_over_after_sigkill(pg_url: str) -> None:
    async with FakeDingTalk(redeliver_unacked=True) as fake:
        servers = await start_together(
            {name: _env(pg_url, fake, name) for name in ("replica-a", "replica-b")}
        )
        engine = create_async_engine(pg_url)
        try:
            await fake.wait_for_socket(timeout=30)
            await asyncio.sleep(0.5)
            assert fake.connected == 1  # one Stream, not one per replica
            owner = await _owner(engine)
            assert owner in servers
            survivor = next(name for name in servers if name != owner)
            for i in range(3):
                await fake.wait_for_ack(await fake.push_callback(dt.robot_message(f"before {i}")))
            await fake.wait_for_delivered(3, timeout=30)
            await _wait_sent(engine, 3)  # no reply of these is in flight when the holder dies

            # Pushed as the holder dies (maybe stored, maybe not ACKed), then while nobody holds it.
            for i in range(3):
                await fake.push_callback(dt.robot_message(f"around {i}"))
            servers[owner].kill()
            killed_at = time.monotonic()
            for i in range(3):
                await fake.push_callback(dt.robot_message(f"during {i}"))
            await fake.wait_for(lambda: len(fake.tickets_used) == 2 and fake.connected == 1, timeout=TTL + 10)
            took = time.monotonic() - killed_at
            assert took <= TTL + 3, f"the survivor opened the Stream after {took:.1f} s"
            assert await _owner(engine) == survivor
            [hold] = await list_holds(engine)
            assert hold.takeovers == 1
            for i in range(3):
                await fake.wait_for_ack(await fake.push_callback(dt.robot_message(f"after {i}")))
            await fake.wait_for_delivered(12, timeout=30)
            await asyncio.sleep(1.0)  # a duplicate answer would arrive now
            async with engine.connect() as conn:
                stored = [r[0]["parts"][0]["text"] for r in await conn.execute(select(inbox.c.payload))]
        finally:
            await stop_all(*servers.values())
            await engine.dispose()
    words = ("before", "around", "during", "after")
    assert Counter(stored) == Counter(f"{w} {i}" for w in words for i in range(3))  # each once
    answered = Counter(_texts(fake))
    for word in words:
        for i in range(3):
            times = answered[f"You said: {word} {i}"]
            assert times == 1 or (word == "around" and times == 2), (word, i, times)
    assert len(answered) == 12

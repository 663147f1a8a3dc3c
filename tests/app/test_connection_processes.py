"""Two server processes on one PostgreSQL share one Telegram long-polling connection.

Exactly one polls at a time; after a SIGKILL of the owner the other takes the connection
over within the lease TTL, and every update is answered exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.connection_leases import list_holds
from app.db.models import inbox
from tests.conftest import ADMIN_TOKEN
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram
from tests.support.servers import ServerProcess, start_together, stop_all
from tests.support.timing import scaled

# serial: replicas take over within a lease TTL: timing that a loaded machine upsets.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.long]  # ~35 s each

TTL = 3.0


def _env(db_url: str, fake: FakeTelegram, worker: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "telegram",
        "WORKER_ID": worker,
        "CONNECTION_LEASE_TTL_SECONDS": str(TTL),
        # The keys a killed replica leased are free after TTL too, not the default 30 s.
        "LEASE_TTL_SECONDS": str(TTL),
        "TELEGRAM_BOT_TOKEN": fake.token,
        "TELEGRAM_MODE": "polling",
        "TELEGRAM_API_BASE_URL": fake.url,
        "TELEGRAM_FILE_BASE_URL": fake.file_url,
        "TELEGRAM_POLLING_TIMEOUT_SECONDS": "1",
        "TELEGRAM_POLLING_RETRY_SECONDS": "0.2",
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def _owner(engine: AsyncEngine) -> str | None:
    holds = await list_holds(engine)
    return holds[0].owner if holds else None


async def _wait_owner(engine: AsyncEngine, expected: str, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await _owner(engine) == expected:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"{expected} did not take the connection within {timeout} s")


async def _channel_connections(client: httpx.AsyncClient, server: ServerProcess) -> list[dict]:
    resp = await client.get(
        f"{server.url}/admin/api/channels", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert resp.status_code == 200
    [telegram] = [c for c in resp.json()["channels"] if c["name"] == "telegram"]
    return list(telegram["connections"])


async def test_one_replica_polls_and_the_other_takes_over_after_sigkill(pg_url: str) -> None:
    async with FakeTelegram() as fake:
        servers = await start_together(
            {name: _env(pg_url, fake, name) for name in ("replica-a", "replica-b")}
        )
        engine = create_async_engine(pg_url)
        try:
            for i in range(5):
                await fake.push_update(tg.update(100 + i, tg.message(f"before {i}")))
            await fake.wait_for("sendMessage", 5, timeout=30)
            owner = await _owner(engine)
            assert owner in servers
            survivor = next(name for name in servers if name != owner)
            async with httpx.AsyncClient(timeout=10) as client:
                views = {name: await _channel_connections(client, srv) for name, srv in servers.items()}
                metrics = (await client.get(f"{servers[owner].url}/metrics")).text
            for name, [view] in views.items():
                assert view["owner"] == owner
                assert view["held_here"] == (name == owner)
            assert f'chatgate_connection_held{{connection="{view["name"]}",owner="{owner}"}} 1.0' in metrics

            # Updates the owner may have read but not confirmed, then the owner dies.
            for i in range(5):
                await fake.push_update(tg.update(200 + i, tg.message(f"around {i}")))
            servers[owner].kill()
            for i in range(5):
                await fake.push_update(tg.update(300 + i, tg.message(f"after {i}")))
            took = await _wait_owner(engine, survivor, timeout=TTL + 5)
            assert took <= TTL + 2, f"took over after {took:.1f} s"
            await fake.wait_for("sendMessage", 15, timeout=30)
            await asyncio.sleep(1.0)  # a duplicate answer would arrive now
            async with httpx.AsyncClient(timeout=10) as client:
                [view] = await _channel_connections(client, servers[survivor])
                metrics = (await client.get(f"{servers[survivor].url}/metrics")).text
            assert view["owner"] == survivor and view["held_here"] and view["takeovers"] == 1
            assert f'chatgate_connection_takeovers_total{{connection="{view["name"]}"}} 1.0' in metrics
            async with engine.connect() as conn:
                stored = (await conn.execute(select(func.count()).select_from(inbox))).scalar_one()
        finally:
            await stop_all(*servers.values())
            await engine.dispose()
    texts = [f"before {i}" for i in range(5)] + [f"{w} {i}" for w in ("around", "after") for i in range(5)]
    assert Counter(fake.sent_texts()) == Counter(f"You said: {t}" for t in texts)  # each exactly once
    assert stored == 15
    assert fake.most_polls_in_flight == 1  # never two pollers at once


async def test_sigterm_hands_the_poll_over_at_once_and_never_two_poll_together(pg_url: str) -> None:
    """A rolling restart of the polling replica: its poll in flight ends before it lets go
    (a long poll a client abandoned stays open at Telegram), the other replica polls next
    from the committed offset, well before the lease TTL; every update answered once."""
    ttl = 30.0  # long: a hand-over that waited for the expiry would take 30 s
    async with FakeTelegram() as fake:
        env = {
            name: {
                **_env(pg_url, fake, name),
                "CONNECTION_LEASE_TTL_SECONDS": str(ttl),
                "TELEGRAM_POLLING_TIMEOUT_SECONDS": "2",
                # A failure's report shows each replica's hold, hand-over and release.
                "LOG_LEVEL": "INFO",
            }
            for name in ("replica-a", "replica-b")
        }
        # Started off the event loop: the fake Telegram answers their getMe meanwhile.
        started = await asyncio.gather(*(asyncio.to_thread(ServerProcess(env[n]).start) for n in env))
        servers = dict(zip(env, started, strict=True))
        engine = create_async_engine(pg_url)
        try:
            for i in range(5):
                await fake.push_update(tg.update(100 + i, tg.message(f"before {i}")))
            await fake.wait_for("sendMessage", 5, timeout=30)
            owner = await _owner(engine)
            assert owner in servers
            survivor = next(name for name in servers if name != owner)
            await asyncio.sleep(0.5)  # the owner is in the middle of a long poll now
            servers[owner].terminate()
            took = await _wait_owner(engine, survivor, timeout=ttl)
            for i in range(5):
                await fake.push_update(tg.update(200 + i, tg.message(f"after {i}")))
            status = await asyncio.to_thread(servers[owner].wait, 20)
            await fake.wait_for("sendMessage", 10, timeout=30)
            await asyncio.sleep(1.0)  # a duplicate answer would arrive now
            [hold] = await list_holds(engine)
        finally:
            await stop_all(*servers.values())
            await engine.dispose()
    assert status == 0
    # The poll in flight ends within 2 s; the release and the survivor's next look (each
    # second) follow, in up to 2 s on a quiet machine. Far below the 30 s of an expiry.
    assert took < 2 + scaled(2), f"handed over after {took:.1f} s (the poll in flight ends within 2 s)"
    assert hold.takeovers == 0  # released, not expired
    texts = [f"{w} {i}" for w in ("before", "after") for i in range(5)]
    assert Counter(fake.sent_texts()) == Counter(f"You said: {t}" for t in texts)
    assert fake.most_polls_in_flight == 1  # never two pollers at once
    # The new holder went on from the offset the old one committed, not from the start.
    offsets = [int(c.params.get("offset", 0)) for c in fake.calls_of("getUpdates")]
    committed = offsets.index(105)
    assert min(offsets[committed:]) >= 105, offsets

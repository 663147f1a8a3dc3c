"""Two server processes on one PostgreSQL: one Gateway session; SIGKILL of its holder → the
other RESUMEs the saved session, and what was sent during the gap is answered once."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.connection_leases import list_holds
from tests.conftest import ADMIN_TOKEN
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.support.servers import start_together, stop_all

# serial: replicas take over within a lease TTL: timing that a loaded machine upsets.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TTL = 3.0


def _env(db_url: str, fake: FakeDiscord, worker: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "discord",
        "WORKER_ID": worker,
        "CONNECTION_LEASE_TTL_SECONDS": str(TTL),
        # The keys a killed replica leased are free after TTL too, not the default 30 s.
        "LEASE_TTL_SECONDS": str(TTL),
        "DISCORD_BOT_TOKEN": dc.TOKEN,
        "DISCORD_API_BASE": fake.url,
        "DISCORD_GATEWAY_URL": fake.gateway_url,
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def test_one_replica_holds_the_gateway_and_the_other_takes_it_over(pg_url: str) -> None:
    async with FakeDiscord() as fake:
        servers = await start_together(
            {name: _env(pg_url, fake, name) for name in ("replica-a", "replica-b")}
        )
        engine = create_async_engine(pg_url)
        try:
            await fake.wait_until(lambda: len(fake.identifies) == 1, timeout=30)
            [hold] = await list_holds(engine)
            owner = hold.owner
            assert owner in servers
            survivor = next(name for name in servers if name != owner)
            for i in range(3):
                await fake.dispatch("MESSAGE_CREATE", dc.message(f"before {i}", channel_id="2100"))
            await fake.wait_for_messages(3, timeout=30)

            servers[owner].kill()
            killed_at = time.monotonic()
            # Sent while nobody holds the Gateway: Discord keeps them for a RESUME.
            for i in range(3):
                await fake.dispatch("MESSAGE_CREATE", dc.message(f"during {i}", channel_id="2100"))
            await fake.wait_until(lambda: len(fake.resumes) == 1, timeout=TTL + 10)
            took = time.monotonic() - killed_at
            assert took <= TTL + 3, f"resumed after {took:.1f} s"
            [resume] = fake.resumes
            assert resume["session_id"] == fake.session_id == "session-1"  # no new IDENTIFY
            assert len(fake.identifies) == 1
            assert fake.replayed >= 3
            [hold] = await list_holds(engine)
            assert (hold.owner, hold.takeovers) == (survivor, 1)
            await fake.wait_for_messages(6, timeout=30)
            for i in range(3):
                await fake.dispatch("MESSAGE_CREATE", dc.message(f"after {i}", channel_id="2100"))
            await fake.wait_for_messages(9, timeout=30)
        finally:
            await stop_all(*servers.values())
            await engine.dispose()
    texts = [f"You said: {w} {i}" for w in ("before", "during", "after") for i in range(3)]
    assert Counter(c.body["content"] for c in fake.messages()) == Counter(texts)  # each once
    assert fake.most_sessions == 1  # never two Gateway sessions at once

"""Two server processes on one PostgreSQL: one long poll; SIGKILL of its holder → the other
resumes from the cursor saved in the lease row: nothing lost, nothing answered twice."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.connection_leases import list_holds
from tests.channels.weixin.support import saved_cursor
from tests.conftest import ADMIN_TOKEN
from tests.fakes import weixin as wx
from tests.fakes.weixin import FakeILink
from tests.support.servers import start_together, stop_all

# serial: replicas take over within a lease TTL: timing that a loaded machine upsets.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TTL = 3.0


def _env(db_url: str, fake: FakeILink, worker: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "weixin",
        "WORKER_ID": worker,
        "CONNECTION_LEASE_TTL_SECONDS": str(TTL),
        # The keys a killed replica leased are free after TTL too, not the default 30 s.
        "LEASE_TTL_SECONDS": str(TTL),
        "WEIXIN_BOT_TOKEN": wx.TOKEN,
        "WEIXIN_API_BASE_URL": fake.url,
        "WEIXIN_CDN_BASE_URL": fake.cdn_url,
        "WEIXIN_POLL_RETRY_SECONDS": "0.2",
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def test_one_replica_polls_and_the_other_resumes_from_its_cursor(pg_url: str) -> None:
    async with FakeILink(hold_seconds=1.0) as fake:
        servers = await start_together(
            {name: _env(pg_url, fake, name) for name in ("replica-a", "replica-b")}
        )
        engine = create_async_engine(pg_url)
        try:
            await fake.wait_for("getupdates", 1, timeout=30)
            for i in range(3):
                await fake.push(wx.text_message(f"before {i}"))
            await fake.wait_until(lambda: len(fake.sent()) >= 3, timeout=30)
            [hold] = await list_holds(engine)
            owner = hold.owner
            assert owner in servers
            survivor = next(name for name in servers if name != owner)
            cursor = await saved_cursor(engine)
            assert cursor is not None and wx.decode_cursor(cursor) == 3

            polls_before = len(fake.calls_of("getupdates"))
            servers[owner].kill()
            killed_at = time.monotonic()
            for i in range(3):  # sent while nobody polls: iLink keeps them for the cursor
                await fake.push(wx.text_message(f"during {i}"))
            await fake.wait_until(lambda: len(fake.sent()) >= 6, timeout=TTL + 20)
            took = time.monotonic() - killed_at
            assert took <= TTL + 10, f"answered after {took:.1f} s"
            [hold] = await list_holds(engine)
            assert (hold.owner, hold.takeovers) == (survivor, 1)
            # The survivor went on from the saved cursor, not from the start.
            resumed = fake.calls_of("getupdates")[polls_before:]
            assert resumed and all(wx.decode_cursor(c.body["get_updates_buf"]) >= 3 for c in resumed)

            for i in range(3):
                await fake.push(wx.text_message(f"after {i}"))
            await fake.wait_until(lambda: len(fake.sent()) >= 9, timeout=30)
        finally:
            await stop_all(*servers.values())
            await engine.dispose()
    texts = [f"You said: {w} {i}" for w in ("before", "during", "after") for i in range(3)]
    assert Counter(fake.sent_texts()) == Counter(texts)  # each once
    assert fake.most_polls_in_flight == 1  # never two pollers at once

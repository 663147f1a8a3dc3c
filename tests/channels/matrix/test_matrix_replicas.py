"""Two server processes on one PostgreSQL and one Synapse: one /sync; SIGKILL of its holder →
the other resumes from the `next_batch` saved in the lease row: nothing lost, nothing
answered twice."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from app.connection_leases import list_holds
from app.db.models import outbox
from tests.channels.matrix.support import MatrixAccounts, saved_next_batch, wait_synced
from tests.conftest import ADMIN_TOKEN
from tests.support.servers import start_together, stop_all

# serial: replicas take over within a lease TTL: timing that a loaded machine upsets.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TTL = 3.0


def _env(db_url: str, matrix: MatrixAccounts, worker: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "matrix",
        "WORKER_ID": worker,
        "CONNECTION_LEASE_TTL_SECONDS": str(TTL),
        # The keys a killed replica leased are free after TTL too, not the default 30 s.
        "LEASE_TTL_SECONDS": str(TTL),
        "MATRIX_HOMESERVER_URL": matrix.synapse.url,
        "MATRIX_ACCESS_TOKEN": matrix.bot_token,
        "MATRIX_STREAMING": "off",
        "MATRIX_SYNC_TIMEOUT_SECONDS": "1",
        "MATRIX_SYNC_RETRY_SECONDS": "0.2",
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def test_one_replica_syncs_and_the_other_resumes_from_its_next_batch(
    pg_url: str, matrix: MatrixAccounts
) -> None:
    servers = await start_together({name: _env(pg_url, matrix, name) for name in ("replica-a", "replica-b")})
    engine = create_async_engine(pg_url)
    try:
        await wait_synced(engine)
        room = await matrix.room_with_bot()
        for i in range(3):
            await matrix.human.say(room, f"before {i}")
        await matrix.wait_answers(room, 3)
        [hold] = await list_holds(engine)
        owner = hold.owner
        assert owner in servers
        survivor = next(name for name in servers if name != owner)
        token = await saved_next_batch(engine)

        servers[owner].kill()
        killed_at = time.monotonic()
        for i in range(3):  # sent while nobody syncs: the homeserver keeps them for the token
            await matrix.human.say(room, f"during {i}")
        await matrix.wait_answers(room, 6, timeout=TTL + 25)
        took = time.monotonic() - killed_at
        assert took <= TTL + 15, f"answered after {took:.1f} s"
        [hold] = await list_holds(engine)
        assert (hold.owner, hold.takeovers) == (survivor, 1)
        assert await saved_next_batch(engine) != token  # the survivor went on from there

        for i in range(3):
            await matrix.human.say(room, f"after {i}")
        await matrix.wait_answers(room, 9)
        answers = await matrix.answers(room)
        async with engine.connect() as conn:
            sent = (await conn.execute(select(func.count()).select_from(outbox))).scalar_one()
    finally:
        await stop_all(*servers.values())
        await engine.dispose()
    texts = [f"You said: {w} {i}" for w in ("before", "during", "after") for i in range(3)]
    assert Counter(answers) == Counter(texts)  # each once
    assert sent == 9  # and no second answer waiting in the outbox

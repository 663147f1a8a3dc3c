"""Two server processes on one PostgreSQL and one Dovecot mailbox: one IMAP holder; SIGKILL
of it → the other resumes from the UID saved in the lease row: nothing lost, nothing
answered twice."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.connection_leases import list_holds
from tests.channels.email.support import email_env, mail, message_id_of, saved_position
from tests.conftest import ADMIN_TOKEN
from tests.fakes.smtp_sink import SmtpSink
from tests.support.dovecot import Dovecot
from tests.support.servers import start_together, stop_all
from tests.support.timing import eventually

# serial: replicas take over within a lease TTL: timing that a loaded machine upsets.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TTL = 3.0


def _env(db_url: str, imap: Dovecot, bot: str, smtp: SmtpSink, worker: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "email",
        "WORKER_ID": worker,
        "CONNECTION_LEASE_TTL_SECONDS": str(TTL),
        # The keys a killed replica leased are free after TTL too, not the default 30 s.
        "LEASE_TTL_SECONDS": str(TTL),
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
        **email_env(imap, bot, smtp),
    }


async def test_one_replica_holds_the_mailbox_and_the_other_resumes_from_its_uid(
    pg_url: str, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    asked: list[str] = []

    async def deliver(text: str) -> None:
        message = mail(bot, text, subject=f"About {text}")
        asked.append(message_id_of(message))
        await imap_server.append(bot, message.as_bytes())

    servers = await start_together(
        {name: _env(pg_url, imap_server, bot, smtp, name) for name in ("replica-a", "replica-b")}
    )
    engine = create_async_engine(pg_url)
    try:
        for i in range(3):
            await deliver(f"before {i}")
        await smtp.wait_for(3, timeout=30)
        [hold] = await list_holds(engine)
        owner = hold.owner
        assert owner in servers
        survivor = next(name for name in servers if name != owner)
        state = await saved_position(engine)
        assert state is not None and state["last_uid"] == 3 and state["uidvalidity"] > 0

        servers[owner].kill()
        killed_at = time.monotonic()
        for i in range(3):  # delivered while nobody holds the mailbox: kept there for the next
            await deliver(f"during {i}")
        await smtp.wait_for(6, timeout=TTL + 20)
        took = time.monotonic() - killed_at
        assert took <= TTL + 10, f"answered after {took:.1f} s"
        [hold] = await list_holds(engine)
        assert (hold.owner, hold.takeovers) == (survivor, 1)

        for i in range(3):
            await deliver(f"after {i}")
        await smtp.wait_for(9, timeout=30)

        async def saved_nine() -> bool:
            return ((await saved_position(engine)) or {}).get("last_uid") == 9

        await eventually(saved_nine, 10)
    finally:
        await stop_all(*servers.values())
        await engine.dispose()
    answered = Counter(str(r.message["In-Reply-To"]).strip("<>") for r in smtp.received)
    assert answered == Counter(asked)  # each mail answered, once

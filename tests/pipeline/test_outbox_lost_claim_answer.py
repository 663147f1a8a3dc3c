"""A claim whose commit reached the database but whose answer was lost (issue 30): the
sender that made it takes the row again at its next poll, not after OUTBOX_CLAIM_SECONDS;
another replica still waits for the claim's deadline. The answer is lost for real: a TCP
proxy between chatgate and PostgreSQL drops the connection that carries it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.db.models import outbox, utcnow
from app.events import InboundEvent
from app.pipeline.replies import outbox_values, reply_for
from app.pipeline.storage.port import OutboxClaim
from tests.conftest import make_settings, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.support.servers import RunningApp, serve_in_loop
from tests.support.tcp_proxy import TcpProxy, tcp_proxy, via_proxy
from tests.support.timing import eventually

CLAIM_SECONDS = 60
MARKER = "answer-whose-claim-answer-is-lost"


@contextlib.asynccontextmanager
async def one_reply_whose_claim_answer_is_lost(
    pg_url: str, pg_engine: AsyncEngine, *, test_drives_sender: bool
) -> AsyncIterator[tuple[RunningApp, TcpProxy, HttpReceiver]]:
    """A served app behind a proxy that loses the claim's answer, and one reply in the outbox.

    With `test_drives_sender` the loops poll once a minute: the test calls `deliver_due`."""
    polls = {"outbox_poll_seconds": 60, "inbox_poll_seconds": 60} if test_drives_sender else {}
    async with tcp_proxy("127.0.0.1", 5432) as proxy, HttpReceiver() as receiver:
        settings = make_settings(
            via_proxy(pg_url, proxy),
            bus_database_url=pg_url,
            **{"outbox_poll_seconds": 0.2, **polls},
            outbox_claim_seconds=CLAIM_SECONDS,
            lease_ttl_seconds=CLAIM_SECONDS,
            db_connect_timeout_seconds=2,
        )
        app = create_app(settings, channel_settings={"webhook": webhook_settings(callback_url=receiver.url)})
        async with serve_in_loop(app) as srv:
            # The claim's answer (its RETURNING row holds the reply) never reaches chatgate.
            proxy.lose_reply_with(MARKER.encode())
            reply = reply_for(InboundEvent.from_text("webhook", "c1", "u", "hi"), MARKER)
            async with pg_engine.begin() as conn:
                await conn.execute(
                    outbox.insert(), outbox_values(reply, session_id=None, run_id=None, event_id=None)
                )
            yield srv, proxy, receiver


async def test_a_claim_whose_answer_was_lost_is_resumed_at_once_by_its_sender(
    pg_url: str, pg_engine: AsyncEngine
) -> None:
    async with one_reply_whose_claim_answer_is_lost(pg_url, pg_engine, test_drives_sender=False) as (
        srv,
        proxy,
        receiver,
    ):
        sender = srv.runtime.sender
        started = time.monotonic()
        sender.notify()
        await eventually(lambda: proxy.lost_replies == 1, timeout=10)
        await receiver.wait_for(1)
        waited = time.monotonic() - started
        assert waited < 10, f"sent after {waited:.1f}s: the claim's {CLAIM_SECONDS}s were waited"

        async def recorded() -> bool:
            async with pg_engine.connect() as conn:
                status = (await conn.execute(select(outbox.c.status))).scalar_one()
            return bool(status == "sent")

        await eventually(recorded, timeout=10)
        async with pg_engine.connect() as conn:
            [row] = (await conn.execute(select(outbox.c.attempts, outbox.c.claimed_by))).all()
        # Two claims committed (the lost one and the resumed one), one delivery.
        assert (row.attempts, row.claimed_by) == (2, srv.runtime.owner)
        assert len(receiver.received) == 1
        assert MARKER in str(receiver.received[0])


async def test_the_lost_claim_is_only_its_owners_before_the_deadline(
    pg_url: str, pg_engine: AsyncEngine
) -> None:
    """The same drop, seen from another replica: it waits for the claim's deadline."""
    async with one_reply_whose_claim_answer_is_lost(pg_url, pg_engine, test_drives_sender=True) as (
        srv,
        proxy,
        receiver,
    ):
        sender, store = srv.runtime.sender, srv.runtime.store
        try:
            await sender.deliver_due()
        except Exception:  # the connection dropped under the claim: the sender's loop logs it
            pass
        else:
            raise AssertionError("the claim's answer was not lost")
        assert proxy.lost_replies == 1 and receiver.received == []
        async with pg_engine.connect() as conn:
            [row] = (await conn.execute(select(outbox.c.status, outbox.c.claimed_by))).all()
        assert (row.status, row.claimed_by) == ("sending", srv.runtime.owner)  # it committed
        now = utcnow()
        other = OutboxClaim(("webhook",), now, now + timedelta(seconds=30), 10, owner="another-replica")
        assert await store.claim_outbox(other) == []
        assert await sender.deliver_due() == 1  # its own: at once
        await receiver.wait_for(1)
        assert len(receiver.received) == 1


async def test_a_stopping_sender_releases_a_claim_whose_answer_it_lost(
    pg_url: str, pg_engine: AsyncEngine
) -> None:
    """SIGTERM is a hand-over: the lost claim is due again for any replica at once."""
    async with one_reply_whose_claim_answer_is_lost(pg_url, pg_engine, test_drives_sender=True) as (
        srv,
        proxy,
        receiver,
    ):
        with contextlib.suppress(Exception):
            await srv.runtime.sender.deliver_due()
        assert proxy.lost_replies == 1
    # Stopped: the hand-over gave the claim up.
    async with pg_engine.connect() as conn:
        [row] = (await conn.execute(select(outbox.c.status, outbox.c.claimed_until))).all()
    assert (row.status, row.claimed_until) == ("pending", None)
    assert receiver.received == []

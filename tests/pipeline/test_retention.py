"""Finished inbox/outbox rows are pruned after their retention; nothing else is touched."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox, messages, outbox, utcnow
from app.events import InboundEvent
from app.pipeline import retention
from app.pipeline.replies import outbox_values, reply_for
from app.sessions.messages import ChatMessage
from app.sessions.store import Lifecycle, SessionStore
from tests.conftest import ServeApp
from tests.support.pipeline import accept_elsewhere


async def _event(engine: AsyncEngine, n: int, status: str, age_days: float) -> str:
    """An inbox row already in `status` (never pending: no worker picks it up) and its reply."""
    event = InboundEvent.from_text("webhook", f"chat-{n}", "u", f"message {n}", external_id=f"ext-{n}")
    when = utcnow() - timedelta(days=age_days)
    async with engine.begin() as conn:
        await conn.execute(
            inbox.insert().values(
                event_id=event.event_id,
                channel=event.channel,
                external_id=event.external_id,
                session_key=event.session_key,
                payload=event.model_dump(mode="json"),
                status=status,
                attempts=1,
                created_at=when,
                updated_at=when,
            )
        )
        await conn.execute(
            outbox.insert(),
            outbox_values(reply_for(event, "reply"), session_id=None, run_id=None, event_id=event.event_id),
        )
        await conn.execute(
            update(outbox)
            .where(outbox.c.event_id == event.event_id)
            .values(
                status={"done": "sent", "failed": "failed", "discarded": "discarded"}.get(status, "pending"),
                created_at=when,
                next_attempt_at=when,
            )
        )
    return event.event_id


async def _count(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())  # type: ignore[arg-type]


async def test_only_finished_rows_older_than_the_retention_are_deleted(engine: AsyncEngine) -> None:

    store = SessionStore(engine, Lifecycle())
    async with engine.begin() as conn:
        session = await store.open_current(conn, "webhook:chat-0", "webhook")
        await store.append(conn, session.id, [ChatMessage(role="user", content="kept forever")])
    old_done = await _event(engine, 1, "done", 20)
    old_failed = await _event(engine, 2, "failed", 20)  # a dead letter nobody acted on: kept
    old_pending = await _event(engine, 3, "pending", 20)  # unfinished: never pruned
    recent_done = await _event(engine, 4, "done", 1)
    old_discarded = await _event(engine, 5, "discarded", 20)  # resolved by an operator

    counts = await retention.prune(engine, inbox_days=14, outbox_days=14, batch=1)  # batches of one
    assert counts == {"inbox": 2, "outbox": 2}
    async with engine.connect() as conn:
        left = set((await conn.execute(select(inbox.c.event_id))).scalars())
        replies = set((await conn.execute(select(outbox.c.event_id, outbox.c.status))).all())
    assert left == {old_failed, old_pending, recent_done}
    assert old_done not in left and old_discarded not in left
    assert {status for _, status in replies} == {"failed", "pending", "sent"}
    assert len(replies) == 3
    assert await _count(engine, messages) == 1  # history is never pruned

    # A redelivery of a kept event is still a duplicate; 0 days keeps everything.
    again = InboundEvent.from_text("webhook", "chat-4", "u", "message 4", external_id="ext-4")
    [dup] = await accept_elsewhere(engine, [again])
    assert dup.duplicate and dup.event_id == recent_done
    assert await retention.prune(engine, inbox_days=0, outbox_days=0, now=utcnow() + timedelta(days=365)) == {
        "inbox": 0,
        "outbox": 0,
    }
    assert await _count(engine, inbox) == 3


async def test_the_running_service_prunes_in_its_periodic_sweep(serve: ServeApp) -> None:
    async with serve(lifecycle_sweep_seconds=0.1, inbox_retention_days=1, outbox_retention_days=1) as srv:
        runtime = srv.runtime
        old = await _event(runtime.engine, 1, "done", 2)
        kept = await _event(runtime.engine, 2, "done", 0.5)
        for _ in range(100):
            async with runtime.engine.connect() as conn:
                left = set((await conn.execute(select(inbox.c.event_id))).scalars())
            if old not in left:
                break
            await asyncio.sleep(0.05)
        assert left == {kept}

"""Stored previews are forgotten with the outbox's retention."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import stream_previews, utcnow
from app.streaming.hub import PreviewHub


async def test_old_previews_are_pruned_and_zero_days_keeps_them(engine: AsyncEngine) -> None:
    now = utcnow()
    rows = [
        dict(
            event_id=name,
            channel="telegram",
            chat_id="1",
            platform_message_id="9",
            created_at=at,
            updated_at=at,
        )
        for name, at in (("old", now - timedelta(days=10)), ("new", now))
    ]
    async with engine.begin() as conn:
        await conn.execute(stream_previews.insert(), rows)
    hub = PreviewHub(engine)
    assert await hub.prune(0) == 0
    assert await hub.prune(7) == 1
    async with engine.connect() as conn:
        left = [r[0] for r in await conn.execute(select(stream_previews.c.event_id))]
    assert left == ["new"]

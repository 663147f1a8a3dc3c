"""Replies for a channel this process does not run wait visibly; they are never failed or lost."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.db.models import outbox
from app.events import InboundEvent
from app.pipeline.replies import outbox_values, reply_for
from tests.conftest import ServeApp


async def _gauges(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.get(f"{url}/metrics")
    assert resp.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


async def test_a_reply_for_a_channel_no_replica_here_runs_is_kept_and_shown(serve: ServeApp) -> None:
    async with serve(outbox_poll_seconds=0.05) as srv:
        runtime = srv.runtime
        assert "telegram" not in runtime.adapters
        # What a replica running Telegram leaves behind when it is gone (or the channel
        # was removed from CHANNELS): an undelivered reply for a channel we do not run.
        event = InboundEvent.from_text("telegram", "42", "7", "hello")
        async with runtime.engine.begin() as conn:
            await conn.execute(
                outbox.insert(),
                outbox_values(reply_for(event, "hi"), session_id=None, run_id=None, event_id=None),
            )
        runtime.sender.notify()
        await asyncio.sleep(0.3)  # several sender cycles

        samples = await _gauges(srv.url)
        assert samples[("chatgate_outbox_unserved", (("channel", "telegram"),))] == 1
        assert samples[("chatgate_outbox_backlog", ())] == 1
        async with runtime.engine.connect() as conn:
            row = (await conn.execute(select(outbox.c.status, outbox.c.attempts))).one()
        assert (row.status, row.attempts) == ("pending", 0)  # not claimed, not failed

        # Once it is gone (here: delivered elsewhere), the gauge goes back to zero.
        async with runtime.engine.begin() as conn:
            await conn.execute(outbox.update().values(status="sent"))
        samples = await _gauges(srv.url)
        assert samples[("chatgate_outbox_unserved", (("channel", "telegram"),))] == 0

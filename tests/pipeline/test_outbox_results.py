"""Delivery results of a claimed batch are recorded together, and each before `deliver_due` returns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, select

from app.db.models import outbox
from app.events import InboundEvent
from app.pipeline.replies import outbox_values, reply_for
from tests.conftest import ServeApp


async def test_replies_delivered_together_are_recorded_in_one_round_trip(serve: ServeApp) -> None:
    async with serve(outbox_poll_seconds=60) as srv:  # the test drives the sender itself
        runtime = srv.runtime
        async with runtime.engine.begin() as conn:
            for i in range(20):
                reply = reply_for(InboundEvent.from_text("webhook", f"c{i}", "u", "hi"), f"answer {i}")
                await conn.execute(
                    outbox.insert(), outbox_values(reply, session_id=None, run_id=None, event_id=None)
                )
        recorded: list[bool] = []

        def seen(_conn: Any, _cursor: Any, statement: str, _params: Any, _ctx: Any, many: bool) -> None:
            if statement.startswith("UPDATE outbox") and "sent_at=" in statement:  # not the claim
                recorded.append(many)

        event.listen(runtime.engine.sync_engine, "before_cursor_execute", seen)
        try:
            assert await runtime.sender.deliver_due() == 20
        finally:
            event.remove(runtime.engine.sync_engine, "before_cursor_execute", seen)
        assert recorded == [True]  # twenty results, not twenty statements
        async with runtime.engine.connect() as conn:
            rows = (await conn.execute(select(outbox.c.status, outbox.c.sent_at, outbox.c.attempts))).all()
        assert len(rows) == 20
        assert all(r.status == "sent" and r.sent_at is not None and r.attempts == 1 for r in rows)

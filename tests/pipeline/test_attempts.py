"""No event can hold its session for ever: attempts are counted before they run, and an event
that keeps failing, for whatever reason, is failed with its error while the session goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select

from app.agent.provider import ProviderReply, ToolSpec
from app.db.models import inbox, outbox, utcnow
from app.events import InboundEvent, TextPart
from app.pipeline.storage.portable import inbox_values
from app.sessions.messages import ChatMessage
from tests.conftest import ServeApp


@dataclass
class BrokenOn:
    """A model that raises an error nobody anticipated for one text, and answers the rest."""

    text: str
    name: str = "broken"
    calls: list[str] = field(default_factory=list)

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        user = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        self.calls.append(user)
        if user == self.text:
            raise RuntimeError(f"a bug that {user!r} runs into")
        return ProviderReply(content=f"echo {user}")

    async def aclose(self) -> None:
        return None


async def _row(srv: object, event_id: str) -> dict[str, object]:
    async with srv.runtime.engine.connect() as conn:  # type: ignore[attr-defined]
        row = (await conn.execute(select(inbox).where(inbox.c.event_id == event_id))).mappings().one()
        return dict(row)


async def _replies(srv: object, event_id: str) -> list[str]:
    async with srv.runtime.engine.connect() as conn:  # type: ignore[attr-defined]
        rows = await conn.execute(select(outbox.c.payload).where(outbox.c.event_id == event_id))
        return [p["parts"][0]["text"] for (p,) in rows]


async def test_an_event_that_fails_for_an_unforeseen_reason_is_failed_and_the_session_goes_on(
    serve: ServeApp,
) -> None:
    model = BrokenOn("boom")
    async with serve(provider=model, max_event_attempts=3) as srv:
        runtime = srv.runtime
        boom, after = (
            InboundEvent.from_text("webhook", "c", "u", "boom"),
            InboundEvent.from_text("webhook", "c", "u", "after"),
        )
        await runtime.ingest.submit([boom])
        await runtime.ingest.submit([after])
        answered = await runtime.waiters.wait_for_replies(after.event_id, 30)
        failed = await runtime.waiters.wait_for_replies(boom.event_id, 5)
    assert answered.done and [r.text for r in answered.replies] == ["echo after"]
    assert failed.done and [r.text for r in failed.replies] == ["Sorry, I could not process your message."]
    assert model.calls.count("boom") == 3  # tried exactly `max_event_attempts` times
    row = await _row(srv, boom.event_id)
    assert row["status"] == "failed" and row["attempts"] == 3
    assert "gave up after 3 attempts" in str(row["error"]) and "RuntimeError: a bug that" in str(row["error"])


async def test_a_stored_event_the_database_cannot_append_does_not_wedge_its_session(serve: ServeApp) -> None:
    """A NUL character got into the inbox (PostgreSQL's text refuses it, SQLite keeps it):
    whatever the store makes of it, the session's next event is answered."""
    async with serve(max_event_attempts=2) as srv:
        runtime = srv.runtime
        # The event model refuses NUL at the door now (issue 16); a row written before that,
        # or by another tool, is built here without validation.
        clean = InboundEvent.from_text("webhook", "c", "u", "placeholder")
        poison = clean.model_copy(update={"parts": (TextPart(text="bad \x00 text"),)})
        async with runtime.engine.begin() as conn:
            await conn.execute(inbox.insert().values(**inbox_values(poison, utcnow())))
        after = InboundEvent.from_text("webhook", "c", "u", "after")
        await runtime.ingest.submit([after])
        answered = await runtime.waiters.wait_for_replies(after.event_id, 30)
        assert answered.done and answered.replies[0].text
        status = (await _row(srv, poison.event_id))["status"]
        assert status in ("done", "failed")
        if runtime.engine.dialect.name == "postgresql":
            assert status == "failed"


async def test_a_stored_event_that_cannot_be_read_is_failed_at_once(serve: ServeApp) -> None:
    async with serve() as srv:
        runtime = srv.runtime
        unreadable = InboundEvent.from_text("webhook", "c", "u", "x")
        values = {**inbox_values(unreadable, utcnow()), "payload": {"chat_id": "c", "parts": "not a list"}}
        async with runtime.engine.begin() as conn:
            await conn.execute(inbox.insert().values(**values))
        after = InboundEvent.from_text("webhook", "c", "u", "after")
        await runtime.ingest.submit([after])
        assert (await runtime.waiters.wait_for_replies(after.event_id, 30)).done
        row = await _row(srv, unreadable.event_id)
        assert row["status"] == "failed" and row["attempts"] == 0
        assert "cannot be read" in str(row["error"])


async def test_an_accept_whose_caller_went_away_is_still_handled(serve: ServeApp) -> None:
    """A platform that hangs up mid-request: the event it sent is stored and answered."""
    async with serve() as srv:
        runtime = srv.runtime
        events = [InboundEvent.from_text("webhook", f"c{i}", "u", f"m{i}") for i in range(5)]
        submitting = [asyncio.create_task(runtime.ingest.submit([e])) for e in events]
        await asyncio.sleep(0)
        submitting[-1].cancel()
        for event in events:
            result = await runtime.waiters.wait_for_replies(event.event_id, 30)
            assert result.done and result.replies, event.text
        for task in submitting:
            if not task.cancelled():
                await task

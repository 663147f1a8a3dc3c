"""Consolidation skips the turns /undo and /retry hid: they are folded past (the window
still starts after them) but never summarized nor mined for facts."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from app.db.models import memories
from tests.agents.test_session_commands import say
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, text


async def test_an_undone_turn_never_reaches_the_summary(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("Noted."),
            text("Stored your PIN."),
            text("Coffee too, noted."),
            text('{"summary": "The user likes tea.", "facts": []}'),  # the summary call
        )
        async with serve(**openai_settings(fake)) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "I like tea") == "Noted."
            assert await say(client, srv, "my bank PIN is 4321, remember it") == "Stored your PIN."
            assert (await say(client, srv, "/undo")).startswith("Took back the last exchange.")
            assert await say(client, srv, "and coffee") == "Coffee too, noted."
            assert (await say(client, srv, "/compact")).startswith("Summarized conversation 1")
            async with srv.runtime.engine.connect() as conn:
                stored = (await conn.execute(select(memories.c.content))).scalars().all()
        summary_call = fake.requests[-1]
        transcript = " ".join(str(m["content"]) for m in summary_call.messages)
        assert "I like tea" in transcript  # folded: everything before the newest exchange
        assert "4321" not in transcript and "Stored your PIN" not in transcript
        assert stored and not any("4321" in content for content in stored)

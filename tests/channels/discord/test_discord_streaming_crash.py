"""SIGKILL in the middle of a streamed Discord reply: after the restart, one message, completed once.

A real `python -m app serve` process gets a message over the fake Gateway, streams its
answer into the fake REST API (edit mode: a preview posted, then PATCHed) and is killed
after the preview was edited. A new process re-runs the turn: it finds the stored preview,
goes on editing it, and the answer is its last edit — never a second answer.
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import messages, outbox
from tests.conftest import ADMIN_TOKEN
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.slow

ANSWER = " ".join(f"word{i}" for i in range(80))
CHANNEL_ID = "2190"


def _posts(fake: FakeDiscord) -> list[dc.Call]:
    path = f"/channels/{CHANNEL_ID}/messages"
    return [c for c in fake.calls if c.ok and c.method == "POST" and c.path == path]


def _edits(fake: FakeDiscord) -> list[dc.Call]:
    prefix = f"/channels/{CHANNEL_ID}/messages/"
    return [c for c in fake.calls if c.ok and c.method == "PATCH" and c.path.startswith(prefix)]


async def test_sigkill_mid_stream_leaves_one_completed_message(db_url: str) -> None:
    # The killed run writes slowly (killed mid-stream); the re-run faster (it still streams).
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.01)) as llm, FakeDiscord() as fake:
        llm.enqueue(Reply(content=ANSWER, chunk_delay=0.04))
        env = {
            "DATABASE_URL": db_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "CHANNELS": "discord",
            "DISCORD_BOT_TOKEN": dc.TOKEN,
            "DISCORD_API_BASE": fake.url,
            "DISCORD_GATEWAY_URL": fake.gateway_url,
            "DISCORD_STREAM_EDIT_SECONDS": "0.3",
            "STREAM_FIRST_PREVIEW_SECONDS": "0.2",
            "CONNECTION_LEASE_TTL_SECONDS": "2",
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": llm.url,
            "LLM_API_KEY": "sk-test",
            "LLM_MODEL": "fake-model",
            "LEASE_TTL_SECONDS": "2",
            "INBOX_POLL_SECONDS": "0.2",
            "OUTBOX_POLL_SECONDS": "0.1",
            "OUTBOX_CLAIM_SECONDS": "2",
            "LOG_LEVEL": "WARNING",
        }
        # Started in a thread: the fakes in this loop answer the server's start-up calls.
        server = await asyncio.to_thread(ServerProcess(env).start)
        engine = create_async_engine(db_url)
        try:
            await fake.wait_ready(timeout=30)
            await fake.dispatch("MESSAGE_CREATE", dc.message("a long story please", channel_id=CHANNEL_ID))
            await fake.wait_until(lambda: bool(_edits(fake)), timeout=30)
            server.kill()  # mid-stream: the preview shows part of the answer
            [preview] = _posts(fake)
            preview_id = next(iter(fake.texts))
            assert fake.texts[preview_id] != ANSWER
            edits_before = len(_edits(fake))

            restarted = await asyncio.to_thread(ServerProcess(env).start)
            try:
                for _ in range(300):
                    async with engine.connect() as conn:
                        statuses = [r[0] for r in await conn.execute(select(outbox.c.status))]
                    if statuses and all(s == "sent" for s in statuses):
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)  # anything late would land now
            finally:
                await asyncio.to_thread(restarted.stop)
            async with engine.connect() as conn:
                answers = [
                    r[0]
                    for r in await conn.execute(
                        select(messages.c.content)
                        .where(messages.c.role == "assistant")
                        .order_by(messages.c.id)
                    )
                ]
                statuses = [r[0] for r in await conn.execute(select(outbox.c.status))]
        finally:
            server.kill()
            await engine.dispose()
    assert statuses == ["sent"]
    assert answers == [ANSWER]
    assert len(_posts(fake)) == 1, "answered twice"
    assert preview.body["content"] != ANSWER
    assert fake.texts == {preview_id: ANSWER}, "the preview was left half"
    assert len(_edits(fake)) > edits_before  # the restarted process completed it
    assert _edits(fake)[-1].body["content"] == ANSWER

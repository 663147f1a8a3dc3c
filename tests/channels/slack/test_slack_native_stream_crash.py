"""SIGKILL in the middle of a Slack stream (SLACK_STREAMING=native): after the restart, one message.

The killed process started a stream and appended to it; the new process does not know
what the stream shows, so it appends nothing and the answer stops the stream and sets the
message's text (`chat.update`): one message, the stored answer, never a second post.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import messages, outbox
from tests.channels.slack.support import post_event
from tests.conftest import ADMIN_TOKEN
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack import FakeSlack
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.slow

ANSWER = " ".join(f"word{i}" for i in range(80))


async def test_sigkill_mid_stream_leaves_one_completed_message(db_url: str) -> None:
    # The killed run writes slowly (killed mid-stream); the re-run faster.
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.01)) as llm, FakeSlack() as fake:
        llm.enqueue(Reply(content=ANSWER, chunk_delay=0.04))
        env = {
            "DATABASE_URL": db_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "CHANNELS": "slack",
            "SLACK_BOT_TOKEN": fake.token,
            "SLACK_SIGNING_SECRET": sl.SIGNING_SECRET,
            "SLACK_API_BASE_URL": fake.url,
            "SLACK_BOT_USER_ID": sl.BOT_USER_ID,
            "SLACK_STREAMING": "native",
            "SLACK_STREAM_EDIT_SECONDS": "0.3",
            "STREAM_FIRST_PREVIEW_SECONDS": "0.2",
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
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_event(client, server.url, sl.event_callback(sl.dm("a long story please")))
                assert resp.status_code == 200
            await fake.wait_for("chat.appendStream", 1, timeout=30)
            server.kill()  # mid-stream: the stream shows part of the answer
            [ts] = fake.texts
            assert fake.texts[ts] != ANSWER and ts in fake.streaming

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
    assert len(fake.calls_of("chat.startStream")) == 1 and fake.posted() == [], "answered twice"
    assert fake.texts == {ts: ANSWER}, "the stream was left half"
    assert not fake.streaming, "the stream was stopped"
    assert [c.params["text"] for c in fake.calls_of("chat.update") if c.ok] == [ANSWER]

"""SIGKILL in the middle of a streamed reply: after the restart, the chat shows one message, completed once.

A real `python -m app serve` process talks to the fake Bot API and a fake model that writes
slowly; it is killed after its preview has been edited, and a new process finishes the turn.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import messages, outbox
from tests.channels.telegram.support import SECRET, post_update
from tests.conftest import ADMIN_TOKEN
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram import FakeTelegram
from tests.support.servers import ServerProcess

# serial: SIGKILL mid-stream and restart: start-up under load outruns the ready timeout.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

ANSWER = " ".join(f"word{i}" for i in range(80))


async def test_sigkill_mid_stream_leaves_one_completed_message(db_url: str) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.04)) as llm, FakeTelegram() as fake:
        env = {
            "DATABASE_URL": db_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "CHANNELS": "telegram",
            "TELEGRAM_BOT_TOKEN": fake.token,
            "TELEGRAM_WEBHOOK_SECRET": SECRET,
            "TELEGRAM_API_BASE_URL": fake.url,
            "TELEGRAM_FILE_BASE_URL": fake.file_url,
            "TELEGRAM_STREAM_EDIT_SECONDS": "0.3",
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
        server = ServerProcess(env).start()
        engine = create_async_engine(db_url)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_update(
                    client, server.url, tg.update(900, tg.message("a long story please"))
                )
                assert resp.status_code == 200
            await fake.wait_for("editMessageText", 1, timeout=30)
            server.kill()  # mid-stream: the preview shows part of the answer
            [preview_id] = fake.texts
            assert fake.texts[preview_id] != ANSWER

            restarted = ServerProcess(env).start()
            try:
                for _ in range(300):
                    async with engine.connect() as conn:
                        statuses = [r[0] for r in await conn.execute(select(outbox.c.status))]
                    if statuses and all(s == "sent" for s in statuses):
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)  # anything late would land now
            finally:
                restarted.stop()
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
    assert len([c for c in fake.calls_of("sendMessage") if c.ok]) == 1, "answered twice"
    assert fake.texts == {preview_id: ANSWER}, "the preview was left half"

"""A real server process with the OpenAI provider, SIGKILLed in the middle of a run.

The fake model holds its answer to the second call (after the tool result was stored);
the process is killed while it waits; a new process on the same database resumes the
event once the dead worker's lease expired. The history must be legal, the tool-call ids
the same the model gave, and the user must get exactly one answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import inbox, messages, outbox, sessions
from app.sessions.store import message_from_row
from app.sessions.window import is_legal_provider_input
from tests.conftest import WEBHOOK_SECRET
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.support.servers import ServerProcess, stop_all
from tests.support.timing import scaled
from tests.support.webhook import post_webhook

pytestmark = pytest.mark.slow


def _env(db_url: str, fake: FakeOpenAI) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "WEBHOOK_SECRET": WEBHOOK_SECRET,
        "CHANNELS": "webhook",
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": fake.url,
        "LLM_API_KEY": "sk-test",
        "LLM_MODEL": "fake-model",
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        # A lease a starved process cannot renew in time is taken over by design, and the
        # run goes again (one model call more than this test counts): 4 s leaves room on a
        # loaded machine; the SIGKILLed server's lease still expires soon.
        "LEASE_TTL_SECONDS": str(scaled(4)),
        "LOG_LEVEL": "INFO",  # a failure's report shows the servers' logs (tests/conftest.py)
    }


async def test_sigkill_mid_run_then_resume_keeps_history_legal(pg_url: str) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(ToolCall("current_time", {}, id="call_before_crash")),
            Reply(content="never delivered", hold=hold),
            text("It is time."),
        )
        env = _env(pg_url, fake)
        first = await asyncio.to_thread(ServerProcess(env).start)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_webhook(
                    client, first.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "time?"}
                )
            assert resp.status_code == 202
            await fake.wait_requests(2, timeout=30)  # the tool result is stored, the model thinks
        finally:
            await asyncio.to_thread(first.kill)
        second = await asyncio.to_thread(ServerProcess(env).start)
        try:
            await fake.wait_requests(3, timeout=30)
            engine = create_async_engine(pg_url)
            deadline = time.monotonic() + scaled(30)
            replies = 0
            while time.monotonic() < deadline:
                async with engine.connect() as conn:
                    replies = (await conn.execute(select(func.count()).select_from(outbox))).scalar_one()
                    status = (await conn.execute(select(inbox.c.status))).scalar_one()
                if replies and status == "done":
                    break
                await asyncio.sleep(0.1)
            async with engine.connect() as conn:
                rows = (
                    (
                        await conn.execute(
                            select(messages)
                            .join(sessions, sessions.c.id == messages.c.session_id)
                            .order_by(messages.c.seq)
                        )
                    )
                    .mappings()
                    .all()
                )
                payloads = [r[0] for r in await conn.execute(select(outbox.c.payload))]
            await engine.dispose()
        finally:
            hold.set()
            await stop_all(second)
        resumed: list[dict[str, Any]] = fake.requests[2].messages
    history = [message_from_row(r) for r in rows]
    assert is_legal_provider_input(history)
    assert [(m.role, m.tool_call_id) for m in history] == [
        ("user", None),
        ("assistant", None),
        ("tool", "call_before_crash"),
        ("assistant", None),
    ]
    assert history[1].tool_call_ids == ["call_before_crash"]
    assert history[-1].content == "It is time."
    assert [p["parts"][0]["text"] for p in payloads] == ["It is time."]
    assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool"]
    assert resumed[2]["tool_calls"][0]["id"] == "call_before_crash"

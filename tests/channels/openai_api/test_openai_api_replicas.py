"""Two server processes on one PostgreSQL: a session used on one replica continues on the other."""

from __future__ import annotations

import asyncio

import openai
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import messages, sessions
from tests.channels.openai_api.test_openai_api import TOKEN_A, TOKEN_B
from tests.support.servers import ServerProcess, stop_all

# serial: two server processes start; start-up under load outruns the ready timeout.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


async def test_a_session_continues_on_the_other_replica(pg_url: str) -> None:
    # CHANNELS without openai: configured callers (OPENAI_API_TOKENS) are enough to serve it.
    env = {
        "DATABASE_URL": pg_url,
        "CHANNELS": "webhook",
        "OPENAI_API_TOKENS": f'{{"{TOKEN_A}": "caller-one", "{TOKEN_B}": "caller-two"}}',
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
    }
    first, second = await asyncio.gather(
        asyncio.to_thread(ServerProcess(env).start), asyncio.to_thread(ServerProcess(env).start)
    )
    engine = create_async_engine(pg_url)
    try:
        one = openai.AsyncOpenAI(base_url=f"{first.url}/v1", api_key=TOKEN_A, max_retries=0, timeout=60)
        two = openai.AsyncOpenAI(base_url=f"{second.url}/v1", api_key=TOKEN_A, max_retries=0, timeout=60)
        header = {"X-Chatgate-Session": "roaming"}
        a = await one.chat.completions.create(
            model="chatgate", messages=[{"role": "user", "content": "on one"}], extra_headers=header
        )
        stream = await two.chat.completions.create(
            model="chatgate",
            messages=[{"role": "user", "content": "on two"}],
            extra_headers=header,
            stream=True,
        )
        b = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert a.choices[0].message.content == "You said: on one"
        assert b == "You said: on two"
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(sessions.c.id, messages.c.role, messages.c.content)
                    .join(messages, messages.c.session_id == sessions.c.id)
                    .where(sessions.c.key == "openai:caller-one:roaming")
                    .order_by(messages.c.seq)
                )
            ).all()
        assert len({r[0] for r in rows}) == 1  # one session, continued
        assert [(r[1], r[2]) for r in rows] == [
            ("user", "on one"),
            ("assistant", "You said: on one"),
            ("user", "on two"),
            ("assistant", "You said: on two"),
        ]
    finally:
        await stop_all(first, second)
        await engine.dispose()

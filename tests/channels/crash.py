"""SIGKILL in the middle of a streamed reply, for any channel: kill, restart, read what was stored.

A real `python -m app serve` process talks to a channel's fake platform and a fake model
that writes slowly (`SLOW_ANSWER`); the test sends it a message, waits until the preview
shows part of the answer, kills the process, starts a new one on the same database and
waits until the outbox has delivered everything. The caller then checks what the fake
platform shows: one message, completed once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import messages, outbox
from tests.conftest import ADMIN_TOKEN
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.servers import ServerProcess, stop_all
from tests.support.timing import eventually, scaled

ANSWER = " ".join(f"word{i}" for i in range(80))


def slow_model() -> FakeOpenAI:
    """A model that takes about three seconds to write `ANSWER`."""
    return FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.04))


def server_env(db_url: str, llm: FakeOpenAI, channel: Mapping[str, str]) -> dict[str, str]:
    """A server's environment: short leases and polls, so the restarted one takes over fast."""
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "STREAM_FIRST_PREVIEW_SECONDS": "0.2",
        "LLM_PROVIDER": "openai",
        "LLM_BASE_URL": llm.url,
        "LLM_API_KEY": "sk-test",
        "LLM_MODEL": "fake-model",
        # Short, so the restarted server takes the killed one's sessions soon; scaled, so a
        # starved server still renews it in time (else it takes its own lease over and runs
        # the turn again: tests/app/agent/test_agent_crash.py saw that on a slow host).
        "LEASE_TTL_SECONDS": str(scaled(2)),
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "OUTBOX_CLAIM_SECONDS": "2",
        "LOG_LEVEL": "WARNING",
        **channel,
    }


@dataclass
class Outcome:
    answers: list[str]  # assistant messages stored, in order
    statuses: list[str]  # outbox rows' statuses


async def kill_mid_stream(
    env: Mapping[str, str],
    *,
    send: Callable[[str], Awaitable[None]],
    streaming: Callable[[], Awaitable[None]],
) -> Outcome:
    """Start a server, `send(url)` a message, SIGKILL it once `streaming()` returned, restart it.

    Returns when the restarted server has delivered every outbox row (and half a second
    more, for anything late to land) and stopped.
    """
    db_url = env["DATABASE_URL"]
    # Started in a thread: `start` polls /readyz synchronously, and the fake platforms in this
    # event loop must keep answering the server's start-up calls meanwhile.
    server = await asyncio.to_thread(ServerProcess(env).start)
    engine = create_async_engine(db_url)
    try:
        await send(server.url)
        await streaming()
        server.kill()  # mid-stream: the preview shows part of the answer
        restarted = await asyncio.to_thread(ServerProcess(env).start)
        try:

            async def all_sent() -> bool:
                async with engine.connect() as conn:
                    statuses = [r[0] for r in await conn.execute(select(outbox.c.status))]
                return bool(statuses) and all(s == "sent" for s in statuses)

            # Not failing here: the caller's assertions on the outcome name what is missing.
            with contextlib.suppress(AssertionError):
                await eventually(all_sent, timeout=30, interval=0.1)
            await asyncio.sleep(0.5)  # anything late would land now
        finally:
            await stop_all(restarted)
        async with engine.connect() as conn:
            answers = [
                r[0]
                for r in await conn.execute(
                    select(messages.c.content).where(messages.c.role == "assistant").order_by(messages.c.id)
                )
            ]
            statuses = [r[0] for r in await conn.execute(select(outbox.c.status))]
    finally:
        server.kill()
        await engine.dispose()
    return Outcome(answers=answers, statuses=statuses)

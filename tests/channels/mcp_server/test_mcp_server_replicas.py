"""Two server processes on one PostgreSQL: an `ask` session continues on the other replica."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.channels.mcp_server.test_mcp_server import TEAM, mcp_client, structured, text_of
from tests.support.servers import ServerProcess, stop_all

# serial: two server processes start; start-up under load outruns the ready timeout.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


async def test_an_ask_session_continues_on_the_other_replica(pg_url: str) -> None:
    tokens = [{"token": TEAM, "subject": "n8n", "key_prefix": "webhook:team-a"}]
    env = {
        "DATABASE_URL": pg_url,
        "CHANNELS": "webhook",
        "MCP_SERVER_TOKENS": json.dumps(tokens),
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
    }
    first, second = await asyncio.gather(
        asyncio.to_thread(ServerProcess(env).start), asyncio.to_thread(ServerProcess(env).start)
    )
    try:
        async with mcp_client(first.url, TEAM) as one, mcp_client(second.url, TEAM) as two:
            a = await one.call_tool("ask", {"session": "roam", "text": "on one"})
            b = await two.call_tool("ask", {"session": "roam", "text": "on two"})
            history = structured(await one.call_tool("get_history", {"key": "mcp:n8n:roam"}))
        assert (text_of(a), text_of(b)) == ("You said: on one", "You said: on two")
        assert [m["content"] for m in history] == ["on one", "You said: on one", "on two", "You said: on two"]
    finally:
        await stop_all(first, second)

"""A long run keeps its session active: the lifecycle sweep runs every 0.1 s and expires
sessions idle for 1 s, the model takes 2.5 s; with the heartbeat the session stays active
through the run, without it the sweep expires it mid-run."""

from __future__ import annotations

import httpx
import pytest

from tests.agents.test_agents import post
from tests.agents.test_session_commands import session_rows
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, text


# serial for "active": a heartbeat every 0.2 s against expiry after 1 s of idleness: a
# loaded machine (other xdist workers) stalls the loop past that margin. A stall can only
# help "expired", so that case runs in parallel.
@pytest.mark.parametrize(
    ("beat", "status"), [pytest.param(0.2, "active", marks=pytest.mark.serial), (0.0, "expired")]
)
async def test_a_long_run_refreshes_its_sessions_last_active_time(
    serve: ServeApp, beat: float, status: str
) -> None:
    channel = {"webhook": webhook_settings(suspend_after_seconds=0.5, expire_after_seconds=1.0)}
    async with FakeOpenAI() as fake:
        fake.enqueue(text("slow answer", delay=2.5))
        settings = openai_settings(fake, lifecycle_sweep_seconds=0.1, session_heartbeat_seconds=beat)
        running = serve(channel_settings=channel, **settings)
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "think hard") == "slow answer"
            [row] = await session_rows(srv, "webhook:c1")
    assert row["status"] == status

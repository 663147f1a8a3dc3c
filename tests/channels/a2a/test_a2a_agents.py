"""With several agents (`AGENTS_FILE`), each has its own Agent Card and JSON-RPC URL
(`/a2a/agents/<name>`): the official `a2a-sdk` client discovers it, talks to that agent
(its prompt reaches the model), and one contextId at two agents is two sessions."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types.a2a_pb2 import TaskState
from a2a.utils.errors import InvalidRequestError
from sqlalchemy import select

from app.db.models import sessions
from tests.agents.test_agents import AGENTS_YAML, system_text
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.a2a.test_a2a import (
    TOKEN_A,
    TOKEN_B,
    channels,
    only_task,
    reply_text,
    sdk_client,
    user_message,
)
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, text

SKILL = """---
name: refunds
description: How refunds are handled
---
Refunds take five days.
"""


def agents_file(tmp_path: Path) -> str:
    folder = tmp_path / "support-skills" / "refunds"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(SKILL)
    yaml = AGENTS_YAML.replace(
        "    model: support-model\n",
        f"    model: support-model\n    skills_dir: {tmp_path / 'support-skills'}\n",
    ).replace("    users: [boss]\n", "    users: [agent-two]\n")
    path = tmp_path / "agents.yaml"
    path.write_text(yaml)
    return str(path)


async def test_each_agent_has_its_card_and_url_and_its_own_sessions(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        settings = openai_settings(fake, agents_file=agents_file(tmp_path))
        async with (
            serve(channel_settings=channels(), **settings) as srv,
            httpx.AsyncClient(timeout=30) as http,
        ):
            default_card = await A2ACardResolver(http, srv.url).get_agent_card()
            support_card = await A2ACardResolver(http, f"{srv.url}/a2a/agents/support").get_agent_card()
            missing = await http.get(f"{srv.url}/a2a/agents/nobody/.well-known/agent-card.json")

            assert default_card.name == "chatgate"
            assert default_card.supported_interfaces[0].url == f"{srv.url}/a2a"
            assert support_card.name == "support"
            assert support_card.description == "product questions"
            assert support_card.supported_interfaces[0].url == f"{srv.url}/a2a/agents/support"
            assert [s.id for s in support_card.skills] == ["chat", "skill:refunds"]
            assert support_card.skills[1].description == "How refunds are handled"
            assert "bearer" in support_card.security_requirements[0].schemes
            assert missing.status_code == 404

            async with sdk_client(f"{srv.url}/a2a/agents/support", TOKEN_A) as support:
                task = await only_task(support, user_message("my order is late", context_id="ctx-1"))
            async with sdk_client(srv.url, TOKEN_A) as default:
                other = await only_task(default, user_message("hello", context_id="ctx-1"))
            assert task.status.state == other.status.state == TaskState.TASK_STATE_COMPLETED
            assert reply_text(task) == reply_text(other) == "ok"

            # ops names its users: agent-one may not use it, agent-two may.
            async with sdk_client(f"{srv.url}/a2a/agents/ops", TOKEN_A) as ops:
                with pytest.raises(InvalidRequestError, match="may not use the agent 'ops'"):
                    await only_task(ops, user_message("deploy?", context_id="ctx-2"))
            async with sdk_client(f"{srv.url}/a2a/agents/ops", TOKEN_B) as ops:
                allowed = await only_task(ops, user_message("deploy?", context_id="ctx-2"))
            assert allowed.status.state == TaskState.TASK_STATE_COMPLETED

            async with srv.runtime.engine.connect() as conn:
                keys = set((await conn.execute(select(sessions.c.key))).scalars())
        assert keys == {
            "a2a:%agent=support:agent-one:ctx-1",
            "a2a:agent-one:ctx-1",
            "a2a:%agent=ops:agent-two:ctx-2",
        }
        support_request, default_request, ops_request = fake.requests
        assert "You are Sam from support." in system_text(support_request)
        assert support_request.body["model"] == "support-model"
        assert "You are Ada" in system_text(default_request)
        assert "You are the ops bot." in system_text(ops_request)

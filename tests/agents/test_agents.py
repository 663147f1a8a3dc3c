"""Agents and routes: the route picks the agent (its prompt and model reach the model),
the agent is part of the session key except for the default agent, and two agents in
one chat keep separate histories. Through the signed webhook and a fake OpenAI server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.agents.profiles import AgentBook
from app.db.models import inbox, sessions
from app.events import InboundEvent, agent_in_key
from tests.agents.test_session_commands import sent
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, text
from tests.support.webhook import post_webhook

AGENTS_YAML = """
default: assistant
agents:
  - name: assistant
    description: everyday help
    system_prompt: You are Ada, the assistant.
  - name: support
    description: product questions
    system_prompt: You are Sam from support.
    model: support-model
  - name: ops
    system_prompt: You are the ops bot.
    users: [boss]
routes:
  - {chat: support-room, agent: support}
  - {chat_type: group, sender: boss, agent: ops}
"""


async def post(
    client: httpx.AsyncClient, srv: Any, words: str, *, chat: str = "c1", sender: str = "u1", **more: Any
) -> str:
    payload = {"chat_id": chat, "sender_id": sender, "text": words, **more}
    resp = await post_webhook(client, srv.url, WEBHOOK_SECRET, payload, wait=True)
    assert resp.status_code == 200, resp.text
    [reply] = resp.json()["replies"]
    return str(reply["text"])


def system_text(request: Any) -> str:
    return " ".join(m["content"] for m in request.messages if m["role"] == "system")


async def keys(srv: Any) -> set[str]:
    async with srv.runtime.engine.connect() as conn:
        return set((await conn.execute(select(sessions.c.key))).scalars())


async def test_routes_pick_the_agent_and_only_other_agents_change_the_key(
    serve: ServeApp, tmp_path: Path
) -> None:
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(AGENTS_YAML)
    channel = {"webhook": webhook_settings(require_mention_in_groups=False)}
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        settings = openai_settings(fake, agents_file=str(agents_file))
        running = serve(channel_settings=channel, **settings)
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            await post(client, srv, "hi", chat="c1")
            await post(client, srv, "my order is late", chat="support-room")
            await post(client, srv, "deploy status?", chat="war-room", sender="boss", chat_type="group")
            await post(client, srv, "hello all", chat="war-room", sender="u2", chat_type="group")
            assert await keys(srv) == {
                "webhook:c1",  # the default agent: the key scheme is unchanged
                "webhook:%agent=support:support-room",
                "webhook:%agent=ops:war-room",
                "webhook:war-room",
            }
        first, second, third, fourth = fake.requests
        assert "You are Ada" in system_text(first) and first.body["model"] == "fake-model"
        assert "You are Sam from support." in system_text(second) and second.body["model"] == "support-model"
        assert "You are the ops bot." in system_text(third)
        assert "You are Ada" in system_text(fourth)


async def test_two_agents_in_one_chat_keep_separate_histories(serve: ServeApp, tmp_path: Path) -> None:
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(AGENTS_YAML)
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        settings = openai_settings(fake, agents_file=str(agents_file))
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            listed = await post(client, srv, "/agent")
            assert listed == (
                "Agents (* serving this chat):\n- assistant — everyday help *\n- support — product questions"
            )
            assert await post(client, srv, "/agent ops") == (
                "There is no agent ops you may use. Yours: assistant, support"
            )
            await post(client, srv, "I like green tea")
            assert await post(client, srv, "/agent support") == (
                "This chat now talks to support. Each agent keeps its own conversation."
            )
            await post(client, srv, "what do I like?")
            assert "Agent: support" in await post(client, srv, "/status")
            assert await post(client, srv, "/agent assistant") == (
                "This chat now talks to assistant. Each agent keeps its own conversation."
            )
            await post(client, srv, "and now?")
            async with srv.runtime.engine.connect() as conn:
                rows = await conn.execute(select(inbox.c.session_key).order_by(inbox.c.id))
                stored = rows.scalars().all()
        assert sent(fake.requests[0]) == [("user", "I like green tea")]
        assert sent(fake.requests[1]) == [("user", "what do I like?")]  # support never saw the tea
        assert "You are Sam" in system_text(fake.requests[1])
        assert sent(fake.requests[2]) == [
            ("user", "I like green tea"),
            ("assistant", "ok"),
            ("user", "and now?"),
        ]
        assert "webhook:%agent=support:c1" in stored and stored[-1] == "webhook:c1"

    # the choice is stored: a restart keeps talking to the chosen agent
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        async with serve(**openai_settings(fake, agents_file=str(agents_file))) as srv:
            async with httpx.AsyncClient(timeout=30) as client:
                await post(client, srv, "/agent support")
            async with serve(**openai_settings(fake, agents_file=str(agents_file))) as srv2:
                async with httpx.AsyncClient(timeout=30) as client:
                    assert "Agent: support" in await post(client, srv2, "/status")


def test_an_agents_file_in_toml_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(
        'default = "a"\n[[agents]]\nname = "a"\n[[agents]]\nname = "b"\nmodels = ["m1", "m2"]\n'
        '[[routes]]\nchannel = "slack"\nagent = "b"\n'
    )
    book = AgentBook.load(str(path))
    assert book.get("b").models == ("m1", "m2")
    assert book.routed(InboundEvent.from_text("slack", "C1", "u", "hi")) == "b"
    assert book.routed(InboundEvent.from_text("telegram", "C1", "u", "hi")) == "a"
    assert AgentBook.load(None).agents.keys() == {"default"}
    with pytest.raises(ValueError, match="no agent named 'x'"):
        AgentBook.from_data({"agents": [{"name": "a"}], "routes": [{"agent": "x"}]})
    with pytest.raises(ValueError, match="unknown fields"):
        AgentBook.from_data({"agents": [{"name": "a", "prompt": "typo"}]})


def test_the_agent_key_component_cannot_come_from_a_chat_id() -> None:
    tricky = InboundEvent.from_text("webhook", "%agent=x:c1", "u", "hi")
    assert agent_in_key(tricky.session_key) is None
    named = InboundEvent.from_text("webhook", "c1", "u", "hi", agent="a:b%")
    assert named.session_key == "webhook:%agent=a%3Ab%25:c1" and agent_in_key(named.session_key) == "a:b%"

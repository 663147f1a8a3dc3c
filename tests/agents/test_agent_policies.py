"""An agent's declared policies hold in its runs: its tool lists narrow what the model is
offered and may call, its approvers may decide its risky calls, and its skills list
narrows the global skills it sees. Through the signed webhook and a fake OpenAI server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.agents.test_agents import post, system_text
from tests.agents.test_skills import skills_dir
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text

AGENTS_YAML = """
default: assistant
agents:
  - name: assistant
  - name: support
    system_prompt: You are Sam from support.
    tools_deny: [current_time]
    skills: [haiku]
  - name: ops
    system_prompt: You are the ops bot.
    tools_allow: [write_file, read_file]
    approvers: [boss]
routes:
  - {chat: support-room, agent: support}
  - {chat: ops-room, agent: ops}
"""


def with_agents(fake: FakeOpenAI, tmp_path: Path, **more: object) -> dict[str, object]:
    return openai_settings(
        fake, agents_file=agents_file(tmp_path), workspace_root=str(tmp_path / "ws"), **more
    )


def agents_file(tmp_path: Path) -> str:
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS_YAML)
    return str(path)


def offered(request: object) -> set[str]:
    return {t["function"]["name"] for t in getattr(request, "body")["tools"]}  # noqa: B009


async def test_an_agents_tool_lists_narrow_what_is_offered_and_callable(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as fake:
        sneaky = ToolCall("current_time", {}, id="call_t")
        fake.enqueue(text("hi from the assistant"), calls(sneaky), text("I cannot tell the time."))
        settings = openai_settings(
            fake, agents_file=agents_file(tmp_path), workspace_root=str(tmp_path / "ws")
        )
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "hello", chat="c1") == "hi from the assistant"
            assert (
                await post(client, srv, "what time is it?", chat="support-room") == "I cannot tell the time."
            )
        assistant, support, after = fake.requests
        assert "current_time" in offered(assistant) and "write_file" in offered(assistant)
        assert "current_time" not in offered(support) and "write_file" in offered(support)
        [result] = [m for m in after.messages if m["role"] == "tool"]
        assert json.loads(result["content"]) == {"error": "tool 'current_time' is not allowed here"}


async def test_an_agents_allow_list_keeps_only_its_tools(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        settings = openai_settings(
            fake, agents_file=agents_file(tmp_path), workspace_root=str(tmp_path / "ws")
        )
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "status?", chat="ops-room") == "ok"
        assert offered(fake.requests[0]) == {"write_file", "read_file"}


async def test_an_agents_approvers_decide_its_risky_calls(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        write = ToolCall("write_file", {"path": "out.txt", "content": "hi"}, id="call_w")
        fake.enqueue(
            calls(write), text("Written."), calls(ToolCall("write_file", write.arguments)), text("No.")
        )
        settings = openai_settings(
            fake, agents_file=agents_file(tmp_path), workspace_root=str(tmp_path / "ws")
        )
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            asked = await post(client, srv, "write out.txt", chat="ops-room")
            number = re.search(r"/approve (\d+)", asked)
            assert number, asked
            refused = await post(client, srv, f"/approve {number.group(1)}", chat="ops-room", sender="u1")
            assert refused == "You are not allowed to decide this approval."
            assert await post(client, srv, f"/approve {number.group(1)}", chat="ops-room", sender="boss") == (
                "Written."
            )
            # the same channel without the agent's approvers: nobody may approve, the call is denied
            assert await post(client, srv, "write it here", chat="c1") == "No."
        [denied] = [m for m in fake.requests[-1].messages if m["role"] == "tool"]
        assert "denied" in denied["content"]


async def test_an_agents_skills_list_narrows_the_global_skills(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("ok"), calls(ToolCall("load_skill", {"name": "pirate"}, id="call_p")), text("no pirate")
        )
        settings = with_agents(fake, tmp_path, skills_dir=str(skills_dir(tmp_path)))
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            listed = await post(client, srv, "/skills", chat="support-room")
            assert listed.splitlines() == ["Skills (* loaded here):", "- haiku: Answer in haiku."]
            assert "pirate" in await post(client, srv, "/skills", chat="c1")
            refused = await post(client, srv, "/skill pirate", chat="support-room")
            assert refused == "There is no skill pirate. Available: haiku"
            assert await post(client, srv, "hello", chat="support-room") == "ok"
            assert await post(client, srv, "be a pirate", chat="support-room") == "no pirate"
        assert "haiku" in system_text(fake.requests[0]) and "pirate" not in system_text(fake.requests[0])
        [result] = [m for m in fake.requests[-1].messages if m["role"] == "tool"]
        assert "no skill named 'pirate'" in result["content"]

"""Skills: a skill loaded by /skill or by the model's load_skill call enters only that
session's context, asserted on what the fake OpenAI server received."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.agents.test_agents import post, system_text
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text

HAIKU = "Answer every question as a haiku of 5-7-5 syllables."
PIRATE = "Talk like a pirate, matey."


def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    for name, description, body in (
        ("haiku", "Answer in haiku.", HAIKU),
        ("pirate", "Talk like a pirate.", PIRATE),
    ):
        (root / name).mkdir(parents=True)
        (root / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n{body}\n")
    (root / "broken").mkdir()
    (root / "broken" / "SKILL.md").write_text("no front matter here")
    return root


async def test_a_skill_enters_only_the_session_that_loaded_it(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("one"),  # c1, haiku loaded
            calls(ToolCall("load_skill", {"name": "pirate"}, id="call_p")),  # c2 loads pirate
            text("Arr"),
            text("two"),  # c1 again
            text("three"),  # c2 again
            text("four"),  # c1 after /skill -haiku
        )
        settings = openai_settings(fake, skills_dir=str(skills_dir(tmp_path)))
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            listed = await post(client, srv, "/skills", chat="c1")
            assert listed.splitlines() == [
                "Skills (* loaded here):",
                "- haiku: Answer in haiku.",
                "- pirate: Talk like a pirate.",
            ]
            assert await post(client, srv, "/skill haiku", chat="c1") == "Skill haiku loaded here."
            assert await post(client, srv, "hello", chat="c1") == "one"
            assert await post(client, srv, "ahoy", chat="c2") == "Arr"
            assert await post(client, srv, "again", chat="c1") == "two"
            assert await post(client, srv, "again", chat="c2") == "three"
            assert "Loaded skills: pirate" in await post(client, srv, "/status", chat="c2")
            assert "haiku: Answer in haiku. *" in await post(client, srv, "/skills", chat="c1")
            assert await post(client, srv, "/skill -haiku", chat="c1") == "Skill haiku unloaded."
            assert await post(client, srv, "last", chat="c1") == "four"
            assert await post(client, srv, "/skill nope", chat="c1") == (
                "There is no skill nope. Available: haiku, pirate"
            )
        c1_first, c2_call, c2_after_tool, c1_second, c2_second, c1_unloaded = fake.requests
        for request in fake.requests:  # every session sees the short list
            assert "- haiku: Answer in haiku." in system_text(request)
        assert HAIKU in system_text(c1_first) and PIRATE not in system_text(c1_first)
        assert HAIKU not in system_text(c2_call) and PIRATE not in system_text(c2_call)
        assert "load_skill" in c2_call.tool_names
        tool_result = next(m for m in c2_after_tool.messages if m["role"] == "tool")
        assert PIRATE in tool_result["content"]
        assert HAIKU in system_text(c1_second) and PIRATE not in system_text(c1_second)
        assert PIRATE in system_text(c2_second) and HAIKU not in system_text(c2_second)
        assert HAIKU not in system_text(c1_unloaded)


async def test_skill_commands_in_chinese_and_without_skills(serve: ServeApp, tmp_path: Path) -> None:
    zh = {"webhook": webhook_settings(locale="zh")}
    async with serve(channel_settings=zh, skills_dir=str(skills_dir(tmp_path))) as srv:
        async with httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "/skill haiku") == "已在当前对话加载技能 haiku。"
            assert await post(client, srv, "/skill -pirate") == "技能 pirate 未加载。"
            assert await post(client, srv, "/skill -haiku") == "已卸载技能 haiku。"
            assert await post(client, srv, "/skill 无") == "没有名为 无 的技能。可用：haiku, pirate"
    async with serve() as srv:
        assert "/skill" not in {c.name for c in srv.runtime.commands}

"""The session commands through the signed webhook channel, in English and Chinese:
what they answer, what they store, and that /model outlives a restart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import messages, sessions
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.support.webhook import post_webhook


async def say(client: httpx.AsyncClient, srv: Any, words: str, chat: str = "c1", sender: str = "u1") -> str:
    resp = await post_webhook(
        client, srv.url, WEBHOOK_SECRET, {"chat_id": chat, "sender_id": sender, "text": words}, wait=True
    )
    assert resp.status_code == 200, resp.text
    [reply] = resp.json()["replies"]
    return str(reply["text"])


async def session_rows(srv: Any, key: str) -> list[dict[str, Any]]:
    async with srv.runtime.engine.connect() as conn:
        rows = await conn.execute(
            select(sessions.c.generation, sessions.c.title, sessions.c.status, sessions.c.metadata)
            .where(sessions.c.key == key)
            .order_by(sessions.c.generation)
        )
        return [dict(r) for r in rows.mappings()]


async def test_every_session_command_answers_in_english(serve: ServeApp) -> None:
    async with serve(llm_models="big-model") as srv, httpx.AsyncClient(timeout=30) as client:
        help_text = await say(client, srv, "/help")
        for name in ("/status", "/whoami", "/title", "/model", "/sessions", "/resume"):
            assert name in help_text
        assert "/model [NAME] — Show or choose this conversation's model." in help_text

        whoami = await say(client, srv, "/whoami")
        assert "You: u1" in whoami and "Session key: webhook:c1" in whoami

        assert await say(client, srv, "/title") == "Title: none"
        assert await say(client, srv, "/title  Trip   planning ") == "Title set to: Trip planning"
        assert await say(client, srv, "/title") == "Title: Trip planning"
        assert (await say(client, srv, "/title " + "x" * 201)).startswith("A title has at most 200")

        assert await say(client, srv, "/model") == "Model: gpt-4o-mini\nAvailable: gpt-4o-mini, big-model"
        refused = await say(client, srv, "/model gpt-5-secret")
        assert refused == "gpt-5-secret is not available here. Available: gpt-4o-mini, big-model"
        assert (await session_rows(srv, "webhook:c1"))[0]["metadata"] == {}
        assert await say(client, srv, "/model big-model") == "This conversation now uses big-model."

        await say(client, srv, "hello there")
        status = await say(client, srv, "/status")
        assert status.startswith("Session webhook:c1\nAgent: default\nGeneration: 1\nTitle: Trip planning")
        assert "Model: big-model" in status and "Pending approvals: 0" in status
        assert "Window: 2 messages" in status  # the user message and the answer; commands are not history

        assert await say(client, srv, "/new") == "Started a new conversation."
        assert "Model: gpt-4o-mini" in await say(client, srv, "/status")  # a new generation starts clean
        listed = await say(client, srv, "/sessions")
        lines = listed.splitlines()
        assert lines[0] == "Conversations in this chat (* current):"
        assert lines[1] == "2. (untitled) — 0 messages, active *"
        assert lines[2] == "1. Trip planning — 2 messages, expired"

        assert await say(client, srv, "/resume 7") == "There is no conversation 7 here. /sessions lists them."
        assert await say(client, srv, "/resume 1") == "Continuing conversation 1: Trip planning"
        assert "Generation: 1" in await say(client, srv, "/status")
        rows = await session_rows(srv, "webhook:c1")
        assert [(r["generation"], r["status"]) for r in rows] == [(1, "active"), (2, "expired")]
        assert rows[0]["metadata"] == {"model": "big-model"}


async def test_every_session_command_answers_in_chinese(serve: ServeApp) -> None:
    settings = {"webhook": webhook_settings(locale="zh")}
    async with serve(channel_settings=settings) as srv, httpx.AsyncClient(timeout=30) as client:
        help_text = await say(client, srv, "/help")
        assert "/status — 查看当前对话的状态。" in help_text
        assert "/resume <N> — 继续之前的某个对话。" in help_text
        assert "你：u1" in await say(client, srv, "/whoami")
        assert await say(client, srv, "/title") == "标题：无"
        assert await say(client, srv, "/title 旅行计划") == "标题已设为：旅行计划"
        assert await say(client, srv, "/model") == "当前模型：gpt-4o-mini\n可用模型：gpt-4o-mini"
        assert await say(client, srv, "/model other") == "此处不可使用 other。可用模型：gpt-4o-mini"
        assert await say(client, srv, "/model gpt-4o-mini") == "当前对话已切换到 gpt-4o-mini。"
        status = await say(client, srv, "/status")
        assert status.startswith("会话 webhook:c1\n智能体：default\n代数：1\n标题：旅行计划\n")
        assert "模型：gpt-4o-mini" in status
        assert await say(client, srv, "/new") == "已开始新的对话。"
        listed = (await say(client, srv, "/sessions")).splitlines()
        assert listed[0] == "此聊天中的对话（* 为当前）："
        assert listed[2] == "1. 旅行计划 — 0 条消息，expired"
        assert await say(client, srv, "/resume 9") == "此处没有第 9 个对话。使用 /sessions 查看列表。"
        assert await say(client, srv, "/resume 1") == "继续第 1 个对话：旅行计划"


async def test_model_choice_reaches_the_model_and_survives_a_restart(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        settings = openai_settings(fake, llm_models="big-model,small-model")
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "/model small-model") == "This conversation now uses small-model."
            assert await say(client, srv, "hi") == "ok"
            assert await say(client, srv, "hi from elsewhere", chat="c2") == "ok"
        assert [r.body["model"] for r in fake.requests] == ["small-model", "fake-model"]

        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "/model") == (
                "Model: small-model\nAvailable: fake-model, big-model, small-model"
            )
            assert await say(client, srv, "again") == "ok"
        assert fake.requests[-1].body["model"] == "small-model"
        # the same generation: the model saw the earlier turn too
        assert [m["content"] for m in fake.requests[-1].messages if m["role"] == "user"] == ["hi", "again"]


async def history(srv: Any, key: str) -> list[tuple[str, str | None]]:
    async with srv.runtime.engine.connect() as conn:
        rows = await conn.execute(
            select(messages.c.role, messages.c.content)
            .join(sessions, sessions.c.id == messages.c.session_id)
            .where(sessions.c.key == key)
            .order_by(messages.c.seq)
        )
        return [(r.role, r.content) for r in rows]


def sent(request: Any) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in request.messages if m["role"] != "system"]


async def test_retry_and_undo_keep_the_history_and_hide_the_turn_from_the_model(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(text("Noted, Ann."), text("5"), text("4"), text("Hello!"))
        async with serve(**openai_settings(fake)) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "my name is Ann") == "Noted, Ann."
            assert await say(client, srv, "what is 2+2?") == "5"
            assert await say(client, srv, "/retry") == "4"
            assert sent(fake.requests[2]) == [
                ("user", "my name is Ann"),
                ("assistant", "Noted, Ann."),
                ("user", "what is 2+2?"),
            ]
            assert await say(client, srv, "/undo") == (
                "Took back the last exchange. It stays in the history, marked undone."
            )
            assert await say(client, srv, "hi") == "Hello!"
            assert sent(fake.requests[3]) == [
                ("user", "my name is Ann"),
                ("assistant", "Noted, Ann."),
                ("user", "hi"),
            ]
            # append-only: every message is still stored, the markers say which turns are out
            assert await history(srv, "webhook:c1") == [
                ("user", "my name is Ann"),
                ("assistant", "Noted, Ann."),
                ("user", "what is 2+2?"),
                ("assistant", "5"),
                ("user", "what is 2+2?"),
                ("assistant", "4"),
                ("user", "hi"),
                ("assistant", "Hello!"),
            ]
            [row] = await session_rows(srv, "webhook:c1")
            marks = [(m["from"], m["to"], m["why"], m["by"]) for m in row["metadata"]["hidden"]]
            assert marks == [(3, 4, "superseded", "u1"), (5, 6, "undone", "u1")]
        assert len(fake.requests) == 4


async def test_undo_and_retry_with_nothing_to_act_on_in_chinese(serve: ServeApp) -> None:
    settings = {"webhook": webhook_settings(locale="zh")}
    async with serve(channel_settings=settings) as srv, httpx.AsyncClient(timeout=30) as client:
        assert await say(client, srv, "/undo") == "没有可以撤回的内容。"
        assert await say(client, srv, "/retry") == "没有可以重新回答的消息。"
        await say(client, srv, "你好")
        assert await say(client, srv, "/undo") == "已撤回上一轮对话。它仍保留在历史中，标记为已撤回。"
        assert await say(client, srv, "/undo") == "没有可以撤回的内容。"
        assert "上下文：0 条消息" in await say(client, srv, "/status")


async def test_compact_summarizes_and_continues_in_a_linked_generation_that_carries_the_summary(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("Nice to meet you."),
            text("Paris is lovely in May."),
            text('{"summary": "Ann plans a trip to Paris in May.", "facts": []}'),  # the summary call
            text("Pack an umbrella."),
        )
        settings = openai_settings(fake, llm_models="big-model")
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "/compact") == "There is nothing to compact yet."
            await say(client, srv, "I am Ann")
            await say(client, srv, "I go to Paris in May")
            await say(client, srv, "/title Paris")
            await say(client, srv, "/model big-model")
            done = await say(client, srv, "/compact")
            assert done == "Summarized conversation 1 (1 summaries) and continued in conversation 2."
            assert await say(client, srv, "what should I pack?") == "Pack an umbrella."
            status = await say(client, srv, "/status")
            assert "Generation: 2\nTitle: Paris\nModel: big-model" in status
            rows = await session_rows(srv, "webhook:c1")
            assert [(r["generation"], r["status"]) for r in rows] == [(1, "expired"), (2, "active")]
            assert rows[1]["metadata"]["compacted_from"]["generation"] == 1
        last = fake.requests[-1]
        system = " ".join(m["content"] for m in last.messages if m["role"] == "system")
        assert "Ann plans a trip to Paris in May." in system
        assert sent(last) == [("user", "what should I pack?")]
        assert last.body["model"] == "big-model"


async def test_compact_in_chinese_without_memory(serve: ServeApp) -> None:
    settings = {"webhook": webhook_settings(locale="zh")}
    async with serve(channel_settings=settings, memory_enabled=False) as srv:
        async with httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "/compact") == "压缩需要启用记忆与整理功能，此处未启用。"


async def test_a_run_continued_after_approval_keeps_the_sessions_model(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as fake:
        write = ToolCall("write_file", {"path": "out.txt", "content": "hi"}, id="call_w")
        fake.enqueue(calls(write), text("Written."))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        settings = openai_settings(fake, workspace_root=str(tmp_path), llm_models="big-model")
        running = serve(channel_settings=channel, **settings)
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            await say(client, srv, "/model big-model")
            asked = await say(client, srv, "write out.txt")
            number = re.search(r"/approve (\d+)", asked)
            assert number, asked
            assert await say(client, srv, f"/approve {number.group(1)}", sender="boss") == "Written."
        assert [r.body["model"] for r in fake.requests] == ["big-model", "big-model"]

"""A turn whose window would overflow the model's context: it consolidates first and
continues; if that is not enough, it continues in a new generation linked to the old one.
The requests the fake model endpoint receives always fit the limit."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.config import Settings
from app.db.models import memories, runs, sessions
from app.sessions.messages import ChatMessage
from app.sessions.tokens import ContextLimits, count_request, estimate_text
from tests.agents.test_session_commands import say, session_rows
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text

SUMMARY = '{"summary": "The user pasted three long notes.", "facts": []}'


def request_tokens(request: Any) -> int:
    """The request as received, counted by the documented estimate (no tiktoken here)."""
    raw = request.body["messages"]
    messages = [
        ChatMessage(
            role=m["role"],
            content=m.get("content") if isinstance(m.get("content"), str) else None,
            tool_calls=tuple(m["tool_calls"]) if m.get("tool_calls") else None,
            tool_call_id=m.get("tool_call_id"),
        )
        for m in raw
    ]
    return count_request(messages, request.body.get("tools") or [], estimate_text)


def chat_requests(fake: FakeOpenAI) -> list[Any]:
    """The agent's requests (the summary call of consolidation has no tools)."""
    return [r for r in fake.requests if r.body.get("tools")]


async def test_overflow_consolidates_first_and_the_request_fits(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.default = text("noted")
        settings = openai_settings(fake)
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            for n in range(3):
                assert await say(client, srv, f"note {n}: " + "lorem ipsum " * 125) == "noted"
        first = request_tokens(fake.requests[0])  # system, tools, one long note
        limit = first + 600  # room for one long note and a bit: three do not fit

        fake.enqueue(text(SUMMARY), text("Here is my answer."))
        small = openai_settings(fake, llm_context_tokens=limit, llm_reply_tokens=0)
        async with serve(**small) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "and what now?") == "Here is my answer."
            rows = await session_rows(srv, "webhook:c1")
            async with srv.runtime.engine.connect() as conn:
                consolidated = (
                    await conn.execute(
                        select(sessions.c.last_consolidated).where(sessions.c.key == "webhook:c1")
                    )
                ).scalar_one()
                summaries = (
                    (await conn.execute(select(memories.c.content).where(memories.c.key.like("summary:%"))))
                    .scalars()
                    .all()
                )
        assert [(r["generation"], r["status"]) for r in rows] == [(1, "active")]  # consolidation was enough
        assert consolidated == 6  # the three notes and their answers are folded
        assert summaries == ["The user pasted three long notes."]
        last = fake.requests[-1]
        assert [m["content"] for m in last.body["messages"] if m["role"] != "system"] == ["and what now?"]
        assert request_tokens(last) <= limit
        assert all(request_tokens(r) <= limit for r in chat_requests(fake)[3:])


async def test_overflow_inside_a_run_continues_in_a_new_linked_generation(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.default = text("hello")
        async with serve(**openai_settings(fake)) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "hi") == "hello"
        limit = request_tokens(fake.requests[0]) + 1300
        pad = "x" * 3000  # about a thousand tokens of arguments per tool call
        first, second = ToolCall("current_time", {"pad": pad}), ToolCall("session_info", {"pad": pad})
        fake.enqueue(calls(first), calls(second), text(SUMMARY), text("done"))
        small = openai_settings(fake, llm_context_tokens=limit, llm_reply_tokens=0)
        async with serve(**small) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "work hard") == "done"
            rows = await session_rows(srv, "webhook:c1")
            async with srv.runtime.engine.connect() as conn:
                gens = dict((await conn.execute(select(sessions.c.generation, sessions.c.id))).all())
                run = (
                    await conn.execute(select(runs.c.session_id, runs.c.outcome).order_by(runs.c.id.desc()))
                ).first()
            listed = await say(client, srv, "/sessions")
        assert [(r["generation"], r["status"]) for r in rows] == [(1, "expired"), (2, "active")]
        assert run is not None and run.session_id == gens[2]  # the run moved with the turn
        link = rows[1]["metadata"]["compacted_from"]
        assert link["generation"] == 1 and link["reason"] == "overflow"
        assert "2. (untitled)" in listed and "from 1" in listed  # the lineage
        last = fake.requests[-1]
        sent = [(m["role"], (m.get("tool_calls") or [{}])[0].get("id")) for m in last.body["messages"]]
        # the exchange carried over: its user message and the newest tool-call group only
        assert sent[1:] == [("user", None), ("assistant", second.id), ("tool", None)]
        assert request_tokens(last) <= limit
        assert all(request_tokens(r) <= limit for r in chat_requests(fake)[1:])


async def test_a_message_too_long_for_the_model_is_answered_without_a_request(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.default = text("hello")
        async with serve(**openai_settings(fake)) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "hi") == "hello"
        limit = request_tokens(fake.requests[0]) + 100
        small = openai_settings(fake, llm_context_tokens=limit, llm_reply_tokens=0)
        chinese = {"webhook": webhook_settings(locale="zh")}
        async with serve(channel_settings=chinese, **small) as srv, httpx.AsyncClient(timeout=30) as client:
            answer = await say(client, srv, "请读一下：" + "很长的文字" * 200)
        assert answer == "你的消息超出了此模型的上下文长度，请发送更短的消息。"
        assert len(chat_requests(fake)) == 1  # only the first turn's: nothing over the limit was sent


def test_context_limits_per_model_and_agent() -> None:
    limits = ContextLimits(8000, {"small": 2000}, reply=500)
    assert limits.budget("big") == 7500
    assert limits.budget("small") == 1500
    assert limits.budget("small", {"small": 4000}) == 3500  # the agent's entry wins
    settings = Settings(llm_context_tokens_by_model="llama3=8192, gpt-4o=128000")  # type: ignore[call-arg]
    assert settings.llm_context_tokens_by_model == {"llama3": 8192, "gpt-4o": 128000}
    with pytest.raises(ValueError, match="MODEL=TOKENS"):
        Settings(llm_context_tokens_by_model="llama3")  # type: ignore[call-arg]


def test_the_estimate_is_not_below_a_real_count_for_english_and_chinese() -> None:
    assert estimate_text("hello world " * 100) >= 200  # ~4 characters a token
    assert estimate_text("你好世界" * 50) >= 200  # ~1 token a character

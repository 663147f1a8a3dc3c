"""The consolidation's own summary request stays within the model's context: a stretch
too long for one request is summarized in chunks whose requests fit, and the partial
summaries are combined. The fake OpenAI server records every request; none exceeds the
limit, every note reached a summary request, and the combined summary is stored."""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy import select

from app.agent.openai_provider import OpenAIProvider
from app.db.models import memories, sessions
from app.memory.summarize import COMBINE_PROMPT, ProviderSummarizer
from app.sessions.messages import ChatMessage
from tests.agents.test_context_overflow import request_tokens
from tests.agents.test_session_commands import say
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, text

COMBINED = "They pasted four long notes, one after another."
COMBINE_START = COMBINE_PROMPT[:60]


def answer(body: dict[str, Any]) -> Reply:
    if body.get("tools"):
        return text("noted")
    system = body["messages"][0]["content"]
    if system.startswith(COMBINE_START):
        return text(COMBINED)
    return text(json.dumps({"summary": "A part with a long note.", "facts": []}))


def summary_requests(fake: FakeOpenAI) -> list[Any]:
    return [r for r in fake.requests if not r.body.get("tools")]


async def test_a_summary_too_long_for_the_context_is_made_in_chunks_that_fit(serve: ServeApp) -> None:
    async with FakeOpenAI(default=answer) as fake:
        narrow = dict(tools_allow="current_time", history_max_messages=2)
        async with serve(**openai_settings(fake, **narrow)) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "hi") == "noted"
        base = request_tokens(fake.requests[0])  # system text, one tool, a short message
        limit = base + 700  # one long note fits a request, the stretch to summarize does not
        settings = openai_settings(
            fake,
            llm_context_tokens=limit,
            llm_reply_tokens=0,
            consolidation_threshold_messages=8,
            consolidation_keep_messages=2,
            **narrow,
        )
        fake.requests.clear()
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            for n in range(4):
                assert await say(client, srv, f"note {n}: " + "lorem ipsum " * 125) == "noted"
            assert await say(client, srv, "and now?") == "noted"  # starts after the consolidation
            async with srv.runtime.engine.connect() as conn:
                consolidated = (
                    await conn.execute(
                        select(sessions.c.last_consolidated).where(sessions.c.key == "webhook:c1")
                    )
                ).scalar_one()
                stored = (
                    (await conn.execute(select(memories.c.content).where(memories.c.key.like("summary:%"))))
                    .scalars()
                    .all()
                )
    summaries = summary_requests(fake)
    chunks = [r for r in summaries if not r.body["messages"][0]["content"].startswith(COMBINE_START)]
    # "hi" (the first server's turn) and notes 0 and 1 with their answers were folded
    assert consolidated == 6
    assert len(chunks) >= 2 and len(summaries) == len(chunks) + 1  # chunks, then one combination
    assert stored == [COMBINED]
    assert all(request_tokens(r) <= limit for r in fake.requests)
    # nothing was dropped: every folded note reached a chunk's request
    sent = " ".join(r.body["messages"][1]["content"] for r in chunks)
    assert all(f"note {n}:" in sent for n in range(2)) and "User: hi" in sent
    # a single request of the whole stretch would not have fitted
    assert sum(request_tokens(r) for r in chunks) > limit


def history_of(*texts: str) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for n, words in enumerate(texts):
        out += [
            ChatMessage(role="user", content=words, seq=2 * n + 1),
            ChatMessage(role="assistant", content="ok", seq=2 * n + 2),
        ]
    return out


async def test_a_message_longer_than_any_request_gets_the_extractive_summary_and_no_request() -> None:
    async with FakeOpenAI(default=answer) as fake:
        provider = OpenAIProvider(
            base_url=fake.url, api_key=None, model="m", max_retries=1, backoff_base=0.01
        )
        summarizer = ProviderSummarizer(provider)
        long = "A very long paste. " + "word " * 400
        alone = [ChatMessage(role="user", content=long, seq=1)]
        summary = await summarizer.summarize(alone, max_chars=500, budget=150)
        assert fake.requests == []  # nothing could fit: nothing was sent
        assert summary.text.startswith("User: A very long paste.")
        # two short exchanges and the long one: the short ones are asked, the long one is not
        summary = await summarizer.summarize(
            history_of("first note", long, "last note"), max_chars=500, budget=150
        )
        assert all(request_tokens(r) <= 150 for r in fake.requests)
        sent = " ".join(r.body["messages"][1]["content"] for r in summary_requests(fake))
        assert "first note" in sent and "last note" in sent and "word word" not in sent
        # the partial summaries did not fit one combining request either: joined, within the cap
        assert COMBINED in summary.text  # some groups of partials were combined by the model
        assert len(summary.text) <= 500

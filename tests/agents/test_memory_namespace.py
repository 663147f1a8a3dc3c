"""An agent's `memory_namespace` separates memory: what one agent's conversations store
(`remember`, facts and summaries of consolidation) the other agent never recalls, neither
at a turn's start nor with the `recall` tool, for the same person. Through the signed
webhook and a fake OpenAI server, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import memories
from tests.agents.test_agents import post, system_text
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text

AGENTS = """
default: plain
agents:
  - name: plain
    system_prompt: You are the plain bot.
  - name: sales
    system_prompt: You are the sales bot.
    memory_namespace: sales
  - name: support
    system_prompt: You are the support bot.
    memory_namespace: support
routes:
  - {chat: sales-dm, agent: sales}
  - {chat: support-dm, agent: support}
"""
BUDGET = "Their budget is 5000 euros"
NAME = "Their name is Zed."


def answer(body: dict[str, Any]) -> Reply:
    """The fake model: summaries for consolidation, a tool call per request word, and the
    tool's result as the answer (so the reply shows what `recall` found)."""
    if not body.get("tools"):
        return text(json.dumps({"summary": "They talked.", "facts": []}))
    last = body["messages"][-1]
    if last["role"] == "tool":
        return text("found " + last["content"])
    words = str(last.get("content") or "")
    if words.startswith("remember"):
        return calls(ToolCall("remember", {"content": BUDGET}))
    if words.startswith("what do you recall"):
        return calls(ToolCall("recall", {"scope": "all"}))
    return text("ok")


async def test_two_agents_with_different_namespaces_never_recall_each_others_memory(
    serve: ServeApp, tmp_path: Path
) -> None:
    agents_file = tmp_path / "agents.yaml"
    agents_file.write_text(AGENTS)
    async with FakeOpenAI(default=answer) as fake:
        settings = openai_settings(
            fake,
            agents_file=str(agents_file),
            consolidation_threshold_messages=2,
            consolidation_keep_messages=1,
        )
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "My name is Zed.", chat="sales-dm") == "ok"
            assert (await post(client, srv, "remember my budget", chat="sales-dm")).startswith("found")
            in_sales = await post(client, srv, "what do you recall?", chat="sales-dm")
            in_support = await post(client, srv, "what do you recall?", chat="support-dm")
            in_plain = await post(client, srv, "what do you recall?", chat="plain-dm")
            async with srv.runtime.engine.connect() as conn:
                stored = {
                    (r.content, r.scope, r.namespace)
                    for r in await conn.execute(
                        select(memories.c.content, memories.c.scope, memories.c.namespace)
                    )
                }
    # the sales agent's notes and consolidation facts are in its namespace
    assert (BUDGET, "user", "sales") in stored and (NAME, "user", "sales") in stored
    assert ("They talked.", "session", "sales") in stored
    # the recall tool: sales finds both, the others nothing of it
    assert BUDGET in in_sales and NAME in in_sales
    assert BUDGET not in in_support and NAME not in in_support
    assert BUDGET not in in_plain and NAME not in in_plain
    # the recall at a turn's start: same
    by_agent: dict[str, list[str]] = {"sales": [], "support": [], "plain": []}
    for request in fake.requests:
        if request.body.get("tools"):
            agent = next(a for a in by_agent if f"You are the {a} bot." in system_text(request))
            by_agent[agent].append(system_text(request))
    assert any(BUDGET in s and NAME in s for s in by_agent["sales"])
    assert by_agent["support"] and by_agent["plain"]
    assert not any(BUDGET in s or NAME in s for s in by_agent["support"] + by_agent["plain"])

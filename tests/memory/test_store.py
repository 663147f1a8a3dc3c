"""The memory store, identity links, the model's memory tools and the operator CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.tools import ToolContext, ToolError
from app.db.models import memories
from app.memory import IdentityLinks, identity_of
from app.memory.__main__ import build_parser, run
from app.memory.recall import MemoryRecall, RecallTool, RememberTool
from app.memory.store import GLOBAL_OWNER, MemoryStore, OwnerFilter, Scope
from app.memory.summarize import ExtractiveSummarizer, extract_facts
from app.sessions.messages import ChatMessage, tool_call
from tests.conftest import make_settings


async def _zero() -> int:
    return 0


def ctx(sender: str, key: str, session_id: int, channel: str = "webhook") -> ToolContext:
    return ToolContext(
        session_id=session_id,
        session_key=key,
        channel=channel,
        chat_id=key,
        sender_id=sender,
        thread_id=None,
        message_count=_zero,
    )


def test_facts_are_first_person_statements_not_questions() -> None:
    facts = {f.key: f.content for f in extract_facts("Hi! My name is Ada Lovelace. I prefer tea, thanks.")}
    assert facts == {"name": "Their name is Ada Lovelace.", "prefers:tea": "They prefer tea."}
    assert extract_facts("Do I prefer tea?") == []
    assert extract_facts("what is my name?") == []
    assert [f.content for f in extract_facts("I live in Porto\nI'm allergic to peanuts.")] == [
        "They live in Porto.",
        "They are allergic to peanuts.",
    ]
    assert [f.content for f in extract_facts("my favourite colour is green.")] == [
        "Their favourite colour is green."
    ]
    assert [f.key for f in extract_facts("我叫小明。我喜欢茶")] == ["name", "likes:茶"]


async def test_extractive_summary_is_deterministic_and_bounded() -> None:
    history = [ChatMessage(role="user", content=f"Question {i}. Details follow here.") for i in range(50)]
    history.insert(1, ChatMessage(role="assistant", tool_calls=(tool_call("c", "current_time", {}),)))
    history.insert(2, ChatMessage(role="tool", content="{}", tool_call_id="c"))
    history.insert(3, ChatMessage(role="assistant", content="It is noon. Anything else?"))
    s = ExtractiveSummarizer()
    one = (await s.summarize(history, max_chars=400)).text
    assert one == (await s.summarize(history, max_chars=400)).text
    assert len(one) <= 400
    assert one.startswith("User: Question 0.\nAssistant: It is noon.")
    assert "more lines)" in one and "Tools used: current_time ×1" in one


async def test_one_entry_per_key_and_owner_filters(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    await store.put(Scope.USER, "webhook:a", "They like tea.", key="fact:likes:tea", kind="fact")
    await store.put(Scope.USER, "webhook:a", "They like tea a lot.", key="fact:likes:tea", kind="fact")
    await store.put(Scope.USER, "webhook:b", "They like coffee.", key="fact:likes:coffee", kind="fact")
    await store.put(Scope.USER, "webhook:a", "Same text twice.")
    await store.put(Scope.USER, "webhook:a", "same   TEXT twice.")  # same note key
    a = await store.entries([OwnerFilter(Scope.USER, "webhook:a")])
    assert sorted(m.content for m in a) == ["They like tea a lot.", "same   TEXT twice."]
    assert len(a) == 2
    await store.put(Scope.USER, "webhook:a", "Tea, corrected.", key="fact:likes:tea", kind="correction")
    [tea] = [
        m for m in await store.entries([OwnerFilter(Scope.USER, "webhook:a")]) if m.key == "fact:likes:tea"
    ]
    assert (tea.content, tea.kind) == ("Tea, corrected.", "correction")  # metadata replaced too
    hits = await store.search([OwnerFilter(Scope.USER, "webhook:b")], "tea coffee")
    assert [m.content for m in hits] == ["They like coffee."]
    with pytest.raises(ValueError):
        await store.put(Scope.USER, "webhook:a", "   ")


async def test_linking_moves_memory_to_the_person_and_unlinking_stops_sharing(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    links = IdentityLinks(engine)
    tg, sl = identity_of("telegram", "42"), identity_of("slack", "U1")
    await store.put(Scope.USER, tg, "Telegram fact.", key="fact:a")
    await store.put(Scope.USER, sl, "Slack fact.", key="fact:b")
    await store.put(Scope.USER, sl, "Slack duplicate of a.", key="fact:a")
    await links.link(tg, "alice")
    await links.link(sl, "alice")
    recall = MemoryRecall(store)
    for who in (ctx("42", "telegram:42", 1, "telegram"), ctx("U1", "slack:D1", 2, "slack")):
        [flt] = await recall.filters(who, (Scope.USER,))
        assert flt.owner == "person:alice"
    person = await store.entries([OwnerFilter(Scope.USER, "person:alice")])
    assert sorted(m.content for m in person) == ["Slack fact.", "Telegram fact."]
    assert await store.entries([OwnerFilter(Scope.USER, tg)]) == []
    assert await links.identities("alice") == [
        {"identity": sl, "person_id": "alice"},
        {"identity": tg, "person_id": "alice"},
    ]
    assert await links.unlink(sl)
    [flt] = await recall.filters(ctx("U1", "slack:D1", 2, "slack"), (Scope.USER,))
    assert flt.owner == sl
    with pytest.raises(ValueError):
        await links.link(tg, "not a valid id!")
    with pytest.raises(ValueError):
        await links.link("no-colon", "bob")


async def test_identity_components_are_escaped() -> None:
    assert identity_of("a:b", "c") != identity_of("a", "b:c")


async def tool(t: Any, args: dict[str, Any], who: ToolContext) -> Any:
    return json.loads(await t.run(args, who))


async def test_tools_write_and_search_only_the_allowed_scopes(engine: AsyncEngine) -> None:
    store = MemoryStore(engine)
    recall = MemoryRecall(store)
    remember, search = RememberTool(recall), RecallTool(recall)
    alice = ctx("alice", "webhook:a", 1)
    bob = ctx("bob", "webhook:b", 2)
    await store.put(Scope.GLOBAL, GLOBAL_OWNER, "The shop opens at nine.")
    assert await tool(remember, {"content": "Alice's passport number is X123."}, alice) == {
        "stored": True,
        "scope": "user",
    }
    await tool(remember, {"content": "This chat plans the passport renewal.", "scope": "session"}, alice)
    await tool(remember, {"content": "Bob has a passport too.", "key": "passport"}, bob)

    found = await tool(search, {"query": "passport"}, alice)
    assert sorted(m["content"] for m in found["memories"]) == [
        "Alice's passport number is X123.",
        "This chat plans the passport renewal.",
    ]
    found = await tool(search, {"query": "passport", "scope": "all"}, bob)
    assert [m["content"] for m in found["memories"]] == ["Bob has a passport too."]
    found = await tool(search, {"query": "shop", "scope": "global"}, bob)
    assert [m["content"] for m in found["memories"]] == ["The shop opens at nine."]
    # A new generation of the same key starts with an empty session memory.
    later = ctx("alice", "webhook:a", 3)
    found = await tool(search, {"query": "renewal"}, later)
    assert found["memories"] == []
    # A keyed fact is replaced, not duplicated.
    await tool(remember, {"content": "Bob renewed his passport.", "key": "passport"}, bob)
    found = await tool(search, {"query": "passport"}, bob)
    assert [m["content"] for m in found["memories"]] == ["Bob renewed his passport."]

    with pytest.raises(ToolError):
        await remember.run({"content": "x", "scope": "global"}, alice)  # the model cannot write global
    with pytest.raises(ToolError):
        await remember.run({"content": ""}, alice)
    with pytest.raises(ToolError):
        await search.run({"scope": "everyone"}, alice)


async def test_operator_cli_links_identities_and_manages_global_facts(
    engine: AsyncEngine, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(db_url)

    async def cli(*argv: str) -> int:
        return await run(build_parser().parse_args(list(argv)), settings)

    assert await cli("link", "telegram:42", "alice") == 0
    assert await cli("link", "slack:U:1", "alice") == 0  # the sender id may contain colons
    assert await cli("global", "add", "Support hours are 9-17.") == 0
    assert await cli("links", "alice") == 0
    out = capsys.readouterr().out
    assert identity_of("slack", "U:1") in out and identity_of("telegram", "42") in out
    assert await cli("global", "list") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    memory_id, kind, content = line.split("\t")
    assert (kind, content) == ("operator", "Support hours are 9-17.")
    assert await cli("link", "telegram:42", "bad id") == 2
    assert await cli("global", "remove", memory_id) == 0
    async with engine.connect() as conn:
        left = (await conn.execute(select(memories.c.id).where(memories.c.scope == "global"))).all()
    assert left == []


async def test_scheduled_runs_have_no_user_memory(engine: AsyncEngine) -> None:
    """A cron fire's sender is the scheduler, the same for every job: it must not become
    a shared personal memory across everyone's reminders."""
    recall = MemoryRecall(MemoryStore(engine))
    fire = ctx("cron", "webhook:alice-dm", 1, channel="cron")
    assert [f.scope for f in await recall.filters(fire)] == [Scope.SESSION, Scope.GLOBAL]
    with pytest.raises(ToolError):
        await RememberTool(recall).run({"content": "They like tea."}, fire)
    await RememberTool(recall).run({"content": "Reminder sent.", "scope": "session"}, fire)
    assert "Reminder sent." in (await recall.context(fire) or "")

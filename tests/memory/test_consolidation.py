"""Consolidation against a real database (both backends): legal boundaries, the lease,
nothing lost or duplicated while messages keep arriving, and the summary recalled."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import event as sa_event
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.tools import ToolContext
from app.db.models import memories, sessions, utcnow
from app.errors import LeaseLost
from app.events import InboundEvent
from app.memory.consolidation import ConsolidationLimits, Consolidator
from app.memory.identity import identity_of
from app.memory.recall import MemoryRecall
from app.memory.store import MemoryStore, OwnerFilter, Scope
from app.memory.summarize import ExtractiveSummarizer, Summary
from app.sessions import lease as leases
from app.sessions.lease import SessionLease, check_fence
from app.sessions.messages import ChatMessage, tool_call
from app.sessions.store import Lifecycle, SessionState, SessionStore
from app.sessions.window import is_legal_provider_input, trim_to_legal_window
from tests.conftest import WEBHOOK_SECRET, ServeApp
from tests.memory.support import RecordingProvider, say
from tests.memory.test_boundary import histories, legal
from tests.support.pipeline import accept_elsewhere
from tests.support.webhook import post_webhook


def random_turns(rng: random.Random, turns: int, tag: str) -> list[ChatMessage]:
    """Turns as the agent writes them; some runs crash mid-group (partial results, no
    answer), some of those were resumed (the missing results appended as repairs)."""
    out: list[ChatMessage] = []
    for t in range(turns):
        out.append(ChatMessage(role="user", content=f"{tag} turn {t}. I prefer option {t}."))
        crashed = False
        for g in range(rng.randint(0, 2)):
            ids = [f"{tag}-{t}-{g}-{i}" for i in range(rng.randint(1, 3))]
            out.append(ChatMessage(role="assistant", tool_calls=tuple(tool_call(i, "t", {}) for i in ids)))
            rng.shuffle(ids)
            cut = len(ids) if rng.random() < 0.8 else rng.randint(0, len(ids) - 1)
            out += [ChatMessage(role="tool", content="r", tool_call_id=i, name="t") for i in ids[:cut]]
            if cut < len(ids):
                if rng.random() < 0.5:  # resumed: repairs for the unanswered calls
                    out += [
                        ChatMessage(role="tool", content="x", tool_call_id=i, name="t") for i in ids[cut:]
                    ]
                else:
                    crashed = True
                    break
        if not crashed:
            out.append(ChatMessage(role="assistant", content=f"answer {t}"))
    return out


async def open_session(
    engine: AsyncEngine, store: SessionStore, key: str
) -> tuple[SessionLease, SessionState]:
    lease = await leases.acquire(engine, key, "worker-1", 60)
    assert lease is not None
    async with engine.begin() as conn:
        await check_fence(conn, lease)
        session = await store.open_current(conn, key, "webhook")
    return lease, session


async def append(
    engine: AsyncEngine, store: SessionStore, lease: SessionLease, sid: int, new: Sequence[ChatMessage]
) -> None:
    async with engine.begin() as conn:
        await check_fence(conn, lease)
        await store.append(conn, sid, new)


async def db_state(engine: AsyncEngine, sid: int) -> tuple[int, list[ChatMessage]]:
    store = SessionStore(engine, Lifecycle())
    async with engine.connect() as conn:
        lc = (
            await conn.execute(select(sessions.c.last_consolidated).where(sessions.c.id == sid))
        ).scalar_one()
    return lc, await store.all_messages(sid)


async def summary_ranges(engine: AsyncEngine, key: str) -> list[tuple[int, int]]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(memories.c.metadata).where(memories.c.scope == "session", memories.c.owner == key)
            )
        ).all()
    return sorted((r[0]["from_seq"], r[0]["to_seq"]) for r in rows if r[0].get("kind") == "summary")


def tiny(keep: int) -> ConsolidationLimits:
    return ConsolidationLimits(threshold_messages=keep + 1, threshold_tokens=10**9, keep_messages=keep)


async def test_random_histories_always_consolidate_to_a_legal_boundary(engine: AsyncEngine) -> None:
    store = SessionStore(engine, Lifecycle())
    for seed in range(12):
        rng = random.Random(seed)
        key = f"webhook:random-{seed}"
        lease, session = await open_session(engine, store, key)
        written = 0
        for step in range(rng.randint(3, 7)):
            chunk = random_turns(rng, rng.randint(1, 3), f"s{seed}x{step}")
            await append(engine, store, lease, session.id, chunk)
            written += len(chunk)
            keep = rng.randint(1, 6)
            await Consolidator(engine, ExtractiveSummarizer(), tiny(keep)).consolidate(lease, session.id)
            lc, history = await db_state(engine, session.id)
            assert [m.seq for m in history] == list(range(1, written + 1))  # nothing lost or rewritten
            if lc:
                assert legal(history, lc), (seed, step, lc)
                assert history[lc].role == "user"
                # What the model is given from there is legal, as before consolidation.
                window = trim_to_legal_window(history[lc:], max_messages=100)
                assert is_legal_provider_input(window)
        lc, _ = await db_state(engine, session.id)
        ranges = await summary_ranges(engine, key)
        if lc:  # summaries tile 1..last_consolidated without gaps or overlaps
            assert ranges[0][0] == 1 and ranges[-1][1] == lc
            assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))


class GateSummarizer(ExtractiveSummarizer):
    """Holds the summary until the test lets it go (a slow model)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def summarize(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_chars: int,
        want_facts: bool = False,
        budget: int | None = None,
    ) -> Summary:
        self.started.set()
        await self.release.wait()
        return await super().summarize(messages, max_chars=max_chars)


async def test_messages_appended_during_consolidation_are_kept(engine: AsyncEngine) -> None:
    store = SessionStore(engine, Lifecycle())
    lease, session = await open_session(engine, store, "webhook:busy")
    await append(engine, store, lease, session.id, random_turns(random.Random(1), 5, "old"))
    gate = GateSummarizer()
    task = asyncio.create_task(Consolidator(engine, gate, tiny(2)).consolidate(lease, session.id))
    await gate.started.wait()
    late = random_turns(random.Random(2), 3, "late")
    await append(engine, store, lease, session.id, late)  # arrives while the summary is made
    gate.release.set()
    boundary = await task
    assert boundary is not None
    lc, history = await db_state(engine, session.id)
    assert lc == boundary and legal(history, lc)
    assert [m.seq for m in history] == list(range(1, len(history) + 1))
    assert [m.content for m in history[-len(late) :]] == [m.content for m in late]
    assert is_legal_provider_input(history[lc:])


async def test_consolidation_that_lost_its_lease_writes_nothing(engine: AsyncEngine) -> None:
    store = SessionStore(engine, Lifecycle())
    lease, session = await open_session(engine, store, "webhook:taken")
    await append(engine, store, lease, session.id, random_turns(random.Random(3), 6, "t"))
    gate = GateSummarizer()
    task = asyncio.create_task(Consolidator(engine, gate, tiny(2)).consolidate(lease, session.id))
    await gate.started.wait()
    # Another replica takes the key over (our lease expired while the model was slow).
    other = await leases.acquire(engine, lease.key, "worker-2", 60, now=utcnow() + timedelta(seconds=120))
    assert other is not None
    gate.release.set()
    with pytest.raises(LeaseLost):
        await task
    lc, _ = await db_state(engine, session.id)
    assert lc == 0
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(memories))).scalar_one() == 0


async def test_webhook_events_during_consolidation_lose_and_duplicate_nothing(serve: ServeApp) -> None:
    """Events keep arriving (a burst through the signed webhook) while every turn ends with
    a consolidation pass (tiny threshold); afterwards the history is complete and legal."""
    n = 30
    async with (
        serve(consolidation_threshold_messages=3, consolidation_keep_messages=2) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        texts = [f"what time is it? #{i}" if i % 3 == 0 else f"I like topic {i}. More." for i in range(n)]
        posted = await asyncio.gather(
            *(
                post_webhook(
                    client, srv.url, WEBHOOK_SECRET, {"chat_id": "busy", "sender_id": "u", "text": t}
                )
                for t in texts
            )
        )
        event_ids = [r.json()["event_id"] for r in posted]
        for event_id in event_ids:
            assert (await srv.runtime.waiters.wait_for_replies(event_id, 30)).done
        runtime = srv.runtime
        # Replies are committed before the after-turn consolidation pass runs: wait until
        # the key's worker is idle, so the session row and the summaries are read settled.
        for _ in range(200):
            if not runtime.scheduler.busy_keys:
                break
            await asyncio.sleep(0.05)
        assert not runtime.scheduler.busy_keys
        async with runtime.engine.connect() as conn:
            sid, lc = (
                await conn.execute(
                    select(sessions.c.id, sessions.c.last_consolidated).where(
                        sessions.c.key == "webhook:busy"
                    )
                )
            ).one()
        history = await runtime.sessions.all_messages(sid)
        ranges = await summary_ranges(runtime.engine, "webhook:busy")
    assert [m.seq for m in history] == list(range(1, len(history) + 1))
    user_events = [m.event_id for m in history if m.role == "user"]
    assert sorted(user_events) == sorted(event_ids)  # every event once, none twice
    assert lc > 0 and legal(history, lc)
    assert is_legal_provider_input(history[lc:])
    assert ranges[0][0] == 1 and ranges[-1][1] == lc
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))


async def test_summary_is_recalled_into_the_next_run(serve: ServeApp) -> None:
    provider = RecordingProvider()
    async with (
        serve(provider=provider, consolidation_threshold_messages=4, consolidation_keep_messages=2) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await say(client, srv.url, "sum", "u", "We are planning the harbour festival.")
        await say(client, srv.url, "sum", "u", "It starts on Friday.")
        await say(client, srv.url, "sum", "u", "Who brings the lanterns?")
        mark = len(provider.calls)
        await say(client, srv.url, "sum", "u", "What were we planning?")
        system = provider.since(mark)[0][0].content or ""
        assert "SUMMARY[User: We are planning the harbour festival.]" in system
        # One sender in the folded part: the model's facts about them became user memory.
        about_user = system.split("About the person you are talking to:")[1]
        assert "They once said: User: We are planning the harbour festival." in about_user
        # The consolidated messages themselves are no longer in the model input.
        window = provider.since(mark)[0][1:]
        assert all("harbour festival" not in (m.content or "") for m in window)


async def test_offline_path_uses_the_extractive_summary(serve: ServeApp) -> None:
    async with (
        serve(consolidation_threshold_messages=4, consolidation_keep_messages=2) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await say(client, srv.url, "off", "u", "My name is Ada. I work on engines.")
        await say(client, srv.url, "off", "u", "what time is it?")
        await say(client, srv.url, "off", "u", "thanks!")
        runtime = srv.runtime
        async with runtime.engine.connect() as conn:
            sid = (
                await conn.execute(select(sessions.c.id).where(sessions.c.key == "webhook:off"))
            ).scalar_one()

        async def count() -> int:
            return 0

        ctx = ToolContext(
            session_id=sid,
            session_key="webhook:off",
            channel="webhook",
            chat_id="off",
            sender_id="u",
            thread_id=None,
            message_count=count,
        )
        text = await MemoryRecall(MemoryStore(runtime.engine)).context(ctx) or ""
        assert "User: My name is Ada." in text  # session summary (extractive, deterministic)
        assert "Their name is Ada." in text  # user fact


async def test_token_threshold_triggers_before_the_message_threshold(engine: AsyncEngine) -> None:
    store = SessionStore(engine, Lifecycle())
    lease, session = await open_session(engine, store, "webhook:long")
    limits = ConsolidationLimits(threshold_messages=100, threshold_tokens=1500, keep_messages=2)
    consolidator = Consolidator(engine, ExtractiveSummarizer(), limits)
    short = [ChatMessage(role=r, content="short") for r in ("user", "assistant") * 3]
    await append(engine, store, lease, session.id, short)
    assert await consolidator.consolidate(lease, session.id) is None  # 6 short messages: not due
    long = [ChatMessage(role=r, content="word " * 400) for r in ("user", "assistant") * 2]
    await append(engine, store, lease, session.id, long)
    boundary = await consolidator.consolidate(lease, session.id)
    lc, history = await db_state(engine, session.id)
    assert boundary == lc == 8 and legal(history, lc)


class FlagSummarizer(ExtractiveSummarizer):
    """Records whether facts were asked for, and offers one model fact when they were."""

    def __init__(self) -> None:
        self.asked: list[bool] = []

    async def summarize(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_chars: int,
        want_facts: bool = False,
        budget: int | None = None,
    ) -> Summary:
        self.asked.append(want_facts)
        return Summary("summary", ["They are a model-made fact."] if want_facts else [])


async def test_model_facts_only_for_a_single_sender_and_attributed_to_them(engine: AsyncEngine) -> None:
    store = SessionStore(engine, Lifecycle())
    lease, session = await open_session(engine, store, "webhook:room")
    events = [
        InboundEvent.from_text("webhook", "room", sender, text, chat_type="group")
        for sender, text in [
            ("alice", "I like tea."),
            ("bob", "I like chess."),
            ("alice", "ok"),
            ("bob", "ok"),
        ]
    ]
    await accept_elsewhere(engine, events)
    history: list[ChatMessage] = []
    for e in events:
        history += [
            ChatMessage(role="user", content=e.text, event_id=e.event_id),
            ChatMessage(role="assistant", content="a"),
        ]
    await append(engine, store, lease, session.id, history)
    summarizer = FlagSummarizer()
    limits = ConsolidationLimits(threshold_messages=3, threshold_tokens=10**9, keep_messages=2)
    assert await Consolidator(engine, summarizer, limits).consolidate(lease, session.id) == 6
    assert summarizer.asked == [False]  # two speakers: no model facts
    mem = MemoryStore(engine)
    alice = await mem.entries([OwnerFilter(Scope.USER, identity_of("webhook", "alice"))])
    bob = await mem.entries([OwnerFilter(Scope.USER, identity_of("webhook", "bob"))])
    assert [m.content for m in alice] == ["They like tea."]  # deterministic facts, per sender
    assert [m.content for m in bob] == ["They like chess."]

    lease2, dm = await open_session(engine, store, "webhook:dm-alice")
    solo = [InboundEvent.from_text("webhook", "dm-alice", "alice", t) for t in ("hello", "more", "end")]
    await accept_elsewhere(engine, solo)
    msgs: list[ChatMessage] = []
    for e in solo:
        msgs += [
            ChatMessage(role="user", content=e.text, event_id=e.event_id),
            ChatMessage(role="assistant", content="a"),
        ]
    await append(engine, store, lease2, dm.id, msgs)
    assert await Consolidator(engine, summarizer, limits).consolidate(lease2, dm.id) == 4
    assert summarizer.asked == [False, True]
    alice = await mem.entries([OwnerFilter(Scope.USER, identity_of("webhook", "alice"))])
    assert sorted(m.content for m in alice) == ["They are a model-made fact.", "They like tea."]
    assert [
        m.content for m in await mem.entries([OwnerFilter(Scope.USER, identity_of("webhook", "bob"))])
    ] == ["They like chess."]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=histories(), keeps=st.lists(st.integers(1, 6), min_size=1, max_size=4))
async def test_hypothesis_histories_consolidate_legally_in_the_database(
    engine: AsyncEngine, history: list[ChatMessage], keeps: list[int]
) -> None:
    """The real consolidator on random histories (crashes, repairs, steered input), stored
    in SQLite and PostgreSQL, passes after pass: always a legal boundary, nothing rewritten."""
    store = SessionStore(engine, Lifecycle())
    lease, session = await open_session(engine, store, f"webhook:h-{uuid.uuid4().hex}")
    await append(engine, store, lease, session.id, [replace(m, seq=None) for m in history])
    for keep in keeps:
        await Consolidator(engine, ExtractiveSummarizer(), tiny(keep)).consolidate(lease, session.id)
        lc, stored = await db_state(engine, session.id)
        assert [(m.role, m.tool_call_id) for m in stored] == [(m.role, m.tool_call_id) for m in history]
        event("consolidated" if lc else "nothing due")
        if lc:
            assert legal(stored, lc)


async def test_the_after_turn_hook_asks_nothing_while_at_most_keep_messages_are_pending(
    engine: AsyncEngine,
) -> None:
    store = SessionStore(engine, Lifecycle())
    lease, session = await open_session(engine, store, "webhook:hook")
    consolidator = Consolidator(engine, ExtractiveSummarizer(), tiny(4))  # due from 5 pending
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    sa_event.listen(engine.sync_engine, "before_cursor_execute", seen)
    turn = [ChatMessage(role=r, content="hello") for r in ("user", "assistant")]
    await append(engine, store, lease, session.id, turn * 2)
    statements.clear()
    await consolidator(lease, replace(session, next_seq=5))  # as the turn left it: 4 pending
    assert statements == []
    lc, _ = await db_state(engine, session.id)
    assert lc == 0
    await append(engine, store, lease, session.id, turn)
    await consolidator(lease, replace(session, next_seq=7))  # 6 pending: due
    assert statements
    lc, history = await db_state(engine, session.id)
    assert lc == 2 and legal(history, lc)

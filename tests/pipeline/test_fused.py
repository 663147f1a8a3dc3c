"""PostgreSQL's one-statement turn start and end (`app.pipeline.fused`), at the statement level.

The whole suite runs turns through them on PostgreSQL and through the transaction path on
SQLite; these tests pin the cases the statements must refuse: a lost lease writes nothing,
and a start that is not the common case writes nothing and leaves the general path to it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import autocommit
from app.db.models import inbox, messages, outbox, runs, session_keys, sessions, utcnow
from app.errors import LeaseLost
from app.events import InboundEvent
from app.memory.identity import identity_of
from app.memory.recall import MemoryRecall, recall_query
from app.memory.store import GLOBAL_OWNER, MemoryStore, Scope
from app.pipeline import fused
from app.pipeline.inbox import Inbox
from app.sessions import lease as leases
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import Lifecycle, SessionStore, message_values
from app.sessions.window import trim_to_legal_window
from tests.conftest import ServeApp

KEY = "webhook:c"


async def _with_session(engine: AsyncEngine, *history: ChatMessage) -> tuple[SessionStore, SessionLease, int]:
    """A key with an open session holding `history`, its lease, and a new pending event's row id."""
    store = SessionStore(engine, Lifecycle())
    lease = await leases.acquire(engine, KEY, "me", ttl=30)
    assert lease is not None
    async with engine.begin() as conn:
        await leases.check_fence(conn, lease)
        session = await store.open_current(conn, KEY, "webhook")
        await store.append(conn, session.id, list(history))
    inbox_ = Inbox(engine)
    [accepted] = await inbox_.accept([InboundEvent.from_text("webhook", "c", "u", "hello")])
    [row] = await inbox_.next_rows(KEY, limit=1)
    assert row.event_id == accepted.event_id
    return store, lease, row.id


def plan(event_id: str = "e1", content: str = "hello", **overrides: Any) -> fused.StartPlan:
    """The start of a turn of the user message `content` of `event_id`, on the webhook channel."""
    now = utcnow()
    args: dict[str, Any] = dict(
        channel="webhook",
        cutoff=now - timedelta(hours=24),
        now=now,
        message=message_values(ChatMessage(role="user", content=content, event_id=event_id), None),
        run=dict(
            session_key=KEY,
            event_ids=[event_id],
            provider="offline",
            model=None,
            tool_calls=[],
            started_at=now,
            outcome="running",
            details={},
            iterations=0,
            prompt_tokens=0,
            completion_tokens=0,
        ),
        window_limit=50,
        recall=None,
    )
    args.update(overrides)
    return fused.plan_start(**args)


async def _start(engine: AsyncEngine, lease: SessionLease, inbox_id: int, **overrides: Any) -> Any:
    async with autocommit(engine).connect() as conn:
        return await fused.start(conn, lease, inbox_id, plan(**overrides))


async def finish(
    engine: AsyncEngine,
    lease: SessionLease,
    started: Any,
    row_id: int,
    answer: str,
    *,
    release: bool = False,
    successor: fused.Successor | None = None,
) -> Any:
    """`fused.finish` of the turn `_start` started for the inbox row `row_id`, answering `answer`."""
    now = utcnow()
    async with autocommit(engine).connect() as conn:
        return await fused.finish(
            conn,
            lease,
            session_id=started.session.id,
            now=now,
            message=message_values(ChatMessage(role="assistant", content=answer), started.run_id),
            reply=dict(
                message_id=uuid.uuid4().hex,
                session_key=KEY,
                session_id=started.session.id,
                run_id=started.run_id,
                event_id="e1",
                channel="webhook",
                chat_id="c",
                payload={},
                status="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
                sent_at=None,
            ),
            inbox_ids=[row_id],
            link=started.run_id,
            run_id=started.run_id,
            release=release,
            successor=successor,
            trace={
                "outcome": "answered",
                "tool_calls": [],
                "details": {},
                "event_ids": ["e1"],
                "iterations": 1,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "finished_at": now,
            },
        )


async def _counts(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        return {
            "messages": (await conn.execute(select(func.count()).select_from(messages))).scalar_one(),
            "runs": (await conn.execute(select(func.count()).select_from(runs))).scalar_one(),
            "outbox": (await conn.execute(select(func.count()).select_from(outbox))).scalar_one(),
            "inbox": (await conn.execute(select(inbox.c.status, inbox.c.attempts))).all(),
            "next_seq": (await conn.execute(select(sessions.c.next_seq))).scalars().all(),
        }


ANSWERED = (ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="hello"))


async def test_the_common_start_writes_message_run_and_inbox_status_together(pg_engine: AsyncEngine) -> None:
    store, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    started = await _start(pg_engine, lease, row_id)
    assert started is not None
    assert started.seq == 3 and started.session.next_seq == 4 and started.session.status == "active"
    after = await _counts(pg_engine)
    assert after["messages"] == 3 and after["runs"] == 1
    assert after["inbox"] == [("processing", 1)]
    [stored] = [m for m in await store.all_messages(started.session.id) if m.seq == 3]
    assert (stored.role, stored.content, stored.event_id) == ("user", "hello", "e1")
    async with pg_engine.connect() as conn:
        run = (await conn.execute(select(runs))).mappings().one()
    assert run["id"] == started.run_id and run["session_id"] == started.session.id


async def test_a_lost_lease_writes_nothing_at_the_start_or_the_end(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    started = await _start(pg_engine, lease, row_id)
    assert started is not None
    later = utcnow() + timedelta(seconds=31)
    assert await leases.acquire(pg_engine, KEY, "another", ttl=30, now=later) is not None
    before = await _counts(pg_engine)
    with pytest.raises(LeaseLost):
        await _start(pg_engine, lease, row_id)
    with pytest.raises(LeaseLost):  # nor would it open a new generation
        await _start(pg_engine, lease, row_id, cutoff=utcnow() + timedelta(seconds=1))
    with pytest.raises(LeaseLost):
        await finish(pg_engine, lease, started, row_id, "late")
    assert await _counts(pg_engine) == before


@pytest.mark.parametrize("case", ["open tool-call group", "other channel", "other channel, idle"])
async def test_anything_but_the_common_starts_writes_nothing(pg_engine: AsyncEngine, case: str) -> None:
    overrides: dict[str, Any] = {}
    if case == "open tool-call group":
        call = {"id": "call_1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
        asked = ChatMessage(role="assistant", tool_calls=(call,))
        _, lease, row_id = await _with_session(pg_engine, ChatMessage(role="user", content="hi"), asked)
    else:
        _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
        overrides["channel"] = "telegram"
        if case == "other channel, idle":  # idle by telegram's lifecycle: not ours to expire
            overrides["cutoff"] = utcnow() + timedelta(seconds=1)
    before = await _counts(pg_engine)
    assert await _start(pg_engine, lease, row_id, **overrides) is None
    assert await _counts(pg_engine) == before


@pytest.mark.parametrize("case", ["new key", "idle too long", "closed by /new"])
async def test_a_key_without_a_live_session_opens_a_new_generation(pg_engine: AsyncEngine, case: str) -> None:
    overrides: dict[str, Any] = {}
    if case == "new key":
        lease = await leases.acquire(pg_engine, KEY, "me", ttl=30)
        assert lease is not None
        await Inbox(pg_engine).accept([InboundEvent.from_text("webhook", "c", "u", "hello")])
        async with pg_engine.connect() as conn:
            row_id = (await conn.execute(select(inbox.c.id))).scalar_one()
    else:
        store, lease, row_id = await _with_session(pg_engine, *ANSWERED)
        if case == "idle too long":
            overrides["cutoff"] = utcnow() + timedelta(seconds=1)
        else:
            async with pg_engine.begin() as conn:
                await leases.check_fence(conn, lease)
                await store.close_current(conn, KEY)
    started = await _start(pg_engine, lease, row_id, **overrides)
    assert started is not None
    generation = 1 if case == "new key" else 2
    assert (started.session.generation, started.session.status, started.seq) == (generation, "active", 1)
    assert started.session.next_seq == 2
    async with pg_engine.connect() as conn:
        found = (await conn.execute(select(sessions).order_by(sessions.c.id))).mappings().all()
        current = (await conn.execute(select(session_keys.c.current_session_id))).scalar_one()
        run = (await conn.execute(select(runs))).mappings().one()
    assert [(r["generation"], r["status"]) for r in found] == [
        *([] if case == "new key" else [(1, "expired")]),
        (generation, "active"),
    ]
    assert all(r["closed_at"] is not None for r in found if r["status"] == "expired")
    assert current == started.session.id == run["session_id"] == found[-1]["id"]
    after = await _counts(pg_engine)
    assert after["inbox"] == [("processing", 1)]
    [first] = await SessionStore(pg_engine, Lifecycle()).all_messages(started.session.id)
    assert (first.seq, first.role, first.content) == (1, "user", "hello")


async def test_a_suspended_session_is_reactivated_by_the_common_start(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    async with pg_engine.begin() as conn:
        await conn.execute(update(sessions).values(status="suspended"))
    started = await _start(pg_engine, lease, row_id)
    assert started is not None and started.session.status == "active"
    async with pg_engine.connect() as conn:
        assert (await conn.execute(select(sessions.c.status))).scalar_one() == "active"


def _tool_group(i: int) -> list[ChatMessage]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "current_time", "arguments": "{}"}}
    return [
        ChatMessage(role="user", content=f"what time is it? {i}"),
        ChatMessage(role="assistant", content=None, tool_calls=(call,)),
        ChatMessage(role="tool", content=f"12:0{i % 10}", tool_call_id=f"call_{i}", name="current_time"),
        ChatMessage(role="assistant", content=f"It is 12:0{i % 10}."),
    ]


HISTORIES = {
    "answered": list(ANSWERED),
    "tool groups": [m for i in range(8) for m in _tool_group(i)],
    "long words": [
        ChatMessage(role="user" if i % 2 == 0 else "assistant", content="word " * (40 * i)) for i in range(12)
    ],
}


@pytest.mark.parametrize("history", list(HISTORIES))
@pytest.mark.parametrize(
    "limits", [(50, None), (7, None), (6, 200), (None, 400), (1, None)], ids=lambda lim: f"{lim[0]}-{lim[1]}"
)
async def test_the_start_reads_the_window_load_window_reads_after_it(
    pg_engine: AsyncEngine, history: str, limits: tuple[int | None, int | None]
) -> None:
    max_messages, max_tokens = limits
    store, lease, row_id = await _with_session(pg_engine, *HISTORIES[history])
    consolidated = min(3, len(HISTORIES[history]) - 1)
    async with pg_engine.begin() as conn:  # the older part was consolidated
        await conn.execute(update(sessions).values(last_consolidated=consolidated))
    user = ChatMessage(role="user", content="hello", event_id="e1")
    started = await _start(pg_engine, lease, row_id, window_limit=max_messages)
    assert started is not None
    stored = fused.stored_window(started, user)  # what a turn trims for its first window
    read = trim_to_legal_window(stored, max_messages=max_messages, max_tokens=max_tokens)
    loaded = await store.load_window(started.session, max_messages=max_messages, max_tokens=max_tokens)
    assert read == loaded
    assert read[-1].content == "hello" and all(m.seq is not None and m.seq > consolidated for m in read)


async def test_the_start_recalls_what_the_memory_recall_reads(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    async with pg_engine.connect() as conn:
        session_id = (await conn.execute(select(sessions.c.id))).scalar_one()
    memory = MemoryStore(pg_engine)
    await memory.put(Scope.GLOBAL, GLOBAL_OWNER, "The office opens at nine.")
    await memory.put(Scope.USER, identity_of("webhook", "u"), "u likes tea.")
    await memory.put(Scope.USER, identity_of("webhook", "other"), "other likes coffee.")
    await memory.put(Scope.SESSION, KEY, "We talked about tea.", source_session_id=session_id)
    await memory.put(Scope.SESSION, KEY, "An older generation's note.", source_session_id=session_id + 100)
    recall = MemoryRecall(memory, max_items=12)
    for chat_type, with_user in (("direct", True), ("scheduled", False)):
        channel = "webhook" if with_user else "cron"
        planned = recall.recall_params(channel, chat_type, KEY, "u")
        assert planned[0] is with_user
        async with pg_engine.begin() as conn:  # the next start finds the event pending again
            await conn.execute(update(inbox).values(status="pending"))
        started = await _start(pg_engine, lease, row_id, recall=fused.Recall(*planned))
        assert started is not None and started.recalled is not None
        read = await memory.run_recall(recall_query(with_user), {**planned[1], "sid": started.session.id})
        assert started.recalled == read
        contents = {m.content for m in started.recalled}
        assert "other likes coffee." not in contents and "An older generation's note." not in contents
        assert ("u likes tea." in contents) is with_user
        assert {"The office opens at nine.", "We talked about tea."} <= contents


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_turn_reads_its_first_window_and_recall_with_its_start(serve: ServeApp) -> None:
    async with serve() as srv:
        seen: list[str] = []

        def logged(query: Any) -> None:  # asyncpg's query logger: every statement, however run
            seen.append(query.query)

        def checkout(dbapi_conn: Any, *_rest: Any) -> None:
            dbapi_conn.driver_connection.add_query_logger(logged)

        inbox_ = srv.runtime.inbox
        [first] = await inbox_.accept([InboundEvent.from_text("webhook", "c", "u", "hello")])
        assert (await inbox_.wait_for_replies(first.event_id, 10)).done
        pool = srv.runtime.engine.sync_engine.pool
        event.listen(pool, "checkout", checkout)
        try:
            [second] = await inbox_.accept([InboundEvent.from_text("webhook", "c", "u", "hello again")])
            answered = await inbox_.wait_for_replies(second.event_id, 10)
        finally:
            event.remove(pool, "checkout", checkout)
        assert answered.done and answered.replies
        [start] = [s for s in seen if s.startswith("WITH fence AS MATERIALIZED")]
        assert "FROM memories" in start and "json_agg(win" in start
        alone = [s for s in seen if s is not start and ("FROM memories" in s or "FROM messages" in s)]
        assert alone == []


async def test_a_run_appends_one_message_in_one_statement_and_only_under_its_lease(
    pg_engine: AsyncEngine,
) -> None:
    store, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    started = await _start(pg_engine, lease, row_id)
    assert started is not None
    call = _tool_group(1)[1]
    async with autocommit(pg_engine).connect() as conn:
        appended = await fused.append(
            conn,
            lease,
            session_id=started.session.id,
            now=utcnow(),
            message=message_values(call, started.run_id),
            lax=True,
        )
    assert appended.seq == started.seq + 1
    stored = await store.all_messages(started.session.id)
    assert [m.seq for m in stored] == [1, 2, 3, 4] and stored[-1].tool_calls == call.tool_calls
    assert (await _counts(pg_engine))["next_seq"] == [5]
    later = utcnow() + timedelta(seconds=31)
    assert await leases.acquire(pg_engine, KEY, "another", ttl=30, now=later) is not None
    before = await _counts(pg_engine)
    with pytest.raises(LeaseLost):
        async with autocommit(pg_engine).connect() as conn:
            await fused.append(
                conn,
                lease,
                session_id=started.session.id,
                now=utcnow(),
                message=message_values(_tool_group(1)[2], started.run_id),
                lax=False,
            )
    assert await _counts(pg_engine) == before

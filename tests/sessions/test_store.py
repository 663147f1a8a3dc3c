"""Sessions: generations, append-only history, lifecycle, window reads."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import messages, sessions, utcnow
from app.sessions.messages import ChatMessage, tool_call
from app.sessions.store import Lifecycle, SessionStore

LC = Lifecycle(suspend_after=60, expire_after=3600, archive_after=7200)


async def test_get_or_create_and_append_with_dense_seqs(engine: AsyncEngine) -> None:
    store = SessionStore(engine, LC)
    async with engine.begin() as conn:
        s1 = await store.open_current(conn, "webhook:c", "webhook")
        seqs = await store.append(conn, s1.id, [ChatMessage(role="user", content=str(i)) for i in range(3)])
    async with engine.begin() as conn:
        again = await store.open_current(conn, "webhook:c", "webhook")
        seqs += await store.append(conn, again.id, [ChatMessage(role="assistant", content="a")])
    assert again.id == s1.id
    assert seqs == [1, 2, 3, 4]


async def test_appending_never_rewrites_earlier_rows(engine: AsyncEngine) -> None:
    store = SessionStore(engine, LC)
    async with engine.begin() as conn:
        s = await store.open_current(conn, "k", "webhook")
        await store.append(conn, s.id, [ChatMessage(role="user", content="first")])
    async with engine.connect() as conn:
        before = (await conn.execute(select(messages).where(messages.c.seq == 1))).mappings().one()
    async with engine.begin() as conn:
        await store.append(conn, s.id, [ChatMessage(role="assistant", content="second")])
    async with engine.connect() as conn:
        after = (await conn.execute(select(messages).where(messages.c.seq == 1))).mappings().one()
    assert dict(before) == dict(after)


async def test_lifecycle_suspend_expire_archive_and_new_generation(engine: AsyncEngine) -> None:
    store = SessionStore(
        engine, LC, {"slow": Lifecycle(suspend_after=1e6, expire_after=2e6, archive_after=3e6)}
    )
    t0 = utcnow()
    async with engine.begin() as conn:
        s = await store.open_current(conn, "k", "webhook", now=t0)
        await store.append(conn, s.id, [ChatMessage(role="user", content="hello")], now=t0)
        other = await store.open_current(conn, "slow:k", "slow", now=t0)
        await store.append(conn, other.id, [ChatMessage(role="user", content="x")], now=t0)

    async def status(session_id: int) -> str:
        async with engine.connect() as conn:
            return (
                await conn.execute(select(sessions.c.status).where(sessions.c.id == session_id))
            ).scalar_one()

    assert await store.sweep(now=t0 + timedelta(seconds=61)) == {"suspended": 1, "expired": 0, "archived": 0}
    assert await status(s.id) == "suspended"
    assert await status(other.id) == "active"  # per-channel lifecycle
    # The next event reactivates the same session; history continues.
    async with engine.begin() as conn:
        resumed = await store.open_current(conn, "k", "webhook", now=t0 + timedelta(seconds=62))
        await store.append(
            conn, resumed.id, [ChatMessage(role="user", content="back")], now=t0 + timedelta(seconds=62)
        )
    assert resumed.id == s.id and await status(s.id) == "active"

    assert (await store.sweep(now=t0 + timedelta(seconds=62 + 3601)))["expired"] == 1
    assert await status(s.id) == "expired"
    async with engine.begin() as conn:
        fresh = await store.open_current(conn, "k", "webhook", now=t0 + timedelta(seconds=62 + 3602))
    assert fresh.id != s.id and fresh.generation == 2
    # Expiry never deletes history.
    assert [m.content for m in await store.all_messages(s.id)] == ["hello", "back"]
    assert (await store.sweep(now=t0 + timedelta(seconds=62 + 3601 + 7201)))["archived"] == 1
    assert await status(s.id) == "archived"


async def test_idle_past_expiry_opens_a_new_generation_without_a_sweep(engine: AsyncEngine) -> None:
    store = SessionStore(engine, LC)
    t0 = utcnow()
    async with engine.begin() as conn:
        s = await store.open_current(conn, "k", "webhook", now=t0)
        later = await store.open_current(conn, "k", "webhook", now=t0 + timedelta(hours=2))
    assert later.generation == s.generation + 1


async def test_close_current_then_next_event_opens_new_generation(engine: AsyncEngine) -> None:
    store = SessionStore(engine, LC)
    async with engine.begin() as conn:
        s = await store.open_current(conn, "k", "webhook")
        await store.append(conn, s.id, [ChatMessage(role="user", content="old")])
        closed = await store.close_current(conn, "k")
        fresh = await store.open_current(conn, "k", "webhook")
    assert closed is not None and closed.id == s.id
    assert fresh.generation == 2
    assert await store.load_window(fresh, max_messages=10) == []
    assert [m.content for m in await store.all_messages(s.id)] == ["old"]


async def test_window_reads_only_after_last_consolidated_and_is_legal(engine: AsyncEngine) -> None:
    store = SessionStore(engine, LC)
    call = ChatMessage(role="assistant", tool_calls=(tool_call("x", "t", {}),))
    async with engine.begin() as conn:
        s = await store.open_current(conn, "k", "webhook")
        await store.append(
            conn,
            s.id,
            [
                ChatMessage(role="user", content="q1"),
                call,
                ChatMessage(role="tool", content="r", tool_call_id="x"),
                ChatMessage(role="assistant", content="a1"),
                ChatMessage(role="user", content="q2"),
                ChatMessage(role="assistant", content="a2"),
            ],
        )
    window = await store.load_window(s, max_messages=100)
    assert [m.seq for m in window] == [1, 2, 3, 4, 5, 6]
    assert window[1].tool_calls == call.tool_calls
    # max_messages=5 would start at the tool call: cut to the next user message.
    assert [m.content for m in await store.load_window(s, max_messages=5)] == ["q2", "a2"]
    async with engine.begin() as conn:
        await conn.execute(sessions.update().where(sessions.c.id == s.id).values(last_consolidated=4))
    assert [m.seq for m in await store.load_window(s, max_messages=100)] == [5, 6]


async def test_the_state_tells_whether_the_newest_message_may_leave_a_group_open(engine: AsyncEngine) -> None:
    """`tail_open` lets a turn skip its look at the newest message; it must never say False wrongly."""
    store = SessionStore(engine, LC)
    call = tool_call("c1", "current_time", {})
    steps: list[tuple[ChatMessage, bool]] = [
        (ChatMessage(role="user", content="hi"), False),
        (ChatMessage(role="assistant", content="thinking", tool_calls=(call,)), True),
        (ChatMessage(role="tool", content="12:00", tool_call_id="c1", name="current_time"), True),
        (ChatMessage(role="assistant", content="It is noon."), False),
        (ChatMessage(role="assistant", content=None, tool_calls=(call,)), True),
    ]
    async with engine.begin() as conn:
        created = await store.open_current(conn, "k", "webhook")
    assert created.tail_open is False  # a new generation has no messages
    for message, expected in steps:
        async with engine.begin() as conn:
            await store.append(conn, created.id, [message])
        async with engine.begin() as conn:
            state = await store.open_current(conn, "k", "webhook")
        assert state.tail_open is expected, message

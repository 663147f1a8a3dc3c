"""The storage port's turn writes, on every store (`backend`): fenced, all or nothing, and the
same history whichever store wrote it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy import select, update

from app.agent.loop import INTERRUPTED_RESULT
from app.db.models import CANCELED, inbox, runs, sessions, utcnow
from app.errors import LeaseLost
from app.pipeline.storage.port import PipelineStore
from app.sessions.messages import ChatMessage, tool_call
from tests.pipeline.conftest import engine_of
from tests.pipeline.support import KEY, accept, end, lease_of, plan, reply_row, state, turn
from tests.support.pg_probe import asyncpg_dsn, while_another_worker_finishes


async def _history(store: PipelineStore) -> list[tuple[int, str, str | None]]:
    return [(seq, role, content) for seq, role, content in (await state(store))["messages"]]


async def test_an_attempt_is_counted_in_a_commit_of_its_own(store: PipelineStore) -> None:
    """Whatever happens to the attempt afterwards, its count stays."""
    await accept(store, "hello")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [row.id])
    await store.note_error([row.id], "RuntimeError: something nobody expected")
    [again] = await store.next_rows(KEY, 1)
    assert again.attempts == 1
    assert (await state(store))["inbox"] == [("processing", 1, "RuntimeError: something nobody expected")]


async def test_a_row_canceled_after_it_was_read_is_not_counted(store: PipelineStore) -> None:
    """The handling reads rows, then counts them: one canceled in between must not run."""
    await accept(store, "first")
    await accept(store, "second")
    lease = await lease_of(store)
    first, second = await store.next_rows(KEY, 2)
    async with engine_of(store).begin() as conn:
        await conn.execute(update(inbox).where(inbox.c.id == second.id).values(status=CANCELED))
    assert await store.count_attempt(lease, [first.id, second.id]) == [first.id]
    assert [r.id for r in await store.next_rows(KEY, 5)] == [first.id]
    assert sorted((await state(store))["inbox"]) == [("canceled", 0, None), ("processing", 1, None)]


async def test_a_turn_writes_its_messages_reply_run_and_status(store: PipelineStore) -> None:
    await accept(store, "hello")
    lease = await lease_of(store)
    finished = await turn(store, lease, "hi")
    stored = await state(store)
    assert await _history(store) == [(1, "user", "hello"), (2, "assistant", "hi")]
    assert finished.seq == 2
    assert stored["runs"] == ["answered"] and stored["outbox"] == 1
    assert stored["inbox"] == [("done", 1, None)]
    assert stored["sessions"] == [(1, "active", 3)]


async def test_a_lost_lease_writes_nothing(store: PipelineStore) -> None:
    await accept(store, "hello")
    old = await lease_of(store, "old")
    [row] = await store.next_rows(KEY, 1)
    await store.count_attempt(old, [row.id])
    started = await store.start(old, plan([row]))
    assert await store.release(old)  # and another worker took the key over
    new = await lease_of(store, "new")
    before = await state(store)
    for write in (
        store.count_attempt(old, [row.id]),
        store.start(old, plan([row])),
        store.append(old, started.session.id, [ChatMessage(role="assistant", content="x")], run_id=None),
        store.finish(old, end(started, [row])),
        store.fail(old, [row], "gave up", [reply_row([row])]),
    ):
        with pytest.raises(LeaseLost):
            await write
    assert await state(store) == before
    assert new.fence == old.fence + 1


async def test_the_next_turn_continues_the_session_and_an_idle_one_opens_a_new_generation(
    store: PipelineStore,
) -> None:
    await accept(store, "one", "two", "three")
    lease = await lease_of(store)
    await turn(store, lease)
    async with store.sessions.engine.begin() as conn:
        await conn.execute(update(sessions).values(status="suspended"))
    store.sessions.release(KEY)  # as a worker does when it lets the key go
    await turn(store, lease)
    assert [s[:2] for s in (await state(store))["sessions"]] == [(1, "active")]
    async with store.sessions.engine.begin() as conn:
        await conn.execute(update(sessions).values(last_active_at=utcnow() - timedelta(days=2)))
    store.sessions.release(KEY)
    await turn(store, lease)
    assert [s[:2] for s in (await state(store))["sessions"]] == [(1, "expired"), (2, "active")]
    assert [m[1:] for m in await _history(store)][-2:] == [("user", "three"), ("assistant", "answer")]


async def test_a_retried_start_stores_its_message_once_and_marks_the_dead_run(store: PipelineStore) -> None:
    await accept(store, "hello")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [row.id])
    await store.start(lease, plan([row]))  # the worker died here
    [retry] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [retry.id])
    started = await store.start(lease, plan([retry]))
    await store.finish(lease, end(started, [retry]))
    assert [m[1:] for m in await _history(store)] == [("user", "hello"), ("assistant", "answer")]
    assert (await state(store))["runs"] == ["crashed", "answered"]


async def test_a_tool_call_group_left_open_is_closed_before_the_next_message(store: PipelineStore) -> None:
    await accept(store, "first", "second")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [row.id])
    started = await store.start(lease, plan([row]))
    call = tool_call("call-1", "echo", {"text": "x"})
    await store.append(
        lease,
        started.session.id,
        [ChatMessage(role="assistant", content=None, tool_calls=(call,))],
        run_id=started.run_id,
    )
    # The run died; the event is failed later, and the next one starts.
    async with store.sessions.engine.begin() as conn:
        await conn.execute(update(inbox).where(inbox.c.id == row.id).values(status="failed"))
    store.sessions.release(KEY)
    [second] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [second.id])
    started = await store.start(lease, plan([second]))
    history = [m[1:] for m in await _history(store)]
    assert history[2] == ("tool", INTERRUPTED_RESULT) and history[3] == ("user", "second")
    assert started.seqs == [3, 4]


async def test_the_window_a_start_reads_is_what_a_read_returns(store: PipelineStore) -> None:
    await accept(store, "one", "two")
    lease = await lease_of(store)
    await turn(store, lease)
    [row] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [row.id])
    started = await store.start(lease, plan([row]))
    read = await store.sessions.load_window(started.session, max_messages=50)
    if started.window is not None:
        assert [(m.seq, m.role, m.content) for m in started.window] == [
            (m.seq, m.role, m.content) for m in read
        ]
    assert [m.content for m in read] == ["one", "answer", "two"]


async def test_appends_are_dense_and_rows_read_with_them_are_the_others(store: PipelineStore) -> None:
    await accept(store, "one", "two")
    lease = await lease_of(store)
    [row, other] = await store.next_rows(KEY, 2)
    await store.count_attempt(lease, [row.id])
    started = await store.start(lease, plan([row]))
    call = tool_call("call-1", "echo", {})
    calls = await store.append(
        lease,
        started.session.id,
        [ChatMessage(role="assistant", content=None, tool_calls=(call,))],
        run_id=started.run_id,
    )
    result = await store.append(
        lease,
        started.session.id,
        [ChatMessage(role="tool", content="ok", tool_call_id="call-1", name="echo")],
        run_id=started.run_id,
        handled=[row.id],
    )
    assert calls.seqs == [2] and result.seqs == [3]
    if result.pending is not None:
        assert result.pending == [other]


async def test_a_turns_end_gives_the_lease_up_only_when_asked_and_nothing_is_left(
    store: PipelineStore,
) -> None:
    await accept(store, "one", "two")
    lease = await lease_of(store)
    kept = await turn(store, lease, release=True)
    assert not kept.released  # "two" is waiting
    if kept.upcoming is not None:
        assert [r.event.text for r in kept.upcoming] == ["two"]
    assert await store.renew(lease)
    let_go = await turn(store, lease, release=True)
    if let_go.released:
        assert (await state(store))["leases"] == [(KEY, None, lease.fence)]
        assert not await store.renew(lease)
    else:  # a store may leave the release to the worker
        assert not await store.release(lease)


async def test_a_released_end_may_take_the_next_keys_free_lease(store: PipelineStore) -> None:
    await accept(store, "mine")
    await accept(store, "next", chat="n")
    lease = await lease_of(store)
    finished = await turn(store, lease, release=True, successor="webhook:n")
    if finished.successor is None:
        return  # not taken: the next key takes its own lease
    assert finished.released and finished.successor.lease.key == "webhook:n"
    assert await store.renew(finished.successor.lease)
    if finished.successor.rows is not None:
        assert [r.event.text for r in finished.successor.rows] == ["next"]


async def test_a_successor_held_elsewhere_is_not_taken(store: PipelineStore) -> None:
    await accept(store, "mine")
    await accept(store, "next", chat="n")
    lease = await lease_of(store)
    await lease_of(store, "elsewhere", key="webhook:n")
    finished = await turn(store, lease, release=True, successor="webhook:n")
    assert finished.successor is None


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_a_successor_whose_row_is_locked_is_skipped_not_waited_for(
    store: PipelineStore, db_url: str
) -> None:
    """Two replicas handing on to each other's keys would otherwise deadlock."""
    await accept(store, "mine")
    await accept(store, "next", chat="n")
    lease = await lease_of(store)
    holder = await lease_of(store, "elsewhere", key="webhook:n")
    assert await store.release(holder)
    other = await asyncpg.connect(asyncpg_dsn(db_url))
    try:
        async with other.transaction():
            await other.execute("SELECT 1 FROM session_keys WHERE key = $1 FOR UPDATE", "webhook:n")
            finished = await asyncio.wait_for(turn(store, lease, release=True, successor="webhook:n"), 10)
    finally:
        await other.close()
    assert finished.released and finished.successor is None


@pytest.mark.parametrize("backend", ["postgres", "postgres-portable"], indirect=True)
async def test_rows_a_worker_finished_while_the_take_waited_are_not_handed_over(
    store: PipelineStore, db_url: str
) -> None:
    """The take read the inbox before it got the key's row lock; another worker took the
    lease, finished the event and released meanwhile: the finished event is not next."""
    await accept(store, "hello")
    first = await lease_of(store, "old")
    [row] = await store.next_rows(KEY, 1)
    assert await store.release(first)
    claim = await while_another_worker_finishes(
        asyncpg_dsn(db_url), KEY, row.id, lambda: store.take(KEY, "me"), query_prefix=""
    )
    assert claim is not None and claim.lease.fence == first.fence + 2
    assert claim.rows in (None, [])


async def test_failed_rows_keep_the_reason_and_the_last_error(store: PipelineStore) -> None:
    await accept(store, "hello")
    lease = await lease_of(store)
    rows = await store.next_rows(KEY, 1)
    await store.note_error([rows[0].id], "ValueError: bad")
    await store.fail(lease, rows, "gave up after 3 attempts", [reply_row(rows)])
    stored = await state(store)
    assert stored["inbox"] == [("failed", 0, "gave up after 3 attempts; last error: ValueError: bad")]
    assert stored["outbox"] == 1
    assert (await store.replies_if_done(rows[0].event_id)) is not None


@pytest.mark.parametrize("backend", ["postgres", "postgres-portable"], indirect=True)
async def test_a_failure_reply_the_database_refuses_does_not_keep_rows_from_failing(
    store: PipelineStore,
) -> None:
    await accept(store, "hello")
    lease = await lease_of(store)
    rows = await store.next_rows(KEY, 1)
    bad = {**reply_row(rows), "chat_id": "c\x00"}  # PostgreSQL stores no NUL in text
    await store.fail(lease, rows, "gave up", [bad])
    stored = await state(store)
    assert stored["inbox"][0][0] == "failed" and stored["outbox"] == 0


async def test_runs_started_are_marked_running_until_they_end(store: PipelineStore) -> None:
    await accept(store, "hello")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    await store.count_attempt(lease, [row.id])
    started = await store.start(lease, plan([row]))
    async with store.sessions.engine.connect() as conn:
        outcome = (await conn.execute(select(runs.c.outcome).where(runs.c.id == started.run_id))).scalar_one()
    assert outcome == "running"
    assert await store.run_row(started.run_id) is not None  # type: ignore[arg-type]


async def test_a_batch_without_an_answer_is_done_at_its_start(store: PipelineStore) -> None:
    await accept(store, "a", "b")
    lease = await lease_of(store)
    rows = await store.next_rows(KEY, 2)
    await store.count_attempt(lease, [r.id for r in rows])
    started = await store.start(lease, plan(rows, answer=False))
    assert started.run_id is None
    assert [s for s, _, _ in (await state(store))["inbox"]] == ["done", "done"]
    assert [m[1:] for m in await _history(store)] == [("user", "a"), ("user", "b")]

"""The port's named operations for commands, steering and the outbox, on every store
(`backend`): each is one fenced commit, and a lost lease writes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.db.models import CANCELED, inbox, outbox, sessions, utcnow
from app.errors import LeaseLost
from app.events import InboundEvent
from app.outbox_rows import outbox_values
from app.pipeline.replies import reply_for
from app.pipeline.storage.port import Answer, InboxRow, OutboxClaim, PipelineStore
from app.sessions.messages import ChatMessage
from tests.pipeline.conftest import engine_of
from tests.pipeline.support import KEY, accept, lease_of, plan, state


def _answer(row: InboxRow, text: str, session_id: int | None = None) -> Answer:
    reply = outbox_values(
        reply_for(row.event, text), session_id=session_id, run_id=None, event_id=row.event_id
    )
    return Answer([row.id], [reply])


async def _outbox(store: PipelineStore) -> list[tuple[str, int | None]]:
    async with engine_of(store).connect() as conn:
        rows = await conn.execute(select(outbox.c.payload, outbox.c.session_id).order_by(outbox.c.id))
        return [(r.payload["parts"][0]["text"], r.session_id) for r in rows]


async def test_answer_marks_the_row_done_and_stores_the_reply_in_one_commit(store: PipelineStore) -> None:
    await accept(store, "/whoami")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    await store.answer(lease, _answer(row, "you are u"))
    assert (await state(store))["inbox"] == [("done", 0, None)]
    assert await _outbox(store) == [("you are u", None)]


async def test_close_session_expires_the_open_generation_and_answers_in_it(store: PipelineStore) -> None:
    await accept(store, "hello", "/new")
    lease = await lease_of(store)
    first, command = await store.next_rows(KEY, 2)
    started = await store.start(lease, plan([first], answer=False))
    closed = await store.close_session(lease, by="/new", answer=_answer(command, "new conversation"))
    assert closed is not None and closed.id == started.session.id
    assert (await state(store))["sessions"] == [(1, "expired", 2)]
    # The reply belongs to the session it closed.
    assert await _outbox(store) == [("new conversation", started.session.id)]
    # Nothing open: nothing closed, the answer still written.
    await accept(store, "/end")
    [again] = await store.next_rows(KEY, 1)
    assert await store.close_session(lease, by="/end", answer=Answer([again.id])) is None
    assert [s for s, _, _ in (await state(store))["inbox"]] == ["done", "done", "done"]


async def test_set_session_metadata_merges_into_what_is_stored_now(store: PipelineStore) -> None:
    await accept(store, "/model x")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    opened = await store.open_session(lease, "webhook")
    # Written behind the command's back (a tool during a turn): kept by the merge.
    async with engine_of(store).begin() as conn:
        await conn.execute(
            update(sessions).where(sessions.c.id == opened.session.id).values(metadata={"skills": ["a"]})
        )
    state_ = await store.set_session_metadata(
        lease, "webhook", {"model": "x"}, title="T", answer=Answer([row.id])
    )
    assert state_.metadata == {"skills": ["a"], "model": "x"}
    again = await store.open_session(lease, "webhook")
    assert (again.title, again.metadata, again.pending_approvals) == ("T", {"skills": ["a"], "model": "x"}, 0)
    changed = await store.set_session_metadata(
        lease, "webhook", lambda m: {k: v for k, v in m.items() if k != "skills"}
    )
    assert changed.metadata == {"model": "x"}
    assert [g["title"] for g in await store.generations(KEY, 10)] == ["T"]


async def test_inject_counts_and_appends_only_rows_not_canceled(store: PipelineStore) -> None:
    """Steering joins rows to a running turn like a turn's count: a row canceled since it
    was read (A2A tasks/cancel) neither runs nor enters the history."""
    await accept(store, "first", "steered", "canceled")
    lease = await lease_of(store)
    first, steered, canceled = await store.next_rows(KEY, 3)
    await store.count_attempt(lease, [first.id])
    started = await store.start(lease, plan([first]))
    async with engine_of(store).begin() as conn:
        await conn.execute(update(inbox).where(inbox.c.id == canceled.id).values(status=CANCELED))
    messages = [
        ChatMessage(role="user", content=r.event.text, event_id=r.event_id) for r in (steered, canceled)
    ]
    injected = await store.inject(
        lease, started.session.id, [steered, canceled], messages, run_id=started.run_id
    )
    assert injected.row_ids == [steered.id]
    assert [m.content for m in injected.added] == ["steered"] and len(injected.seqs) == 1
    stored = await state(store)
    assert [content for _, _, content in stored["messages"]] == ["first", "steered"]
    assert stored["inbox"] == [("processing", 1, None), ("processing", 1, None), ("canceled", 0, None)]


async def test_the_operations_are_fenced(store: PipelineStore) -> None:
    await accept(store, "/new")
    old = await lease_of(store, "old")
    [row] = await store.next_rows(KEY, 1)
    assert await store.release(old)
    await lease_of(store, "new")
    before = await state(store)
    for write in (
        store.answer(old, _answer(row, "x")),
        store.close_session(old, by="/new", answer=Answer([row.id])),
        store.set_session_metadata(old, "webhook", {"model": "x"}),
        store.open_session(old, "webhook"),
        store.paused_run(old, "webhook"),
    ):
        with pytest.raises(LeaseLost):
            await write
    assert await state(store) == before


async def test_claim_outbox_takes_the_oldest_due_row_of_each_key_once(store: PipelineStore) -> None:
    async with engine_of(store).begin() as conn:
        for chat, text in (("a", "a1"), ("a", "a2"), ("b", "b1")):
            reply = reply_for(InboundEvent.from_text("webhook", chat, "u", "hi"), text)
            await conn.execute(
                outbox.insert(), outbox_values(reply, session_id=None, run_id=None, event_id=None)
            )
    now = utcnow()
    claim = OutboxClaim(("webhook",), now, now + timedelta(seconds=30), 10, owner="a")
    claimed = await store.claim_outbox(claim)
    assert [r["payload"]["parts"][0]["text"] for r in claimed] == ["a1", "b1"]
    other = OutboxClaim(("webhook",), now, now + timedelta(seconds=30), 10, owner="b")
    assert await store.claim_outbox(other) == []  # another owner waits for the deadline
    assert await store.claim_outbox(OutboxClaim(("telegram",), now, now, 10, owner="a")) == []
    # Its owner may take a claim again at once (its answer was lost): fenced anew.
    again = await store.claim_outbox(claim)
    assert [(r["payload"]["parts"][0]["text"], r["attempts"]) for r in again] == [("a1", 2), ("b1", 2)]
    assert {r["claimed_by"] for r in again} == {"a"}
    later = now + timedelta(seconds=31)
    taken = await store.claim_outbox(
        OutboxClaim(("webhook",), later, later + timedelta(seconds=30), 10, owner="b")
    )
    assert [r["claimed_by"] for r in taken] == ["b", "b"]  # past the deadline: anyone's

"""Building blocks for the store contract tests: events, plans and ends of turns."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Iterable
from typing import Any

from sqlalchemy import func, select

from app.db.models import inbox, messages, outbox, runs, session_keys, sessions, utcnow
from app.events import InboundEvent
from app.pipeline.replies import outbox_values, reply_for, user_message
from app.pipeline.run_trace import run_values
from app.pipeline.storage.port import InboxRow, PipelineStore, Started, TurnEnd, TurnPlan
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage

KEY = "webhook:c"
# Calls of several keys at once to `PostgresStore`'s grouped statements: a group of four,
# one of two and some alone, whatever the timing.
TOGETHER = 9


def event(text: str, *, chat: str = "c", external_id: str | None = None) -> InboundEvent:
    return InboundEvent.from_text("webhook", chat, "u", text, external_id=external_id)


async def accept(store: PipelineStore, *texts: str, chat: str = "c") -> list[str]:
    results = (await store.accept([event(t, chat=chat) for t in texts])).results
    return [r.event_id for r in results]


async def lease_of(store: PipelineStore, owner: str = "me", key: str = KEY) -> SessionLease:
    claim = await store.take(key, owner)
    assert claim is not None
    return claim.lease


def plan(
    rows: list[InboxRow], *, answer: bool = True, expire_after: float = 24 * 3600, **extra: Any
) -> TurnPlan:
    now = utcnow()
    events = [r.event for r in rows]
    run, _ = run_values(rows[0].session_key, events, now, provider="test", model=None)
    return TurnPlan(
        rows=rows,
        channel="webhook",
        expire_after=expire_after,
        user_messages=[user_message(e) for e in events],
        run=run if answer else None,
        now=now,
        window_limit=50,
        **extra,
    )


def end(
    started: Started,
    rows: list[InboxRow],
    answer: str = "answer",
    *,
    release: bool = False,
    successor: str | None = None,
) -> TurnEnd:
    assert started.run_id is not None
    now = utcnow()
    reply = outbox_values(
        reply_for(rows[-1].event, answer),
        session_id=started.session.id,
        run_id=started.run_id,
        event_id=rows[-1].event_id,
    )
    return TurnEnd(
        session_id=started.session.id,
        answer=ChatMessage(role="assistant", content=answer),
        run_id=started.run_id,
        reply=reply,
        inbox_ids=[r.id for r in rows],
        link=started.run_id,
        trace={
            "outcome": "answered",
            "tool_calls": [],
            "details": {},
            "event_ids": [r.event_id for r in rows],
            "iterations": 1,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "finished_at": now,
            "duration_ms": 1,
            "model": None,
            "error": None,
        },
        now=now,
        release=release,
        successor=successor,
    )


async def turn(store: PipelineStore, lease: SessionLease, answer: str = "answer", **end_args: Any) -> Any:
    """Count, start and finish the key's next row as one turn; returns what `finish` said."""
    rows = (await store.next_rows(lease.key, 1))[:1]
    await store.count_attempt(lease, [r.id for r in rows])
    started = await store.start(lease, plan(rows))
    return await store.finish(lease, end(started, rows, answer, **end_args))


async def state(store: PipelineStore) -> dict[str, Any]:
    """What is stored, in a comparable form."""
    engine = store.sessions.engine
    async with engine.connect() as conn:
        return {
            "messages": (
                await conn.execute(
                    select(messages.c.seq, messages.c.role, messages.c.content).order_by(messages.c.id)
                )
            ).all(),
            "runs": (await conn.execute(select(runs.c.outcome).order_by(runs.c.id))).scalars().all(),
            "outbox": (await conn.execute(select(func.count()).select_from(outbox))).scalar_one(),
            "inbox": (
                await conn.execute(
                    select(inbox.c.status, inbox.c.attempts, inbox.c.error).order_by(inbox.c.id)
                )
            ).all(),
            "sessions": (
                await conn.execute(
                    select(sessions.c.generation, sessions.c.status, sessions.c.next_seq).order_by(
                        sessions.c.id
                    )
                )
            ).all(),
            "leases": (
                await conn.execute(
                    select(
                        session_keys.c.key, session_keys.c.lease_owner, session_keys.c.lease_fence
                    ).order_by(session_keys.c.key)
                )
            ).all(),
        }


def reply_row(rows: list[InboxRow], text: str = "sorry") -> dict[str, Any]:
    return outbox_values(
        reply_for(rows[0].event, text), session_id=None, run_id=None, event_id=rows[0].event_id
    )


def new_id() -> str:
    return uuid.uuid4().hex


async def one_refused(
    calls: Iterable[Awaitable[Any]],
    refused: int,
    error: type[BaseException],
    *,
    not_as: type[BaseException] | None = None,
) -> list[int]:
    """Run `calls` at once: the one at `refused` fails with `error` (not with `not_as`), every
    other succeeds. The indexes of those others."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[refused], error), results[refused]
    assert not_as is None or not isinstance(results[refused], not_as), results[refused]
    assert [i for i, r in enumerate(results) if isinstance(r, BaseException)] == [refused], results
    return [i for i in range(len(results)) if i != refused]

"""Writes inside a fenced transaction that keep a session's history one legal trajectory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.loop import INTERRUPTED_RESULT, denied_result, open_calls
from app.db.models import messages, runs, utcnow
from app.pipeline.approvals import cancel_pending
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore


async def close_open_group(
    conn: AsyncConnection, store: SessionStore, session: SessionState, *, reason: str, by: str = "superseded"
) -> list[ChatMessage]:
    """Results for the newest group's unanswered calls; cancels their pending approvals.

    A crash or a pending approval can leave the newest assistant message's tool calls
    without all their results. Before anything else is appended (a new user message, a
    `/stop`'s answer) they get one each, so the history stays legal.
    """
    if session.tail_open is False:
        return []  # read with the session: the last turn ended with an answer
    last = (
        await conn.execute(
            select(messages.c.role, messages.c.tool_calls)
            .where(messages.c.session_id == session.id)
            .order_by(messages.c.seq.desc())
            .limit(1)
        )
    ).first()
    if last is None or not (last.role == "tool" or (last.role == "assistant" and last.tool_calls)):
        return []  # the common case: the last turn ended with an answer
    pending = open_calls(await store.tail(session.id, 64, conn=conn))
    if not pending:
        return []
    cancelled = await cancel_pending(conn, session.id, by)
    cancelled_ids = {r.tool_call_id for r in cancelled}
    for run_id in {r.run_id for r in cancelled if r.run_id is not None}:
        await amend_run(
            conn,
            run_id,
            outcome="stopped" if by != "superseded" else "superseded",
            add_calls=[
                {
                    "id": r.tool_call_id,
                    "name": r.tool_name,
                    "ms": 0,
                    "decision": "cancelled",
                    "decided_by": by,
                }
                for r in cancelled
                if r.run_id == run_id
            ],
            finished=True,
        )
    return [
        ChatMessage(
            role="tool",
            content=denied_result(reason) if call["id"] in cancelled_ids else INTERRUPTED_RESULT,
            tool_call_id=call["id"],
            name=call.get("function", {}).get("name", ""),
        )
        for call in pending
    ]


async def amend_run(
    conn: AsyncConnection,
    run_id: int,
    *,
    outcome: str | None = None,
    add_calls: Sequence[dict[str, Any]] = (),
    finished: bool = False,
) -> None:
    """Add tool calls to a run's trace, set its outcome, mark it finished."""
    row = (await conn.execute(select(runs.c.tool_calls).where(runs.c.id == run_id))).first()
    if row is None:
        return
    values: dict[str, Any] = {"tool_calls": [*(row.tool_calls or []), *add_calls]}
    if outcome is not None:
        values["outcome"] = outcome
    if finished:
        values["finished_at"] = utcnow()
    await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))

"""What a gateway connection reads from the database: the session, its messages, approvals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import approvals, messages, outbox, session_keys, sessions
from app.gateway.tokens import GatewayGrant


@dataclass(frozen=True)
class CurrentSession:
    id: int
    generation: int
    status: str
    last_seq: int


async def current_session(engine: AsyncEngine, key: str) -> CurrentSession | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(sessions.c.id, sessions.c.generation, sessions.c.status, sessions.c.next_seq)
                .join(session_keys, session_keys.c.current_session_id == sessions.c.id)
                .where(session_keys.c.key == key)
            )
        ).first()
    return CurrentSession(row.id, row.generation, row.status, row.next_seq - 1) if row else None


def message_frame(key: str, session_id: int, row: Any) -> dict[str, Any]:
    """A history row in the shape the turn handler publishes on the bus."""
    return {
        "type": "message",
        "session_key": key,
        "session_id": session_id,
        "seq": row["seq"],
        "role": row["role"],
        "content": row["content"],
        "tool_calls": row["tool_calls"],
        "tool_call_id": row["tool_call_id"],
        "name": row["name"],
        "event_id": row["event_id"],
        "run_id": row["run_id"],
    }


_COLUMNS = (
    messages.c.seq,
    messages.c.role,
    messages.c.content,
    messages.c.tool_calls,
    messages.c.tool_call_id,
    messages.c.name,
    messages.c.event_id,
    messages.c.run_id,
)


async def messages_between(
    engine: AsyncEngine,
    key: str,
    session_id: int,
    *,
    after_seq: int,
    before_seq: int | None = None,
    limit: int,
) -> list[dict[str, Any]]:
    """Messages with `after_seq < seq < before_seq`, oldest first, at most `limit`."""
    query = select(*_COLUMNS).where(messages.c.session_id == session_id, messages.c.seq > after_seq)
    if before_seq is not None:
        query = query.where(messages.c.seq < before_seq)
    async with engine.connect() as conn:
        rows = (await conn.execute(query.order_by(messages.c.seq).limit(limit))).mappings().all()
    return [message_frame(key, session_id, r) for r in rows]


async def recent_messages(
    engine: AsyncEngine, key: str, session_id: int, *, limit: int
) -> list[dict[str, Any]]:
    """The newest `limit` messages, oldest first."""
    query = (
        select(*_COLUMNS)
        .where(messages.c.session_id == session_id)
        .order_by(messages.c.seq.desc())
        .limit(limit)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [message_frame(key, session_id, r) for r in reversed(rows)]


async def pending_approvals(engine: AsyncEngine, key: str) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = (
            (
                await conn.execute(
                    select(
                        approvals.c.id,
                        approvals.c.tool_name,
                        approvals.c.arguments,
                        approvals.c.tool_call_id,
                        approvals.c.run_id,
                        approvals.c.requested_at,
                        approvals.c.expires_at,
                    )
                    .where(approvals.c.session_key == key, approvals.c.status == "pending")
                    .order_by(approvals.c.id)
                )
            )
            .mappings()
            .all()
        )
    return [
        {
            "approval_id": r["id"],
            "tool": r["tool_name"],
            "tool_name": r["tool_name"],
            "arguments": r["arguments"],
            "tool_call_id": r["tool_call_id"],
            "run_id": r["run_id"],
            "requested_at": r["requested_at"].isoformat(),
            "expires_at": r["expires_at"].isoformat(),
        }
        for r in rows
    ]


async def sessions_in_scope(
    engine: AsyncEngine, grant: GatewayGrant, *, limit: int = 200
) -> list[dict[str, Any]]:
    """Current generations of the keys a grant covers, newest activity first."""
    conditions: list[ColumnElement[bool]] = []
    if grant.session_keys:
        conditions.append(sessions.c.key.in_(list(grant.session_keys)))
    prefix = grant.key_prefix
    if prefix is not None:  # whole components, as `GatewayGrant.allows`
        if not prefix or prefix.endswith(":"):
            conditions.append(sessions.c.key.startswith(prefix, autoescape=True))
        else:
            conditions.append(sessions.c.key == prefix)
            conditions.append(sessions.c.key.startswith(prefix + ":", autoescape=True))
    if not conditions:
        return []
    query = (
        select(sessions)
        .join(session_keys, session_keys.c.current_session_id == sessions.c.id)
        .where(or_(*conditions))
        .order_by(sessions.c.last_active_at.desc())
        .limit(limit)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [
        {
            "key": r["key"],
            "session_id": r["id"],
            "generation": r["generation"],
            "status": r["status"],
            "channel": r["channel"],
            "message_count": r["next_seq"] - 1,
            "last_active_at": r["last_active_at"].isoformat(),
            "title": r["title"],
        }
        for r in rows
    ]


async def outbox_run_id(engine: AsyncEngine, message_id: str) -> int | None:
    async with engine.connect() as conn:
        row = (await conn.execute(select(outbox.c.run_id).where(outbox.c.message_id == message_id))).first()
    return row.run_id if row else None

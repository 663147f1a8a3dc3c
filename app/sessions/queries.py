"""Read-only queries over sessions, history and the pipeline (admin API, CLI)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import (
    INBOX_UNFINISHED,
    OUTBOX_UNDELIVERED,
    approvals,
    inbox,
    messages,
    outbox,
    runs,
    session_keys,
    sessions,
)


def _session_dict(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "key": row["key"],
        "generation": row["generation"],
        "channel": row["channel"],
        "status": row["status"],
        "message_count": row["next_seq"] - 1,
        "last_consolidated": row["last_consolidated"],
        "title": row["title"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "last_active_at": row["last_active_at"],
        "closed_at": row["closed_at"],
    }


async def list_sessions(
    engine: AsyncEngine,
    *,
    channel: str | None = None,
    status: str | None = None,
    key: str | None = None,
    key_prefix: str | None = None,
    text: str | None = None,
    include_archived: bool = False,
    limit: int = 100,
    offset: int = 0,
) -> list[dict[str, Any]]:
    query = select(sessions)
    if channel:
        query = query.where(sessions.c.channel == channel)
    if status:
        query = query.where(sessions.c.status == status)
    elif not include_archived:
        query = query.where(sessions.c.status != "archived")
    if key:
        query = query.where(sessions.c.key == key)
    if key_prefix:
        query = query.where(sessions.c.key.startswith(key_prefix, autoescape=True))
    if text:
        matching = select(messages.c.session_id).where(messages.c.content.contains(text, autoescape=True))
        query = query.where(sessions.c.id.in_(matching) | sessions.c.key.contains(text, autoescape=True))
    query = query.order_by(sessions.c.last_active_at.desc(), sessions.c.id.desc()).limit(limit).offset(offset)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_session_dict(r) for r in rows]


async def current_session(engine: AsyncEngine, key: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (
            (
                await conn.execute(
                    select(sessions)
                    .join(session_keys, session_keys.c.current_session_id == sessions.c.id)
                    .where(session_keys.c.key == key)
                )
            )
            .mappings()
            .first()
        )
        if row is None:
            return None
        out = _session_dict(row)
        out["generations"] = (
            await conn.execute(select(func.count()).select_from(sessions).where(sessions.c.key == key))
        ).scalar_one()
        out["inbox_pending"] = (
            await conn.execute(
                select(func.count())
                .select_from(inbox)
                .where(inbox.c.session_key == key, inbox.c.status.in_(INBOX_UNFINISHED))
            )
        ).scalar_one()
        out["outbox_pending"] = (
            await conn.execute(
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.session_key == key, outbox.c.status.in_(OUTBOX_UNDELIVERED))
            )
        ).scalar_one()
        out["runs"] = (
            await conn.execute(select(func.count()).select_from(runs).where(runs.c.session_id == row["id"]))
        ).scalar_one()
        lease = (await conn.execute(select(session_keys).where(session_keys.c.key == key))).mappings().one()
        out["lease"] = {
            "owner": lease["lease_owner"],
            "fence": lease["lease_fence"],
            "expires_at": lease["lease_expires_at"],
        }
    return out


async def session_by_generation(engine: AsyncEngine, key: str, generation: int) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (
            (
                await conn.execute(
                    select(sessions).where(sessions.c.key == key, sessions.c.generation == generation)
                )
            )
            .mappings()
            .first()
        )
    return _session_dict(row) if row else None


async def session_messages(
    engine: AsyncEngine, session_id: int, *, after_seq: int = 0, limit: int = 1000
) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = (
            (
                await conn.execute(
                    select(messages)
                    .where(messages.c.session_id == session_id, messages.c.seq > after_seq)
                    .order_by(messages.c.seq)
                    .limit(limit)
                )
            )
            .mappings()
            .all()
        )
    return [
        {
            "seq": r["seq"],
            "role": r["role"],
            "content": r["content"],
            "parts": r["parts"],
            "tool_calls": r["tool_calls"],
            "tool_call_id": r["tool_call_id"],
            "name": r["name"],
            "event_id": r["event_id"],
            "run_id": r["run_id"],
            "created_at": r["created_at"],
        }
        for r in rows
    ]


async def session_runs(engine: AsyncEngine, session_key: str, limit: int = 50) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        rows = (
            (
                await conn.execute(
                    select(runs)
                    .where(runs.c.session_key == session_key)
                    .order_by(runs.c.id.desc())
                    .limit(limit)
                )
            )
            .mappings()
            .all()
        )
    return [dict(r) for r in rows]


async def pipeline_rows(
    engine: AsyncEngine, table: str, *, status: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    tbl = inbox if table == "inbox" else outbox
    query = select(tbl).order_by(tbl.c.id.desc()).limit(limit)
    if status:
        query = query.where(tbl.c.status == status)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [dict(r) for r in rows]


# --- dashboard: overview, time series, runs, approvals, channels ------------------------
#
def _run_dict(row: Any) -> dict[str, Any]:
    return dict(row)


async def list_runs(
    engine: AsyncEngine,
    *,
    session_key: str | None = None,
    outcome: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Run traces across sessions, newest first (`before_id` pages backwards)."""
    query = select(runs).order_by(runs.c.id.desc()).limit(limit)
    if session_key:
        query = query.where(runs.c.session_key == session_key)
    if outcome:
        query = query.where(runs.c.outcome == outcome)
    if before_id is not None:
        query = query.where(runs.c.id < before_id)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [_run_dict(r) for r in rows]


async def run_detail(engine: AsyncEngine, run_id: int) -> dict[str, Any] | None:
    """One run with the messages it produced and the approvals it asked for."""
    async with engine.connect() as conn:
        row = (await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().first()
        if row is None:
            return None
        out = _run_dict(row)
        seqs = await conn.execute(
            select(messages.c.seq, messages.c.role, messages.c.name)
            .where(messages.c.run_id == run_id)
            .order_by(messages.c.seq)
        )
        out["messages"] = [{"seq": s, "role": r, "name": n} for s, r, n in seqs.all()]
        generation = await conn.execute(
            select(sessions.c.generation).where(sessions.c.id == row["session_id"])
        )
        out["generation"] = generation.scalar_one_or_none()
        appr = await conn.execute(
            select(approvals).where(approvals.c.run_id == run_id).order_by(approvals.c.id)
        )
        out["approvals"] = [dict(a) for a in appr.mappings().all()]
    return out


async def list_approvals(
    engine: AsyncEngine,
    *,
    status: str | None = None,
    session_key: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Approval requests of risky tool calls, newest first."""
    query = select(approvals).order_by(approvals.c.id.desc()).limit(limit)
    if status:
        query = query.where(approvals.c.status == status)
    if session_key:
        query = query.where(approvals.c.session_key == session_key)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [dict(r) for r in rows]


async def session_generations(engine: AsyncEngine, key: str) -> list[dict[str, Any]]:
    """Every generation of a key, newest first (for reopening an earlier one)."""
    async with engine.connect() as conn:
        current = (
            await conn.execute(select(session_keys.c.current_session_id).where(session_keys.c.key == key))
        ).scalar_one_or_none()
        rows = (
            (
                await conn.execute(
                    select(sessions).where(sessions.c.key == key).order_by(sessions.c.generation.desc())
                )
            )
            .mappings()
            .all()
        )
    return [{**_session_dict(r), "current": r["id"] == current} for r in rows]

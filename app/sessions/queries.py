"""Read-only queries over sessions, history and the pipeline (admin API, CLI)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
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
# Aggregates run in SQL (GROUP BY) so a busy deployment does not ship every row to
# Python; per-minute buckets are built with each backend's own date functions.


def _minute_bucket(dialect: str, column: Any) -> Any:
    """`YYYY-MM-DD HH:MM` (UTC) of a timestamp column, on PostgreSQL and SQLite."""
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD HH24:MI")
    return func.strftime("%Y-%m-%d %H:%M", column)


def _parse_bucket(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


async def status_counts(engine: AsyncEngine) -> dict[str, dict[str, int]]:
    """Row counts by status of sessions (all generations), inbox and outbox."""
    out: dict[str, dict[str, int]] = {}
    async with engine.connect() as conn:
        for name, tbl in (("sessions", sessions), ("inbox", inbox), ("outbox", outbox)):
            rows = await conn.execute(select(tbl.c.status, func.count()).group_by(tbl.c.status))
            out[name] = {status: int(count) for status, count in rows.all()}
    return out


async def run_stats(engine: AsyncEngine, *, since: datetime, sample: int = 2000) -> dict[str, Any]:
    """Runs started since `since`: count, outcomes, and latency percentiles of the newest `sample`."""
    async with engine.connect() as conn:
        outcomes = {
            outcome: int(count)
            for outcome, count in (
                await conn.execute(
                    select(runs.c.outcome, func.count())
                    .where(runs.c.started_at >= since)
                    .group_by(runs.c.outcome)
                )
            ).all()
        }
        durations = sorted(
            int(d)
            for (d,) in (
                await conn.execute(
                    select(runs.c.duration_ms)
                    .where(runs.c.started_at >= since, runs.c.duration_ms.is_not(None))
                    .order_by(runs.c.id.desc())
                    .limit(sample)
                )
            ).all()
        )

    def pct(p: float) -> int | None:
        if not durations:
            return None
        return durations[min(len(durations) - 1, round(p * (len(durations) - 1)))]

    return {
        "count": sum(outcomes.values()),
        "outcomes": outcomes,
        "latency_ms": {
            "p50": pct(0.5),
            "p95": pct(0.95),
            "max": durations[-1] if durations else None,
            "avg": round(sum(durations) / len(durations)) if durations else None,
            "sampled": len(durations),
        },
    }


async def activity_series(engine: AsyncEngine, *, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """One point per minute in [since, until]: events accepted, runs, latency, failures, deliveries."""
    dialect = engine.dialect.name
    start = since.replace(second=0, microsecond=0)
    points: dict[datetime, dict[str, Any]] = {}
    t = start
    while t <= until:
        points[t] = {
            "t": t,
            "events": 0,
            "runs": 0,
            "run_ms_avg": None,
            "run_ms_max": None,
            "run_failures": 0,
            "sent": 0,
            "send_failures": 0,
        }
        t += timedelta(minutes=1)

    in_bucket = _minute_bucket(dialect, inbox.c.created_at)
    run_bucket = _minute_bucket(dialect, runs.c.started_at)
    sent_bucket = _minute_bucket(dialect, outbox.c.sent_at)
    failed_bucket = _minute_bucket(dialect, outbox.c.created_at)
    async with engine.connect() as conn:
        events = await conn.execute(
            select(in_bucket, func.count()).where(inbox.c.created_at >= start).group_by(in_bucket)
        )
        run_rows = await conn.execute(
            select(
                run_bucket,
                func.count(),
                func.avg(runs.c.duration_ms),
                func.max(runs.c.duration_ms),
                func.sum(case((runs.c.outcome.not_in(("ok", "running")), 1), else_=0)),
            )
            .where(runs.c.started_at >= start)
            .group_by(run_bucket)
        )
        sent = await conn.execute(
            select(sent_bucket, func.count())
            .where(outbox.c.sent_at >= start, outbox.c.status == "sent")
            .group_by(sent_bucket)
        )
        failed = await conn.execute(
            select(failed_bucket, func.count())
            .where(outbox.c.created_at >= start, outbox.c.status == "failed")
            .group_by(failed_bucket)
        )

        for bucket, count in events.all():
            if (point := points.get(_parse_bucket(bucket))) is not None:
                point["events"] = int(count)
        for bucket, count, avg, top, failures in run_rows.all():
            if (point := points.get(_parse_bucket(bucket))) is not None:
                point["runs"] = int(count)
                point["run_ms_avg"] = round(float(avg)) if avg is not None else None
                point["run_ms_max"] = int(top) if top is not None else None
                point["run_failures"] = int(failures or 0)
        for bucket, count in sent.all():
            if (point := points.get(_parse_bucket(bucket))) is not None:
                point["sent"] = int(count)
        for bucket, count in failed.all():
            if (point := points.get(_parse_bucket(bucket))) is not None:
                point["send_failures"] = int(count)
    return list(points.values())


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


async def channel_activity(engine: AsyncEngine, *, since: datetime) -> dict[str, dict[str, Any]]:
    """Per channel: last inbound/outbound times, volumes since `since`, backlog and failures."""
    out: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return out.setdefault(
            name,
            {
                "last_inbound_at": None,
                "last_outbound_at": None,
                "inbound_recent": 0,
                "outbound_recent": 0,
                "inbox_failed": 0,
                "inbox_pending": 0,
                "outbox_failed": 0,
                "outbox_pending": 0,
                "last_error": None,
                "last_error_at": None,
            },
        )

    async with engine.connect() as conn:
        for name, last, recent in (
            await conn.execute(
                select(
                    inbox.c.channel,
                    func.max(inbox.c.created_at),
                    func.sum(case((inbox.c.created_at >= since, 1), else_=0)),
                ).group_by(inbox.c.channel)
            )
        ).all():
            e = entry(name)
            e["last_inbound_at"] = _as_utc(last)
            e["inbound_recent"] = int(recent or 0)
        for name, last, recent in (
            await conn.execute(
                select(
                    outbox.c.channel,
                    func.max(outbox.c.sent_at),
                    func.sum(case((outbox.c.sent_at >= since, 1), else_=0)),
                ).group_by(outbox.c.channel)
            )
        ).all():
            e = entry(name)
            e["last_outbound_at"] = _as_utc(last)
            e["outbound_recent"] = int(recent or 0)
        for table, prefix in ((inbox, "inbox"), (outbox, "outbox")):
            for name, status, count in (
                await conn.execute(
                    select(table.c.channel, table.c.status, func.count())
                    .where(table.c.status.in_(("failed", "pending", "processing", "sending")))
                    .group_by(table.c.channel, table.c.status)
                )
            ).all():
                e = entry(name)
                key = f"{prefix}_failed" if status == "failed" else f"{prefix}_pending"
                e[key] += int(count)
        latest_errors = (
            await conn.execute(
                select(outbox.c.channel, outbox.c.last_error, outbox.c.created_at)
                .where(outbox.c.last_error.is_not(None))
                .order_by(outbox.c.id.desc())
                .limit(200)
            )
        ).all()
        for name, error, at in latest_errors:
            e = entry(name)
            if e["last_error"] is None:
                e["last_error"] = error
                e["last_error_at"] = _as_utc(at)
    return out


def _as_utc(value: Any) -> datetime | None:
    """Aggregates (MAX) bypass the column type on SQLite and come back as text or naive."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC) if isinstance(value, datetime) else None

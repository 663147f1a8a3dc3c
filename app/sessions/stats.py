"""Aggregates for the dashboard: counts by status, run latency, per-minute activity, channels.

They run in SQL (GROUP BY) so a busy deployment does not ship every row to Python;
per-minute buckets are built with each backend's own date functions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox, outbox, runs, sessions


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


def no_activity() -> dict[str, Any]:
    """A channel's activity entry before anything happened on it."""
    return {
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
    }


async def channel_activity(engine: AsyncEngine, *, since: datetime) -> dict[str, dict[str, Any]]:
    """Per channel: last inbound/outbound times, volumes since `since`, backlog and failures."""
    out: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return out.setdefault(name, no_activity())

    async with engine.connect() as conn:
        # Inbound volume by when events were accepted, outbound by when replies were sent.
        for column, direction in ((inbox.c.created_at, "inbound"), (outbox.c.sent_at, "outbound")):
            table = column.table
            for name, last, recent in (
                await conn.execute(
                    select(
                        table.c.channel,
                        func.max(column),
                        func.sum(case((column >= since, 1), else_=0)),
                    ).group_by(table.c.channel)
                )
            ).all():
                e = entry(name)
                e[f"last_{direction}_at"] = _as_utc(last)
                e[f"{direction}_recent"] = int(recent or 0)
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

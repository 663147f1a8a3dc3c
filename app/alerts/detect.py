"""What each replica looks at, every ALERT_CHECK_SECONDS: one reading per incident name.

Readings come from the database every replica shares (so whichever replica looks, it
sees the same incident), except what only a replica knows of itself: its memory, and
whether it reaches the database at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.alerts.settings import AlertSettings
from app.channel import ConnectionConflicts
from app.connection_leases import list_holds
from app.db.models import alert_incidents, inbox, outbox, runs

MODEL_FAILURES = frozenset({"provider_error"})
CRON_ROWS = 500  # failed cron replies read per check, newest first


@dataclass(frozen=True)
class Reading:
    name: str  # the incident's name: one alert per name while it lasts
    kind: str  # what the texts call it (app.alerts.texts)
    firing: bool
    detail: str = ""


async def shared_readings(
    engine: AsyncEngine, settings: AlertSettings, *, served: set[str], now: datetime
) -> list[Reading]:
    """The incidents every replica sees alike (read from the database)."""
    out: list[Reading] = []
    async with engine.connect() as conn:
        oldest, waiting = (
            await conn.execute(
                select(func.min(outbox.c.created_at), func.count()).where(
                    outbox.c.status.in_(("pending", "sending"))
                )
            )
        ).one()
        age = (now - _aware(oldest)).total_seconds() if oldest is not None else 0.0
        out.append(
            Reading(
                "outbox",
                "outbox",
                age > settings.outbox_age_seconds,
                f"the oldest of {waiting} undelivered replies is {age:.0f} s old",
            )
        )
        since = now - timedelta(seconds=settings.dead_letter_window_seconds)
        failed = (
            await conn.execute(
                select(func.count()).where(inbox.c.status == "failed", inbox.c.updated_at >= since)
            )
        ).scalar_one()
        minutes = settings.dead_letter_window_seconds / 60
        out.append(
            Reading(
                "dead_letters",
                "dead_letters",
                failed > 0,
                f"{failed} events failed in the last {minutes:.0f} min (`chatgate dead-letters list`)",
            )
        )
        streak = settings.model_error_streak
        recent = list(
            (
                await conn.execute(
                    select(runs.c.outcome, runs.c.error)
                    .where(runs.c.outcome != "running")
                    .order_by(runs.c.id.desc())
                    .limit(streak)
                )
            ).all()
        )
        failing = len(recent) == streak and all(outcome in MODEL_FAILURES for outcome, _ in recent)
        last_error = recent[0][1] if recent else ""
        out.append(Reading("model", "model", failing, f"the last {streak} runs failed: {last_error}"))
        out.extend(await _cron_readings(conn))
    grace = timedelta(seconds=2 * settings.check_seconds)
    for hold in await list_holds(engine):
        channel = hold.name.split(":", 1)[0]
        if channel not in served:
            continue
        down = hold.expires_at is None or _aware(hold.expires_at) < now - grace
        since_text = (
            _aware(hold.expires_at).isoformat(timespec="seconds") if hold.expires_at else "never held"
        )
        out.append(
            Reading(
                f"connection:{hold.name}",
                "connection",
                down,
                f"{hold.name}: no replica holds it (since {since_text})",
            )
        )
    return out


async def _cron_readings(conn: AsyncConnection) -> list[Reading]:
    """A cron job whose result was not delivered (its reply is a dead letter): one incident
    per job, over when no reply of the job is failed any more (retried and delivered, or
    discarded)."""
    failed = (
        await conn.execute(
            select(inbox.c.payload, outbox.c.channel, outbox.c.chat_id, outbox.c.last_error)
            .select_from(outbox.join(inbox, inbox.c.event_id == outbox.c.event_id))
            .where(outbox.c.status == "failed", inbox.c.channel == "cron")
            .order_by(outbox.c.id.desc())
            .limit(CRON_ROWS)
        )
    ).all()
    jobs: dict[str, list[tuple[str, str, str]]] = {}
    for payload, channel, chat_id, error in failed:
        jobs.setdefault(str(payload.get("chat_id")), []).append((channel, chat_id, error or ""))
    out = [
        Reading(
            f"cron:{job}",
            "cron",
            True,
            f"cron job {job}: {len(rows)} result(s) not delivered to {rows[0][0]}:{rows[0][1]}: {rows[0][2]} "
            "(`chatgate dead-letters list --kind outbox`)",
        )
        for job, rows in jobs.items()
    ]
    still_open = (
        await conn.execute(
            select(alert_incidents.c.name).where(
                alert_incidents.c.name.like("cron:%"), alert_incidents.c.state == "open"
            )
        )
    ).scalars()
    out.extend(Reading(name, "cron", False) for name in still_open if name[5:] not in jobs)
    return out


def conflict_readings(settings: AlertSettings, conflicts: Mapping[str, ConnectionConflicts]) -> list[Reading]:
    """A channel whose platform keeps refusing this replica's connection as a conflict (a
    409 loop). Only a replica that runs the connection reads it: the others cannot know."""
    return [
        Reading(
            f"conflict:{channel}",
            "conflict",
            seen.streak >= settings.conflict_streak,
            f"{channel}: refused {seen.streak} times in a row: {seen.detail}",
        )
        for channel, seen in conflicts.items()
    ]


def memory_reading(settings: AlertSettings, owner: str) -> Reading | None:
    if not settings.memory_mib:
        return None
    rss = rss_mib()
    return Reading(
        f"memory:{owner}",
        "memory",
        rss > settings.memory_mib,
        f"replica {owner}: {rss:.0f} MiB resident, ceiling {settings.memory_mib} MiB",
    )


def rss_mib() -> float:
    status = Path(f"/proc/{os.getpid()}/status")
    for line in status.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _aware(value: datetime) -> datetime:
    from datetime import UTC

    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

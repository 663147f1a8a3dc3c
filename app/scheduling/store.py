"""The job store: cron jobs in the database, shared by the cron channel, the admin API,
the CLI and the agent's reminder tools.

A job fires either on a cron schedule (in an IANA time zone) or once at `run_at`.
`next_fire_at` is the only thing the scheduler looks at; it is set when a job is
created, changed or enabled, and advanced by `claim`, an optimistic compare-and-set on
the due time, so that of several replicas that saw the same due job exactly one moves
it on. The next fire is computed from *now*, so a job that missed fires while the
service was down fires once, not once per missed slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import cron_jobs, utcnow
from app.scheduling.schedule import InvalidSchedule, check_cron, next_cron_fire, parse_at, zone

MAX_PROMPT_CHARS = 8000
UPDATABLE = frozenset(
    {
        "name",
        "prompt",
        "schedule",
        "run_at",
        "timezone",
        "target",
        "source_session_key",
        "max_runs",
        "enabled",
    }
)


@dataclass(frozen=True)
class Target:
    """Where the reply to a fire is delivered: a channel's chat (and thread)."""

    channel: str
    chat_id: str
    thread_id: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"channel": self.channel, "chat_id": self.chat_id, "thread_id": self.thread_id}


@dataclass(frozen=True)
class CronJob:
    id: int
    name: str
    schedule: str | None
    run_at: datetime | None
    timezone: str
    prompt: str
    source_session_key: str
    target: Target
    enabled: bool
    next_fire_at: datetime | None
    last_fired_at: datetime | None
    runs: int
    max_runs: int | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime | None
    created_by: str | None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def one_shot(self) -> bool:
        return self.schedule is None

    def to_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        return {
            "id": self.id,
            "name": self.name,
            "schedule": self.schedule,
            "run_at": iso(self.run_at),
            "timezone": self.timezone,
            "prompt": self.prompt,
            "source_session_key": self.source_session_key,
            "target": self.target.to_dict(),
            "enabled": self.enabled,
            "next_fire_at": iso(self.next_fire_at),
            "last_fired_at": iso(self.last_fired_at),
            "runs": self.runs,
            "max_runs": self.max_runs,
            "last_error": self.last_error,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "created_by": self.created_by,
            "metadata": self.metadata,
        }


def _job(row: Any) -> CronJob:
    return CronJob(
        id=row["id"],
        name=row["name"],
        schedule=row["schedule"],
        run_at=row["run_at"],
        timezone=row["timezone"],
        prompt=row["prompt"],
        source_session_key=row["source_session_key"],
        target=Target(row["target_channel"], row["target_chat_id"], row["target_thread_id"]),
        enabled=bool(row["enabled"]),
        next_fire_at=row["next_fire_at"],
        last_fired_at=row["last_fired_at"],
        runs=row["runs"] or 0,
        max_runs=row["max_runs"],
        last_error=row["last_error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        created_by=row["created_by"],
        metadata=dict(row["metadata"] or {}),
    )


def _first_fire(schedule: str | None, run_at: datetime | None, timezone: str, now: datetime) -> datetime:
    if schedule is not None:
        return next_cron_fire(schedule, timezone, now)
    assert run_at is not None
    if run_at <= now:
        raise InvalidSchedule(f"run_at {run_at.isoformat()} is in the past (now is {now.isoformat()})")
    return run_at


def _check_fields(values: Mapping[str, Any]) -> None:
    prompt = values["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidSchedule("prompt must be a non-empty text")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidSchedule(f"prompt is longer than {MAX_PROMPT_CHARS} characters")
    if not values["source_session_key"]:
        raise InvalidSchedule("source_session_key must not be empty")
    target: Target = values["target"]
    if not target.channel or not target.chat_id:
        raise InvalidSchedule("the delivery target needs a channel and a chat_id")
    if target.channel == "cron":
        raise InvalidSchedule("a job cannot deliver to the cron channel itself")
    max_runs = values.get("max_runs")
    if max_runs is not None and max_runs < 1:
        raise InvalidSchedule("max_runs must be at least 1")


class JobStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # --- management (API, CLI, agent tools) ---------------------------------------------

    async def create(
        self,
        *,
        prompt: str,
        source_session_key: str,
        target: Target,
        schedule: str | None = None,
        run_at: datetime | str | None = None,
        timezone: str = "UTC",
        name: str | None = None,
        max_runs: int | None = None,
        enabled: bool = True,
        created_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> CronJob:
        """Validate and store a job; raises `InvalidSchedule` with a readable reason."""
        now = now or utcnow()
        zone(timezone)
        if (schedule is None) == (run_at is None):
            raise InvalidSchedule("give either a cron schedule or a one-shot run_at time, not both")
        if schedule is not None:
            schedule = check_cron(schedule)
        at = parse_at(run_at, timezone) if run_at is not None else None
        values: dict[str, Any] = {
            "prompt": prompt,
            "source_session_key": source_session_key,
            "target": target,
            "max_runs": max_runs,
        }
        _check_fields(values)
        next_fire = _first_fire(schedule, at, timezone, now) if enabled else None
        async with self.engine.begin() as conn:
            job_id = (
                await conn.execute(
                    cron_jobs.insert()
                    .values(
                        name=(name or prompt.strip().splitlines()[0])[:200],
                        schedule=schedule,
                        run_at=at,
                        timezone=timezone,
                        prompt=prompt,
                        source_session_key=source_session_key,
                        target_channel=target.channel,
                        target_chat_id=target.chat_id,
                        target_thread_id=target.thread_id,
                        enabled=enabled,
                        next_fire_at=next_fire,
                        runs=0,
                        max_runs=max_runs,
                        created_at=now,
                        updated_at=now,
                        created_by=created_by,
                        metadata=dict(metadata or {}),
                    )
                    .returning(cron_jobs.c.id)
                )
            ).scalar_one()
        job = await self.get(job_id)
        assert job is not None
        return job

    async def get(self, job_id: int, *, source_session_key: str | None = None) -> CronJob | None:
        """One job; with `source_session_key`, only if it belongs to that session."""
        query = select(cron_jobs).where(cron_jobs.c.id == job_id)
        if source_session_key is not None:
            query = query.where(cron_jobs.c.source_session_key == source_session_key)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return _job(row) if row is not None else None

    async def list_jobs(
        self,
        *,
        source_session_key: str | None = None,
        enabled: bool | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[CronJob]:
        query = select(cron_jobs).order_by(cron_jobs.c.id).limit(limit).offset(offset)
        if source_session_key is not None:
            query = query.where(cron_jobs.c.source_session_key == source_session_key)
        if enabled is not None:
            query = query.where(cron_jobs.c.enabled == enabled)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_job(r) for r in rows]

    async def count(self, *, source_session_key: str, enabled: bool | None = None) -> int:
        query = (
            select(func.count())
            .select_from(cron_jobs)
            .where(cron_jobs.c.source_session_key == source_session_key)
        )
        if enabled is not None:
            query = query.where(cron_jobs.c.enabled == enabled)
        async with self.engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def update(
        self, job_id: int, changes: Mapping[str, Any], *, now: datetime | None = None
    ) -> CronJob | None:
        """Change some fields (see `UPDATABLE`); `None` if there is no such job.

        Changing the schedule, the time zone or `run_at`, or enabling the job, computes
        `next_fire_at` afresh from now; disabling clears it.
        """
        unknown = set(changes) - UPDATABLE
        if unknown:
            raise InvalidSchedule(f"cannot change {', '.join(sorted(unknown))}")
        now = now or utcnow()
        current = await self.get(job_id)
        if current is None:
            return None
        merged: dict[str, Any] = {
            "name": current.name,
            "prompt": current.prompt,
            "schedule": current.schedule,
            "run_at": current.run_at,
            "timezone": current.timezone,
            "target": current.target,
            "source_session_key": current.source_session_key,
            "max_runs": current.max_runs,
            "enabled": current.enabled,
        }
        if changes.get("schedule") is not None and changes.get("run_at") is not None:
            raise InvalidSchedule("give either a cron schedule or a one-shot run_at time, not both")
        if changes.get("schedule") is not None:
            merged["run_at"] = None
        if changes.get("run_at") is not None:
            merged["schedule"] = None
        # None means "unchanged", except for max_runs, where it means "no limit".
        merged.update({k: v for k, v in changes.items() if v is not None or k == "max_runs"})
        zone(merged["timezone"])
        if merged["schedule"] is not None:
            merged["schedule"] = check_cron(merged["schedule"])
        elif merged["run_at"] is not None:
            merged["run_at"] = parse_at(merged["run_at"], merged["timezone"])
        else:
            raise InvalidSchedule("give either a cron schedule or a one-shot run_at time")
        _check_fields(merged)

        values: dict[str, Any] = {
            "name": str(merged["name"])[:200],
            "prompt": merged["prompt"],
            "schedule": merged["schedule"],
            "run_at": merged["run_at"],
            "timezone": merged["timezone"],
            "source_session_key": merged["source_session_key"],
            "target_channel": merged["target"].channel,
            "target_chat_id": merged["target"].chat_id,
            "target_thread_id": merged["target"].thread_id,
            "max_runs": merged["max_runs"],
            "updated_at": now,
        }
        if changes.get("enabled") is not None:
            # Written only when asked: a fire claimed meanwhile may have disabled the job.
            values["enabled"] = merged["enabled"]
        timing_changed = (
            merged["schedule"] != current.schedule
            or merged["run_at"] != current.run_at
            or merged["timezone"] != current.timezone
        )
        if not merged["enabled"]:
            values["next_fire_at"] = None
        elif timing_changed or not current.enabled or current.next_fire_at is None:
            if (
                merged["schedule"] is not None
                and merged["max_runs"] is not None
                and current.runs >= merged["max_runs"]
            ):
                raise InvalidSchedule(
                    f"the job has run {current.runs} of max_runs={merged['max_runs']} times; "
                    "raise max_runs to enable it again"
                )
            values["next_fire_at"] = _first_fire(
                merged["schedule"], merged["run_at"], merged["timezone"], now
            )
        async with self.engine.begin() as conn:
            await conn.execute(update(cron_jobs).where(cron_jobs.c.id == job_id).values(**values))
        return await self.get(job_id)

    async def set_enabled(self, job_id: int, enabled: bool, *, now: datetime | None = None) -> CronJob | None:
        return await self.update(job_id, {"enabled": enabled}, now=now)

    async def delete(self, job_id: int, *, source_session_key: str | None = None) -> bool:
        """Remove a job; with `source_session_key`, only if it belongs to that session."""
        stmt = delete(cron_jobs).where(cron_jobs.c.id == job_id)
        if source_session_key is not None:
            stmt = stmt.where(cron_jobs.c.source_session_key == source_session_key)
        async with self.engine.begin() as conn:
            result = await conn.execute(stmt)
        return bool(result.rowcount)

    # --- firing (the cron channel) ------------------------------------------------------

    async def due(self, now: datetime, *, limit: int = 100) -> list[CronJob]:
        """Enabled jobs whose next fire is at or before `now`, oldest first."""
        query = (
            select(cron_jobs)
            .where(
                cron_jobs.c.enabled.is_(True),
                cron_jobs.c.next_fire_at.is_not(None),
                cron_jobs.c.next_fire_at <= now,
            )
            .order_by(cron_jobs.c.next_fire_at, cron_jobs.c.id)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_job(r) for r in rows]

    async def claim(self, job: CronJob, now: datetime) -> bool:
        """Move `job` past its due time; True only for the one caller whose update hit the row.

        `UPDATE … WHERE id = :id AND enabled AND next_fire_at = :due` is a compare-and-set:
        another replica (or an admin edit) that changed the row first makes it match
        nothing. One-shot jobs, and jobs that reached `max_runs`, disable themselves.
        """
        due = job.next_fire_at
        if due is None:
            return False
        values: dict[str, Any] = {
            "last_fired_at": now,
            "runs": cron_jobs.c.runs + 1,
            "updated_at": now,
        }
        finished = job.one_shot or (job.max_runs is not None and job.runs + 1 >= job.max_runs)
        if finished:
            values.update(next_fire_at=None, enabled=False)
        else:
            assert job.schedule is not None
            try:
                # From now, not from `due`: fires missed during downtime collapse into one.
                values["next_fire_at"] = next_cron_fire(job.schedule, job.timezone, max(now, due))
            except InvalidSchedule as exc:
                values.update(next_fire_at=None, enabled=False, last_error=str(exc))
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(cron_jobs)
                .where(
                    cron_jobs.c.id == job.id,
                    cron_jobs.c.enabled.is_(True),
                    cron_jobs.c.next_fire_at == due,
                )
                .values(**values)
            )
        return result.rowcount == 1

    async def record_error(self, job_id: int, error: str, *, now: datetime | None = None) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(cron_jobs)
                .where(cron_jobs.c.id == job_id)
                .values(last_error=error[:2000], updated_at=now or utcnow())
            )


@runtime_checkable
class UsesJobStore(Protocol):
    """A channel that needs the job store (the cron channel); the runtime hands it over."""

    def use_job_store(self, jobs: JobStore) -> None: ...

"""Reminder tools: the agent schedules, lists and cancels jobs of *this* conversation.

A reminder is a cron job (`app.scheduling`) bound to the session that asked for it: its
`source_session_key` is the turn's session key and its delivery target is the turn's
chat, so when it fires the message comes back into this conversation and the answer
goes to this chat. Listing and cancelling only ever see the current session's jobs; for
another session's job the answer is the same as for a job that does not exist.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from app.agent.provider import ToolSpec
from app.agent.tools import Risk, Tool, ToolContext, ToolError
from app.db.models import utcnow
from app.scheduling import CronJob, InvalidSchedule, JobStore, Target, check_cron

MAX_DELAY_SECONDS = 366 * 24 * 3600


def _summary(job: CronJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "message": job.prompt,
        "cron": job.schedule,
        "at": job.run_at.isoformat() if job.run_at else None,
        "timezone": job.timezone,
        "next_fire_at": job.next_fire_at.isoformat() if job.next_fire_at else None,
        "active": job.enabled,
    }


async def _current_target(jobs: JobStore, ctx: ToolContext) -> Target:
    """Where this conversation's replies go; inside a fired reminder, that reminder's chat."""
    if ctx.channel != "cron":
        return Target(ctx.channel, ctx.chat_id, ctx.thread_id)
    job = (
        await jobs.get(int(ctx.chat_id), source_session_key=ctx.session_key)
        if ctx.chat_id.isdigit()
        else None
    )
    if job is None:
        raise ToolError("cannot tell which chat this conversation answers to")
    return job.target


class ScheduleReminderTool:
    spec = ToolSpec(
        name="schedule_reminder",
        description=(
            "Schedule a message for this conversation: once (`at` or `in_seconds`) or repeatedly "
            "(`cron`). When it fires, `message` comes back to you as a new message in this "
            "conversation and your answer is sent to this chat."
        ),
        parameters={
            "type": "object",
            "properties": {
                "message": {
                    "type": "string",
                    "description": "What to do when it fires, e.g. 'Remind the user to send the report.'",
                },
                "at": {
                    "type": "string",
                    "description": "One-shot ISO-8601 time, e.g. 2026-12-24T18:00; without an offset "
                    "it is read in `timezone`.",
                },
                "in_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "One-shot: fire this many seconds from now.",
                },
                "cron": {
                    "type": "string",
                    "description": "Repeat on a 5-field cron schedule (minute hour day-of-month month "
                    "day-of-week), e.g. '0 9 * * 1-5' for 9:00 on weekdays.",
                },
                "timezone": {
                    "type": "string",
                    "description": "IANA time zone of `at` and `cron`, e.g. Asia/Shanghai.",
                },
                "name": {"type": "string", "description": "A short title."},
            },
            "required": ["message"],
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(
        self,
        jobs: JobStore,
        *,
        default_timezone: str = "UTC",
        max_active: int = 20,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.jobs = jobs
        self.default_timezone = default_timezone
        self.max_active = max_active
        self.clock = clock

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        message = arguments.get("message")
        if not isinstance(message, str) or not message.strip():
            raise ToolError("`message` is required")
        timezone = arguments.get("timezone") or self.default_timezone
        if not isinstance(timezone, str):
            raise ToolError("`timezone` must be a text like Europe/Berlin")
        given = [k for k in ("at", "in_seconds", "cron") if arguments.get(k) not in (None, "")]
        if len(given) != 1:
            raise ToolError("give exactly one of `at`, `in_seconds` or `cron`")
        now = self.clock()
        schedule: str | None = None
        run_at: datetime | str | None = None
        if given == ["cron"]:
            schedule = str(arguments["cron"])
            # Five fields only: a chat cannot ask for a job every second.
            try:
                check_cron(schedule, minute_resolution=True)
            except InvalidSchedule as exc:
                raise ToolError(str(exc)) from exc
        elif given == ["in_seconds"]:
            delay = arguments["in_seconds"]
            if not isinstance(delay, int) or isinstance(delay, bool) or not 1 <= delay <= MAX_DELAY_SECONDS:
                raise ToolError(f"`in_seconds` must be a whole number from 1 to {MAX_DELAY_SECONDS}")
            run_at = now + timedelta(seconds=delay)
        else:
            run_at = str(arguments["at"])
        if await self.jobs.count(source_session_key=ctx.session_key, enabled=True) >= self.max_active:
            raise ToolError(
                f"this conversation already has {self.max_active} active reminders; cancel one first"
            )
        target = await _current_target(self.jobs, ctx)
        name = arguments.get("name")
        try:
            job = await self.jobs.create(
                prompt=message,
                source_session_key=ctx.session_key,
                target=target,
                schedule=schedule,
                run_at=run_at,
                timezone=timezone,
                name=str(name) if name else None,
                created_by=f"{ctx.channel}:{ctx.sender_id}",
                # Its fires run with the role of whoever asked, never more (app.access.roles).
                metadata={
                    "created_in_session_id": ctx.session_id,
                    "role": (await ctx.trust.least_role()).label,
                },
                now=now,
            )
        except InvalidSchedule as exc:
            raise ToolError(str(exc)) from exc
        return json.dumps({"scheduled": _summary(job)}, ensure_ascii=False)


class ListRemindersTool:
    spec = ToolSpec(
        name="list_reminders",
        description="The active reminders of this conversation, with their ids and next fire times.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )
    risk = Risk.SAFE

    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        found = await self.jobs.list_jobs(source_session_key=ctx.session_key, enabled=True, limit=100)
        return json.dumps({"reminders": [_summary(j) for j in found]}, ensure_ascii=False)


class CancelReminderTool:
    spec = ToolSpec(
        name="cancel_reminder",
        description="Cancel one of this conversation's reminders by its id (see list_reminders).",
        parameters={
            "type": "object",
            "properties": {"id": {"type": "integer", "description": "The reminder's id."}},
            "required": ["id"],
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(self, jobs: JobStore) -> None:
        self.jobs = jobs

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        job_id = arguments.get("id")
        if isinstance(job_id, str) and job_id.strip().isdigit():
            job_id = int(job_id)
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise ToolError("`id` must be a reminder id from list_reminders")
        if not await self.jobs.delete(job_id, source_session_key=ctx.session_key):
            raise ToolError(f"this conversation has no reminder with id {job_id}")
        return json.dumps({"cancelled": job_id})


def reminder_tools(
    jobs: JobStore,
    *,
    default_timezone: str = "UTC",
    max_active: int = 20,
    clock: Callable[[], datetime] = utcnow,
) -> list[Tool]:
    return [
        ScheduleReminderTool(jobs, default_timezone=default_timezone, max_active=max_active, clock=clock),
        ListRemindersTool(jobs),
        CancelReminderTool(jobs),
    ]

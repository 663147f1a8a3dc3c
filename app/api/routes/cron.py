"""Admin REST API for cron jobs (`/admin/api/cron-jobs`, bearer ADMIN_TOKEN).

A job fires a prompt into a session on a cron schedule (in an IANA time zone) or once at
`run_at`; the answer is delivered to the job's target chat. Bad schedules, unknown time
zones and targets this server does not serve are refused with 422 and a reason.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from app.api.bodies import RequestBody
from app.api.deps import INT32_MAX, INT64_MAX, RowId, get_runtime, require_admin
from app.events import SessionScope, build_session_key
from app.runtime import Runtime
from app.scheduling import CronJob, InvalidSchedule, Target, check_cron, zone
from app.scheduling.store import MAX_PROMPT_CHARS

router = APIRouter(prefix="/admin/api/cron-jobs", tags=["cron"], dependencies=[Depends(require_admin)])


class TargetBody(RequestBody):
    model_config = ConfigDict(extra="forbid")

    channel: str = Field(
        min_length=1, max_length=64, description="A channel this server runs, e.g. telegram."
    )
    chat_id: str = Field(min_length=1, max_length=256)
    thread_id: str | None = Field(None, max_length=256)

    def to_target(self) -> Target:
        return Target(self.channel, self.chat_id, self.thread_id)


def _valid_schedule(value: str | None) -> str | None:
    return check_cron(value) if value is not None else None


def _valid_zone(value: str | None) -> str | None:
    if value is not None:
        zone(value)
    return value


class JobCreate(RequestBody):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="Text the session receives.")
    target: TargetBody = Field(description="Chat the answer is delivered to.")
    schedule: str | None = Field(None, description="Cron expression, e.g. `0 9 * * 1-5`.")
    run_at: datetime | None = Field(None, description="One-shot ISO-8601 time (no offset: `timezone`).")
    timezone: str = Field("UTC", description="IANA time zone of `schedule` and `run_at`.")
    source_session_key: str | None = Field(
        None, max_length=512, description="Session the prompt lands on; default: the target chat's."
    )
    name: str | None = Field(None, max_length=200)
    max_runs: int | None = Field(
        None, ge=1, le=INT32_MAX, description="Disable the job after this many fires."
    )
    enabled: StrictBool = True  # `1` or `"yes"` is refused, not read as true

    _schedule = field_validator("schedule")(_valid_schedule)
    _timezone = field_validator("timezone")(_valid_zone)

    @model_validator(mode="after")
    def _one_kind(self) -> JobCreate:
        if (self.schedule is None) == (self.run_at is None):
            raise ValueError("give either `schedule` (cron) or `run_at` (one-shot), not both")
        return self


class JobUpdate(RequestBody):
    """Fields to change; absent fields stay as they are."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    target: TargetBody | None = None
    schedule: str | None = None
    run_at: datetime | None = None
    timezone: str | None = None
    source_session_key: str | None = Field(None, min_length=1, max_length=512)
    name: str | None = Field(None, max_length=200)
    max_runs: int | None = Field(None, ge=1, le=INT32_MAX)
    enabled: StrictBool | None = None

    _schedule = field_validator("schedule")(_valid_schedule)
    _timezone = field_validator("timezone")(_valid_zone)


def _check_cron_served(runtime: Runtime) -> None:
    """A job that nothing here would ever run is refused, not stored with a 201."""
    if "cron" not in runtime.channel_settings:
        raise HTTPException(
            409, "the cron channel is not served here (add `cron` to CHANNELS): the job would never run"
        )


def _check_target(runtime: Runtime, target: TargetBody) -> None:
    if target.channel == "cron" or target.channel not in runtime.channel_settings:
        served = ", ".join(sorted(n for n in runtime.channel_settings if n != "cron")) or "none"
        raise HTTPException(422, f"target channel {target.channel!r} is not served here (served: {served})")


def _default_session_key(runtime: Runtime, target: TargetBody) -> str:
    scope = runtime.channel_settings[target.channel].session_scope
    if scope is SessionScope.USER_IN_CHAT:
        raise HTTPException(
            422, f"channel {target.channel!r} keys sessions per user: give source_session_key"
        )
    return build_session_key(target.channel, target.chat_id, scope, thread_id=target.thread_id)


async def _found(runtime: Runtime, job_id: int) -> CronJob:
    job = await runtime.jobs.get(job_id)
    if job is None:
        raise HTTPException(404, f"no cron job with id {job_id}")
    return job


@router.get("")
async def list_cron_jobs(
    session_key: str | None = Query(None, description="Only jobs of this source session"),
    enabled: bool | None = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=INT64_MAX),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Cron jobs in id order, optionally of one source session or by enabled state."""
    found = await runtime.jobs.list_jobs(
        source_session_key=session_key, enabled=enabled, limit=limit, offset=offset
    )
    return {"jobs": [j.to_dict() for j in found]}


@router.post("", status_code=201)
async def create_cron_job(body: JobCreate, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Create a job; its first fire time is computed from now in its time zone."""
    _check_cron_served(runtime)
    _check_target(runtime, body.target)
    try:
        job = await runtime.jobs.create(
            prompt=body.prompt,
            source_session_key=body.source_session_key or _default_session_key(runtime, body.target),
            target=body.target.to_target(),
            schedule=body.schedule,
            run_at=body.run_at,
            timezone=body.timezone,
            name=body.name,
            max_runs=body.max_runs,
            enabled=body.enabled,
            created_by="admin",
        )
    except InvalidSchedule as exc:
        raise HTTPException(422, str(exc)) from exc
    return job.to_dict()


@router.get("/{job_id}")
async def get_cron_job(job_id: RowId, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """One job with its next and last fire times, run count and last error."""
    return (await _found(runtime, job_id)).to_dict()


@router.patch("/{job_id}")
async def update_cron_job(
    job_id: RowId, body: JobUpdate, runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Change a job; a new schedule, time zone or run_at recomputes the next fire from now."""
    await _found(runtime, job_id)
    changes: dict[str, Any] = body.model_dump(exclude_unset=True)
    if body.target is not None:
        _check_target(runtime, body.target)
        changes["target"] = body.target.to_target()
    try:
        job = await runtime.jobs.update(job_id, changes)
    except InvalidSchedule as exc:
        raise HTTPException(422, str(exc)) from exc
    if job is None:
        raise HTTPException(404, f"no cron job with id {job_id}")
    return job.to_dict()


async def _set_enabled(runtime: Runtime, job_id: int, enabled: bool) -> dict[str, Any]:
    await _found(runtime, job_id)
    if enabled:
        _check_cron_served(runtime)
    try:
        job = await runtime.jobs.set_enabled(job_id, enabled)
    except InvalidSchedule as exc:
        raise HTTPException(422, str(exc)) from exc
    if job is None:
        raise HTTPException(404, f"no cron job with id {job_id}")
    return job.to_dict()


@router.post("/{job_id}/enable")
async def enable_cron_job(job_id: RowId, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Enable a job; its next fire is computed from now (a one-shot needs a future run_at)."""
    return await _set_enabled(runtime, job_id, True)


@router.post("/{job_id}/disable")
async def disable_cron_job(job_id: RowId, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Disable a job; it keeps its settings and fires no more until enabled."""
    return await _set_enabled(runtime, job_id, False)


@router.delete("/{job_id}", status_code=204)
async def delete_cron_job(job_id: RowId, runtime: Runtime = Depends(get_runtime)) -> Response:
    """Delete a job. Fires already accepted are still answered."""
    if not await runtime.jobs.delete(job_id):
        raise HTTPException(404, f"no cron job with id {job_id}")
    return Response(status_code=204)
